"""Families of hosts (issue 89): each host drawn from its family by its seed, deterministically, every
member with the same slots and catalogue; a batch of the env is one member."""

from __future__ import annotations

import pytest
import torch

from esper.core.lifecycle import LifecycleConfig
from esper.shell.baselines.simple import GrowAllController
from esper.shell.common.seeding import member_train_host_seeds, train_host_seeds
from esper.shell.env.config import FAMILY_TASKS, EnvConfig
from esper.shell.env.governor import GovernorConfig
from esper.shell.env.rollout import EpisodeRunner
from esper.shell.env.tasks import WHERE_KINDS, WHERE_NARROW, make_task, when_member, where_member
from esper.shell.env.vecenv import VecEnv
from esper.shell.host.bank import build_host

SMALL = {"splits": (300, 60, 60), "batch_size": 32}
SEEDS = range(24)


def _built(task, seed):
    torch.manual_seed(seed)  # as the banks do: the host's weights from the global generator
    return build_host(task, seed)


@pytest.mark.parametrize("name", FAMILY_TASKS)
def test_a_family_draws_its_hosts_by_seed_and_rebuilds_them_alike(name):
    task = make_task(name, **SMALL)
    assert task.varies and not make_task("mnist1d", **SMALL).varies
    members = [task.describe_member(s) for s in SEEDS]
    assert len({repr(m) for m in members}) > 1  # the hosts differ
    assert members == [task.describe_member(s) for s in SEEDS]  # and the same seed draws the same
    a, b = _built(task, 7), _built(task, 7)
    assert repr(a) == repr(b)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    # what the family draws does not depend on the global generator
    torch.manual_seed(123)
    first = task.describe_member(5)
    torch.rand(10)
    assert task.describe_member(5) == first


@pytest.mark.parametrize("name", FAMILY_TASKS)
def test_every_member_has_the_same_slots_and_catalogue(name):
    task = make_task(name, **SMALL)
    probe = task.make_host()
    for s in SEEDS:
        host = task.host_for(s)
        assert host.slot_names == probe.slot_names and host.blueprint_names == probe.blueprint_names
        x = torch.randn(4, *task.input_shape)
        assert host(x).shape == (4, task.n_classes)


def test_where_moves_the_bottleneck_and_the_slot_widths_follow():
    task = make_task("mnist1d_where", **SMALL)
    members = [where_member(seed) for seed in SEEDS]
    assert {m["pools"] for m in members} == {pools for _, pools in WHERE_KINDS.values()}  # both kinds
    assert len({m["channels"] for m in members}) > 2  # narrow or not, and more than one wide width
    for seed, m in zip(SEEDS, members):
        host = task.host_for(seed)
        assert tuple(s.width for s in host.slots) == m["channels"]
        narrow = [w == WHERE_NARROW for w in m["channels"]]
        assert (narrow, m["pools"]) in [(list(n), p) for n, p in WHERE_KINDS.values()]
        pools = [b[-1].kernel_size if isinstance(b[-1], torch.nn.MaxPool1d) else 1 for b in host.blocks]
        assert tuple(pools) == m["pools"]


def test_when_draws_each_hosts_data_by_seed():
    task = make_task("mnist1d_when", splits=(4000, 200, 200), batch_size=64)
    first = lambda seed: next(iter(task.make_loaders(seed).train))
    (x1, y1), (x2, y2) = first(3), first(3)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    members = [when_member(s) for s in SEEDS]
    assert len({(m["n_train"], m["noise"]) for m in members}) > 3
    # every host trains the same steps an epoch, whatever its training set's size
    assert len({len(task.make_loaders(s).train) for s in SEEDS[:6]}) == 1
    # the noisy share of a host's training labels is about its draw's (against the clean labels)
    seed = next(s for s in SEEDS if when_member(s)["noise"] >= 0.2 and when_member(s)["n_train"] >= 1000)
    clean = make_task("mnist1d", splits=(4000, 200, 200))
    held = task.make_loaders(seed)
    val_noisy = next(iter(held.val))[1]
    val_clean = next(iter(clean.make_loaders(0).val))[1]
    share = float((val_noisy != val_clean).float().mean())
    assert abs(share - when_member(seed)["noise"]) < 0.1
    # the test split is clean
    assert torch.equal(next(iter(held.test))[1], next(iter(clean.make_loaders(0).test))[1])


