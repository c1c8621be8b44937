"""The episode store (issue 90, deliverable 3): a fixed plan's episodes run once per run and are read back
number for number. A spec'd controller is the named one, episode for episode; the store reads a batch
only where the same batch is asked for again (on the per-env step, a pair wherever it ran), under the key
of the settings, task, draw and threads it ran with; and one seed's evaluations, searches and all, give
the table of the run without the store, with fewer episodes run."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch

import esper.shell.eval.episodes as E
import esper.shell.eval.store as ST
from esper.shell.baselines.simple import GrowAllController
from esper.shell.common.seeding import eval_host_seeds
from esper.shell.config.presets import preset
from esper.shell.eval import search as S
from esper.shell.eval.controllers import episode_spec, make_controller
from esper.shell.eval.episodes import compare_on_config, run_episodes
from esper.shell.eval.runner import batches_of, run_hosts

#: Tiny episodes with room for a seed to be germinated, blended and fossilized (9 epochs of one batch).
TINY = {"lifecycle.max_epochs": 9, "env.train_batches": 1, "env.val_batches": 1, "updates": 6,
        "env.n_envs": 4, "ppo.n_minibatches": 1, "ppo.param_cap_share": 0.6}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: these hosts are far too small to gain from more, and on a busy machine a
    thread pool stalls at every small parallel region."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cfg():
    return preset("smoke", TINY)


@pytest.fixture(scope="module")
def task(cfg):
    return cfg.env.build_task()


def _plain(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("controller", "episode")} for r in records]


# ---------------------------------------------------------------------------------------------- specs
def test_a_fixed_plan_run_from_its_spec_is_the_named_controller_episode_for_episode(cfg, task):
    """Every fixed-plan controller (``static``, ``grow_all``, ``grow:`` placements and schedules with their
    blend, ``born_big`` of a plan) runs from its spec exactly as :func:`make_controller` builds it; names
    that act alike share a spec; the learned controller, ``random`` and the heuristics have none."""
    hosts = eval_host_seeds(3, range(3))
    timed = "grow:b0=norm:3+b1=conv_small@GATED_GATE@STANDARD"
    names = ["static", "grow_all", "grow:b0=conv_heavy+b2=norm", timed, "born_big", "born_big:b1=conv_heavy"]
    for name in names:
        spec = episode_spec(name, cfg, task)
        assert spec is not None, name
        new = _plain(run_episodes(cfg, task, name, range(3), eval_seed=3, checkpoint=None))
        made = lambda env, batch, name=name: make_controller(
            name, cfg, env, checkpoint=None, seed=3 + batch[0]
        )
        assert new == run_hosts(cfg, task, made, hosts), name
    if any(r["params_added"] for r in new):  # born_big grew: the episodes were not all alike
        assert len({json.dumps(r["val_acc_curve"]) for r in new}) > 1
    every = "+".join(f"{s}={task.grow_all}" for s in task.make_host().slot_names)
    assert episode_spec("grow_all", cfg, task) == episode_spec(f"grow:{every}", cfg, task)
    assert episode_spec("born_big", cfg, task) == episode_spec(f"born_big:{every}", cfg, task)
    assert episode_spec("plan_search@1x", cfg, task, {"chosen": "b1=norm+b0=conv_heavy"}) == episode_spec(
        "grow:b0=conv_heavy+b1=norm", cfg, task)  # fmt: skip
    assert episode_spec("born_big:ppo_greedy", cfg, task, {"chosen": "b1=norm"}) == episode_spec(
        "born_big:b1=norm", cfg, task)  # fmt: skip
    assert episode_spec("grow:b0=norm@GATED_GATE", cfg, task) != episode_spec("grow:b0=norm", cfg, task)
    assert episode_spec("grow:b0=norm:3", cfg, task) != episode_spec("grow:b0=norm", cfg, task)
    for name in ("ppo", "ppo_greedy", "random", "heuristic", "heuristic_tuned", "probe", "plan_search@1x"):
        assert episode_spec(name, cfg, task) is None, name  # a search without its result: none yet


def test_a_searchs_batch_from_its_specs_is_the_batch_it_ran_before(cfg, task):
    """A plan search's candidates, timed or not, each env its own, run from their specs exactly as the
    search built its controller before the store (one :class:`GrowAllController` over the batch's plans)."""
    names = tuple(task.make_host().slot_names)
    blueprints = tuple(task.make_host().blueprint_names)
    pairs = [("b0=conv_heavy+b2=norm", 11), ("b1=self_attention", 12), ("b0=norm+b1=norm+b2=norm", 13),
             ("b2=conv_small", 14)]  # fmt: skip
    plans = [{names.index(s): blueprints.index(b) for s, b in (p.split("=") for p in c.split("+"))}
             for c, _ in pairs]  # fmt: skip
    before = run_hosts(cfg, task, lambda env, batch: GrowAllController(plans, cfg.lifecycle),
                       [h for _, h in pairs])  # fmt: skip
    records, read = S.run_plans(cfg, task, pairs, names)
    assert read == 0 and records == before
    timed = [("b0=norm:3@GATED_GATE", 1), ("b1=norm", 2)]
    made = [S.schedule_of(p, names, blueprints) for p, _ in timed]
    plans, at, style = ([m[k] for m in made] for k in range(3))
    timed_ctl = lambda env, batch: GrowAllController(plans, cfg.lifecycle, at=at, style=style)
    before = run_hosts(cfg, task, timed_ctl, [1, 2])
    assert S.run_plans(cfg, task, timed, names)[0] == before


# ---------------------------------------------------------------------------------------------- store
def _fake_runs(monkeypatch) -> list[list[int]]:
    """``run_hosts`` of the store replaced by a function of (host, data draw), no host trained; returns
    the host seeds of each batch run."""
    calls: list[list[int]] = []

    def fake(cfg, task, make, host_seeds, **kw):
        calls.append(list(host_seeds))
        return [{"final_val_acc": float(h + task.data_seed), "env": i, "host_seed": h}
                for i, h in enumerate(host_seeds)]  # fmt: skip

    monkeypatch.setattr(ST, "run_hosts", fake)
    return calls


def test_the_store_reads_a_batch_only_where_the_same_batch_is_asked_for(cfg, task, tmp_path, monkeypatch):
    """On the batched step, the unit kept and read is the batch: the same pairs in the same batches are
    read, the same pairs batched otherwise run again. A line of another key (settings, data draw) is not
    read, and a last line cut short is skipped."""
    calls = _fake_runs(monkeypatch)
    path = tmp_path / ST.STORE_FILE
    pairs = [("grow:b0=norm@LINEAR_ADD@FAST@1.0", h) for h in range(6)]
    store = ST.EpisodeStore(path, cfg, task)
    assert not store.by_pair  # the smoke task is batched
    first, read = ST.run_specs(cfg, task, pairs, store=store)
    assert read == 0 and [len(c) for c in calls] == [4, 2] and store.ran == 6
    calls.clear()
    again, read = ST.run_specs(cfg, task, pairs, store=ST.EpisodeStore(path, cfg, task))
    assert read == 6 and calls == [] and again == first
    other, read = ST.run_specs(cfg, task, pairs[1:], store=ST.EpisodeStore(path, cfg, task))
    assert read == 0 and [len(c) for c in calls] == [4, 1]  # the same pairs, other batches: run
    assert other == [{**r, "env": i % 4} for i, r in enumerate(first[1:])]  # (the fake ignores its batch)
    calls.clear()
    with path.open("a") as f:
        f.write('{"key": "cut sho')
    elsewhere = dataclasses.replace(cfg, seed=cfg.seed + 1)
    assert ST.EpisodeStore(path, elsewhere, task).batches == {}  # other settings: nothing kept for them
    drawn = dataclasses.replace(cfg.env, data_seed=task.data_seed + 1).build_task()
    assert ST.EpisodeStore(path, cfg, drawn).batches == {}  # another draw: its own episodes
    assert len(ST.EpisodeStore(path, cfg, task).batches) == 4
    trimmed = ST.EpisodeStore(path, cfg, task, fields=("final_val_acc",))  # as a search keeps its own
    assert trimmed.batches == {}  # another key: whole records are not read as trimmed ones, nor back
    got, _ = ST.run_specs(cfg, task, pairs[:1], store=trimmed)
    assert got == [{"final_val_acc": first[0]["final_val_acc"]}]
    ST.run_specs(cfg, task, pairs[:2], store=ST.EpisodeStore(path, cfg, task))  # appended after the cut
    assert len(ST.EpisodeStore(path, cfg, task).batches) == 5 and len(trimmed.batches) == 1
    keys = {json.loads(line)["key"] for line in path.read_text().splitlines() if line.endswith("}")}
    assert all(k.startswith(f"v{ST.STORE_VERSION}:{ST.config_digest(cfg)}:{task.name}:") for k in keys)


def test_issue102_episodes_of_another_length_are_not_read_nor_keyed_alike(cfg, task, tmp_path, monkeypatch):
    """``lifecycle.max_epochs`` (an episode's length) is part of the store's key: two configs that differ
    in it alone have other digests and keys, and neither reads the other's batches (issue 102: a key
    without it served 9-epoch episodes to a 10-epoch run)."""
    calls = _fake_runs(monkeypatch)
    longer = preset("smoke", {**TINY, "lifecycle.max_epochs": cfg.lifecycle.max_epochs + 1})
    assert longer.lifecycle.max_epochs != cfg.lifecycle.max_epochs
    assert dataclasses.replace(longer, lifecycle=cfg.lifecycle) == cfg  # they differ in that alone
    assert longer.env.build_task().data_seed == task.data_seed
    assert ST.config_digest(longer) != ST.config_digest(cfg)
    path = tmp_path / ST.STORE_FILE
    assert ST.EpisodeStore(path, longer, task).key != ST.EpisodeStore(path, cfg, task).key
    pairs = [("grow:b0=norm@LINEAR_ADD@FAST@1.0", h) for h in range(4)]
    _, read = ST.run_specs(cfg, task, pairs, store=ST.EpisodeStore(path, cfg, task))
    assert read == 0 and calls == [[0, 1, 2, 3]]
    assert ST.EpisodeStore(path, longer, task).batches == {}  # nothing kept for the other length
    _, read = ST.run_specs(longer, task, pairs, store=ST.EpisodeStore(path, longer, task))
    assert read == 0 and calls == [[0, 1, 2, 3]] * 2  # run again at its own length
    _, read = ST.run_specs(cfg, task, pairs, store=ST.EpisodeStore(path, cfg, task))
    assert read == 4 and len(calls) == 2  # each length reads its own


def _family_hosts(task, n: int) -> list[int]:
    """``n`` host seeds of ``task`` (a family) whose members alternate: contiguous batches mix them."""
    by: dict[str, list[int]] = {}
    for s in range(400):
        by.setdefault(repr(task.describe_member(s)), []).append(s)
    a, b = [v for v in by.values() if len(v) >= n][:2]  # two members with hosts enough
    return [x for pair in zip(a, b) for x in pair][:n]


def test_on_a_family_the_store_runs_the_batches_of_the_run_without_it(tmp_path, monkeypatch):
    """On a family, ``run_hosts`` batches each member's hosts together; the store must keep and run those
    batches, not contiguous slices of the pairs (which ``run_hosts`` then split into smaller batches: the
    same pair trained beside other envs, a few points apart on a host after 25 epochs), and give each
    record back in the pairs' order."""
    cfg = preset("smoke", {**TINY, "env.task": "mnist1d_where", "env.workers": 1})
    task = cfg.env.build_task()
    assert task.varies
    hosts = _family_hosts(task, 8)
    pairs = [("grow:b0=norm@LINEAR_ADD@FAST@1.0", h) for h in hosts]
    calls = _fake_runs(monkeypatch)
    got, read = ST.run_specs(cfg, task, pairs, store=ST.EpisodeStore(tmp_path / ST.STORE_FILE, cfg, task))
    want = [[hosts[k] for k in b] for b in batches_of(task, hosts, cfg.env.n_envs)]
    assert read == 0 and calls == want and len(want) == 2  # one batch per member, not four mixed halves
    assert [r["host_seed"] for r in got] == hosts  # in the pairs' order


def test_on_a_family_a_fixed_plan_with_the_store_is_the_uncached_run(tmp_path):
    """The same, on real (tiny) episodes: a fixed plan's records on a family's alternating hosts, with the
    store and without it, number for number."""
    cfg = preset("smoke", {**TINY, "env.task": "mnist1d_where", "env.workers": 1, "lifecycle.max_epochs": 5})
    task = cfg.env.build_task()
    pairs = [("grow:b0=norm@LINEAR_ADD@FAST@1.0", h) for h in _family_hosts(task, 6)]
    uncached, _ = ST.run_specs(cfg, task, pairs)
    cached, read = ST.run_specs(cfg, task, pairs, store=ST.EpisodeStore(tmp_path / ST.STORE_FILE, cfg, task))
    assert read == 0 and json.dumps(_numbers(cached)) == json.dumps(_numbers(uncached))
    again, read = ST.run_specs(cfg, task, pairs, store=ST.EpisodeStore(tmp_path / ST.STORE_FILE, cfg, task))
    assert read == 6 and json.dumps(_numbers(again)) == json.dumps(_numbers(uncached))


def test_on_the_per_env_step_a_pair_is_read_wherever_it_ran(task, tmp_path, monkeypatch):
    """Env by env an episode depends on its own pair alone, so the store reads each pair kept, in any
    batch, runs only the pairs it lacks (each once), and gives each its place in the batch asked for."""
    cfg = preset("smoke", {**TINY, "env.host_step": "per_env"})
    calls = _fake_runs(monkeypatch)
    path = tmp_path / ST.STORE_FILE
    spec = "grow:b0=norm@LINEAR_ADD@FAST@1.0"
    store = ST.EpisodeStore(path, cfg, task)
    assert store.by_pair
    ST.run_specs(cfg, task, [(spec, h) for h in range(3)], store=store)
    calls.clear()
    got, read = ST.run_specs(cfg, task, [(spec, h) for h in (2, 1, 7, 0, 8)],
                             store=ST.EpisodeStore(path, cfg, task))  # fmt: skip
    assert calls == [[7, 8]]  # only the pairs not kept
    assert read == 3 and [r["host_seed"] for r in got] == [2, 1, 7, 0, 8]
    assert [r["env"] for r in got] == [0, 1, 2, 3, 0]  # each in its place of the batches asked for


@pytest.mark.parametrize("made", ["mnist1d per_env", "recall"])
def test_per_env_episodes_do_not_depend_on_the_envs_beside_them(made):
    """The premise of reading a pair wherever it ran, on real episodes of the per-env step (a CNN host
    asked to, and the transformer host of ``recall``, two worker threads): the same (plan, host) alone and
    beside other plans ends alike, every number and every final weight."""
    if made == "recall":
        cfg = preset("recall", {"lifecycle.max_epochs": 4, "env.train_batches": 2, "env.val_batches": 1,
                                "env.workers": 2})  # fmt: skip
    else:
        cfg = preset("smoke", {**TINY, "env.host_step": "per_env", "lifecycle.max_epochs": 5})
    task = cfg.env.build_task()
    assert not cfg.env.batched and ST.EpisodeStore(Path("none"), cfg, task).by_pair
    names, blueprints = task.make_host().slot_names, task.make_host().blueprint_names
    p = f"grow:{names[0]}={blueprints[-1]}+{names[1]}=norm@LINEAR_ADD@FAST@1.0"
    q = f"grow:{names[-1]}={blueprints[-2]}@LINEAR_ADD@FAST@1.0"

    def weights(host) -> str:
        tensors = host.state_dict().values()
        return hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in tensors)).hexdigest()

    def run(pairs):
        make = lambda env, batch: ST.spec_controller([s for s, _ in pairs], env, cfg.lifecycle)
        return run_hosts(cfg, task, make, [h for _, h in pairs], keep=weights)

    alone = run([(p, 5)])[0]
    beside = run([(q, 6), (p, 5), (q, 7)])[1]
    assert {**beside, "env": 0} == alone and alone["germinations"]