def test_a_family_refuses_the_widths_a_config_would_set():
    with pytest.raises(ValueError, match="family"):
        EnvConfig(task="mnist1d_where", channels=(8, 8, 8))
    with pytest.raises(TypeError, match="draws each host"):
        make_task("mnist1d_where", channels=(8, 8, 8))


def _env(task, n_envs):
    cfg = EnvConfig(task="mnist1d_where", n_envs=n_envs, batch_size=32, train_batches=1)
    return VecEnv(cfg, LifecycleConfig(max_epochs=2), GovernorConfig(), seed=0, task=task)


def test_a_batch_is_one_member_and_the_env_describes_it():
    task = make_task("mnist1d_where", **SMALL)
    seeds = [s for s in SEEDS if where_member(s)["channels"] != where_member(0)["channels"]]
    env = _env(task, 2)
    try:
        with pytest.raises(ValueError, match="one batch must be one host"):
            env.reset(0, host_seeds=[0, seeds[0]])
        for seed in (0, seeds[0]):
            env.reset(0, host_seeds=[seed, seed])
            widths = tuple(s.width for s in task.host_for(seed).slots)
            assert env.layout.slot_widths == widths
            assert [env.hosts.host(i).slots[0].width for i in range(2)] == [widths[0]] * 2
            assert env.grow_all_params == sum(
                6 * w * w + 2 * w for w in widths
            )  # conv_heavy in every slot: 6C^2 + 2C each
    finally:
        env.close()


def test_an_empty_plan_in_a_list_grows_nothing():
    task = make_task("mnist1d_where", **SMALL)
    env = _env(task, 2)
    try:
        names = list(env.blueprint_names)
        ctl = GrowAllController([{}, {0: names.index("norm")}], env.lifecycle)
        result = EpisodeRunner(env, ctl).run(0, host_seeds=[3, 3])
    finally:
        env.close()
    static, grows = result.episodes
    assert static["grown"] == "" and static["germinated_at"] == [] and static["params_added"] == 0
    assert grows["germinated_at"]  # the other env of the batch germinated its plan


def test_a_training_batch_of_a_family_is_one_member_drawn_per_episode():
    """Issue 89: without host seeds, a family's batch is the i-th candidate seeds of the first
    candidate's member (member_train_host_seeds): one member a batch, other members in other episodes,
    each env its own seed, and a process of a run holding envs 2..3 draws what the whole run's 2..3 are."""
    task = make_task("mnist1d_where", **SMALL)
    member = lambda s: repr(where_member(s))
    seeds = {e: member_train_host_seeds(7, e, range(4), where_member) for e in range(8)}
    assert all(len({member(s) for s in batch}) == 1 and len(set(batch)) == 4 for batch in seeds.values())
    assert len({member(batch[0]) for batch in seeds.values()}) > 1  # members vary by episode
    assert seeds[0][0] == train_host_seeds(7, 0, [0])[0]  # env 0 is the run's own first seed
    assert member_train_host_seeds(7, 3, [2, 3], where_member) == seeds[3][2:]
    grouped = member_train_host_seeds(7, 3, range(4), where_member, group=2)
    assert grouped[0] == grouped[1] == seeds[3][0] and grouped[2] == grouped[3] == seeds[3][1]
    env = _env(task, 2)
    try:
        env.reset(5)  # no host seeds: a training batch
        assert env.host_seeds == member_train_host_seeds(0, 5, range(2), where_member)
    finally:
        env.close()


def test_a_family_with_no_such_member_says_so():
    with pytest.raises(RuntimeError, match="hardly ever draws"):
        member_train_host_seeds(0, 0, range(2), lambda s: s)  # every seed its own member