# ------------------------------------------------------------------------------------------- the table
#: One seed's evaluations as the suite makes them: the table's, a diagnosis row (a plan the table's
#: searches chose), the ``--trying`` rows; each a separate evaluation of the same run, hosts and draw.
def _one_seed(cfg, task, cache) -> dict:
    kw = dict(episodes=3, seed=9, show_progress=False, task=task, search_cache=cache)
    searches = ["plan_search@0.25x", "plan_search@0.5x", "plan_search@1x", "plan_search_cap@1x"]
    table = compare_on_config(cfg, ["static", "grow_all", *searches], **kw)["controllers"]
    chosen = table["plan_search@0.25x"]["search"]["chosen"]
    diagnosis = compare_on_config(cfg, [f"grow:{chosen}", "grow:b0=norm"], **kw)["controllers"]
    every = "+".join(f"{s}={task.grow_all}" for s in task.make_host().slot_names)
    trying = compare_on_config(cfg, ["born_big", f"born_big:{every}", "plan_search_timed@1x", "grow:b0=norm"],
                               **kw)["controllers"]  # fmt: skip
    return {"table": table, "diagnosis": diagnosis, "trying": trying}


def _numbers(x):
    """Everything but the wall time and what the store read (the only things a cache may change)."""
    if isinstance(x, dict):
        return {k: _numbers(v) for k, v in x.items() if k not in ("seconds", "episodes_reused")}
    if isinstance(x, list):
        return [_numbers(v) for v in x]
    return x


def test_one_seeds_table_with_the_store_is_the_uncached_runs_with_fewer_episodes(task, tmp_path, monkeypatch):
    """The issue's check, on real (tiny) episodes: one seed's evaluations (``static``, ``grow_all``,
    ``plan_search`` at three budgets and within the cap, a diagnosis ``grow:`` of a plan it chose,
    ``born_big`` of ``grow_all``'s plan twice over, the timed search, a placement asked for twice) give
    every number of the run without a store, and run fewer episodes: the later evaluations read the fixed
    plans an earlier one ran (since issue 105 the searches share a batch only where they ask for the same
    one: on these budgets, smaller than a batch, they do not). Run again, nothing runs and nothing
    changes."""
    cfg = preset("smoke", TINY)  # plan_search@1x: 24 episodes, @0.25x: 6
    ran: list[int] = []
    for module in (ST, E):
        real = module.run_hosts

        def counting(c, t, make, host_seeds, _real=real, **kw):
            ran.append(len(host_seeds))
            return _real(c, t, make, host_seeds, **kw)

        monkeypatch.setattr(module, "run_hosts", counting)
    uncached = _one_seed(cfg, task, None)
    n_uncached = sum(ran)
    ran.clear()
    cached = _one_seed(cfg, task, tmp_path / "search")
    n_cached = sum(ran)
    assert json.dumps(_numbers(cached), sort_keys=True) == json.dumps(_numbers(uncached), sort_keys=True)
    grew = [c["params_added_mean"] for part in uncached.values() for c in part.values()]
    assert max(grew) > 0 and min(grew) == 0  # seeds were grown: the episodes differ between controllers
    reused = sum(part[n]["search"].get("episodes_reused", 0) for part in cached.values() for n in part
                 if "search" in part[n] and "episodes_reused" in part[n]["search"])  # fmt: skip
    assert n_cached < n_uncached - reused  # the evaluations read fixed plans the searches ran
    ran.clear()
    again = _one_seed(cfg, task, tmp_path / "search")
    assert sum(ran) == 0 and json.dumps(_numbers(again), sort_keys=True) == json.dumps(
        _numbers(uncached), sort_keys=True)  # fmt: skip
    print(f"episodes run: {n_uncached} without the store, {n_cached} with it")
