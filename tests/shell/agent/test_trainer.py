"""The recurrent PPO update on synthetic rollouts: C3 (env-sequence minibatches), C4/H5 (value clip
anchored on the update-start recomputation, several epochs), C5 (statistics before the update), S2
(stored observations untouched), the KL early stop and the per-head gradient norms."""

from __future__ import annotations

import copy
import dataclasses
import math
import threading

import pytest
import torch
from tensordict import TensorDict

from esper.core import distributions as D
from esper.core.advantage import gae, group_relative
from esper.core.masks import head_relevance, legal_masks
from esper.core.normalize import running_stats, scale
from esper.core.spec import HEAD_INDEX, HEADS, SLOT_FIELDS, ActionSpec, Stage
from esper.shell.agent.agent import Agent
from esper.shell.agent.config import PPOConfig
from esper.shell.agent.policy import FactoredRecurrentActorCritic
from esper.shell.agent.steps import GRAD_GROUPS, SharedStep, descend, local_rows
from esper.shell.agent.trainer import PPOTrainer
from esper.shell.common.distributed import SINGLE, Dist

SPEC = ActionSpec(n_slots=2, n_blueprints=3)
RAW = 6


def _slots(E: int, g: torch.Generator) -> TensorDict:
    td = TensorDict({k: torch.zeros(E, 2, dtype=dt) for k, (dt, _) in SLOT_FIELDS.items()}, [E, 2])
    td["enabled"] = torch.ones(E, 2, dtype=torch.bool)
    td["stage"] = torch.randint(0, len(Stage), (E, 2), generator=g)
    td["age"] = torch.full((E, 2), 3)
    return td


def _agent(policy, cfg: PPOConfig | None = None) -> Agent:
    """A fresh agent of ``policy`` with empty observation statistics (``RAW`` features)."""
    device = next(policy.parameters()).device
    return Agent(policy, running_stats((RAW,), device=device), obs_clip=(cfg or PPOConfig()).obs_clip)


def make_rollout(policy, trainer, E=4, T=5, seed=0, state=None) -> TensorDict:
    """What EpisodeRunner + PPOController store, with random observations and slot states; ``state``:
    the recurrent state before the first step (default: the policy's initial, zero state)."""
    g = torch.Generator().manual_seed(seed)
    state = policy.initial_state(E) if state is None else state
    steps = []
    for _ in range(T):
        raw = torch.randn(E, RAW, generator=g) * 3 + 1
        legal = legal_masks(_slots(E, g), SPEC)
        x = torch.cat([trainer.agent.normalize(raw), legal["op"].float()], -1)
        h, c = state
        out, state = policy.act(x, state, legal, generator=g)
        out["observation"] = x
        out["raw_observation"] = raw
        out["recurrent_state"] = TensorDict({"h": h[0], "c": c[0]}, [E])
        steps.append(out)
    return finish_rollout(steps, g)


def finish_rollout(steps: list[TensorDict], g: torch.Generator) -> TensorDict:
    """The acting steps ``[E]`` stacked into a rollout ``[E, T]`` that starts an episode and is truncated
    at its last step, with random raw rewards and a random bootstrap value (drawn from ``g``)."""
    td = torch.stack(steps, 1)
    E, T = td.batch_size
    done = torch.zeros(E, T, dtype=torch.bool)
    done[:, -1] = True
    td["is_init"] = torch.zeros(E, T, dtype=torch.bool)
    td["is_init"][:, 0] = True
    td["next"] = TensorDict(
        {
            "raw_reward": torch.randn(E, T, generator=g),
            "done": done,
            "truncated": done.clone(),
            "terminated": torch.zeros_like(done),
            "state_value": torch.cat([td["state_value"][:, 1:], torch.randn(E, 1, generator=g)], 1),
        },
        [E, T],
    )
    return td


def _make(cfg: PPOConfig | None = None, seed: int = 0):
    torch.manual_seed(seed)
    cfg = cfg or PPOConfig(hidden=16, head_hidden=8, n_epochs=2, n_minibatches=2, target_kl=None)
    policy = FactoredRecurrentActorCritic(RAW + 6, SPEC, hidden=cfg.hidden, head_hidden=cfg.head_hidden)
    return policy, PPOTrainer(_agent(policy, cfg), cfg, generator=torch.Generator().manual_seed(seed))


def resume_state(trainer: PPOTrainer) -> dict:
    """What a checkpoint holds of ``trainer`` and its agent (``agent`` and ``learner``), copied as
    ``torch.load`` would give it (no shared tensors: ``Optimizer.load_state_dict`` keeps the very tensors)."""
    return copy.deepcopy({"agent": trainer.agent.state_dict(), "learner": trainer.state_dict()})


def resume(trainer: PPOTrainer, state: dict) -> None:
    """Restore :func:`resume_state`'s ``state`` into ``trainer`` and its agent."""
    state = copy.deepcopy(state)
    trainer.agent.load(state["agent"])
    trainer.load_state_dict(state["learner"])


def test_update_runs_and_reports_the_ppo_update_event():
    policy, trainer = _make()
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = trainer.update(make_rollout(policy, trainer))
    assert metrics["minibatch_steps"] == 4 and metrics["epochs_run"] == 2
    scalars = ("loss_objective", "loss_critic", "loss_entropy", "kl_approx", "clip_fraction",
               "explained_variance", "grad_norm", "max_ratio", "min_ratio")  # fmt: skip
    for key in scalars:
        assert isinstance(metrics[key], float), key
    assert set(metrics["head_entropy"]) == set(HEADS)
    assert set(metrics["head_grad_norm"]) == set(GRAD_GROUPS)
    assert set(metrics["head_weight"]) == set(HEADS)
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters())), "the policy moved"


def test_update_reports_the_lstm_health_of_the_rollout_states():
    """Issue 47: every update carries ``lstm_*``, the health of the stored recurrent states after each
    episode's first step (the first is the zero initial state: counted, every row would be 'dead')."""
    from esper.core.health import lstm_health

    policy, trainer = _make()
    rollout = make_rollout(policy, trainer, T=5)
    want = lstm_health(rollout["recurrent_state", "h"][:, 1:], rollout["recurrent_state", "c"][:, 1:])
    metrics = trainer.update(rollout)
    for key in want.keys():
        assert metrics[f"lstm_{key}"] == pytest.approx(float(want[key]), rel=1e-6), key
    assert metrics["lstm_too_small_frac"] == 0.0 and metrics["lstm_nonfinite"] == 0
    assert 0.0 < metrics["lstm_h_norm_mean"] <= metrics["lstm_h_norm_max"]
    # a saturated state shows: every stored h pinned at +-1
    policy, trainer = _make()
    pinned = make_rollout(policy, trainer, T=5)
    pinned["recurrent_state", "h"] = torch.sign(pinned["recurrent_state", "h"]) + 0.0
    assert trainer.update(pinned)["lstm_h_saturated_frac"] > 0.9


def test_M12_update_reports_advantage_statistics():
    """Finding M12: each update reports the advantages GAE gave, before they are normalized: their mean,
    spread, largest magnitude and share above 0 (after normalizing, mean and spread are 0 and 1 by
    construction and say nothing)."""
    policy, trainer = _make()
    rollout = make_rollout(policy, trainer, E=4, T=5)
    seen = {}
    real = trainer.prepare

    def spy(batch, **kw):
        out = real(batch, **kw)
        seen["adv"] = trainer.advantage
        return out

    trainer.prepare = spy
    clone = rollout.clone()
    metrics = trainer.update(rollout)
    # the same batch through the same steps without normalizing: the advantages the stats describe
    _, again = _make()
    again.cfg = dataclasses.replace(again.cfg, normalize_advantage=False)
    adv = again.prepare(clone)["advantage"].double()
    assert metrics["adv_mean"] == pytest.approx(float(adv.mean()), rel=1e-5, abs=1e-6)
    assert metrics["adv_std"] == pytest.approx(float(adv.std(unbiased=False)), rel=1e-5)
    assert metrics["adv_max_abs"] == pytest.approx(float(adv.abs().max()), rel=1e-5)
    assert metrics["adv_pos_frac"] == pytest.approx(float((adv > 0).double().mean()))
    assert metrics["adv_std"] != pytest.approx(1.0), "not the normalized advantages"


def test_update_detail_holds_every_minibatch_step_and_every_env_in_the_same_read(monkeypatch):
    """``update(detail=True)`` (the run asks for it for a while after an anomaly): each minibatch
    step's metrics and each env's rollout statistics, read with the report (no extra host sync)."""
    policy, trainer = _make()
    rollout = make_rollout(policy, trainer, E=4, T=5)
    reads = []
    real = torch.Tensor.tolist

    def counting(self):
        reads.append(self.numel())
        return real(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    metrics = trainer.update(rollout.clone(), detail=True)
    assert len(reads) == metrics["minibatch_steps"] + 1  # each step's two flags, then the one report
    steps, envs = metrics["detail"]["steps"], metrics["detail"]["envs"]
    assert len(steps["kl_approx"]) == len(steps["grad/global_norm"]) == metrics["minibatch_steps"] == 4
    assert sum(steps["kl_approx"]) / 4 == pytest.approx(metrics["kl_approx"], rel=1e-5)
    assert len(envs["return"]) == 4
    want = rollout["next", "raw_reward"].sum(1)
    assert envs["return"] == pytest.approx(want.tolist(), rel=1e-5)
    assert "detail" not in trainer.update(rollout.clone())


def test_C3_minibatches_are_whole_env_sequences_shuffled_each_epoch(monkeypatch):
    policy, trainer = _make()
    rollout = make_rollout(policy, trainer, E=4, T=5)
    seen = []
    real_rescore = trainer.step.learner.rescore

    def spy(td):
        seen.append(td["raw_observation"][:, :, 0].clone())  # [k, T]: identifies the env sequences
        return real_rescore(td)

    monkeypatch.setattr(trainer.step.learner, "rescore", spy)  # the minibatch steps' re-scoring
    trainer.update(rollout)
    env_rows = rollout["raw_observation"][:, :, 0]
    minibatches = seen
    assert len(minibatches) == 4
    orders = []
    for mb in minibatches:
        assert mb.shape == (2, 5), "each minibatch holds whole T-step sequences"
        ids = [int(torch.nonzero((env_rows == row).all(1))[0]) for row in mb]
        orders.append(ids)
    for epoch in (orders[:2], orders[2:]):
        assert sorted(epoch[0] + epoch[1]) == [0, 1, 2, 3], "each env exactly once per epoch"
    assert orders[:2] != orders[2:], "the env order is reshuffled between epochs"


def test_C4_H5_value_clip_anchor_is_the_update_start_recomputation(monkeypatch):
    """With several epochs the anchor is V recomputed once at update start with the same hidden
    reconstruction, not the rollout's stored values, and it stays fixed across epochs."""
    cfg = PPOConfig(hidden=16, head_hidden=8, n_epochs=3, n_minibatches=2, target_kl=None, value_clip=0.2)
    policy, trainer = _make(cfg)
    rollout = make_rollout(policy, trainer)
    rollout["state_value"] = rollout["state_value"] + 100.0  # stale rollout values must not be used
    anchors = []
    real_loss = trainer.loss_fn

    def spy(td):
        anchors.append((td["raw_observation"][:, 0, 0].clone(), td["state_value"].clone()))
        return real_loss(td)

    monkeypatch.setattr(trainer.step.learner, "loss_fn", spy)  # the minibatch steps' loss
    with torch.no_grad():
        h0 = rollout["recurrent_state", "h"][:, 0].unsqueeze(0)
        c0 = rollout["recurrent_state", "c"][:, 0].unsqueeze(0)
        actions = rollout["op", "action"], rollout["slot", "action"]
        expected = policy.rescore(rollout["observation"], (h0, c0), *actions)["state_value"]
    trainer.update(rollout)
    assert len(anchors) == 6
    first_obs = rollout["raw_observation"][:, 0, 0]
    for ids, anchor in anchors:
        rows = [int(torch.nonzero(first_obs == v)[0]) for v in ids]
        torch.testing.assert_close(anchor, expected[rows])


def test_H5_every_epoch_rescores_whole_sequences_with_the_current_weights(monkeypatch):
    """n_epochs > 1 is correct for the recurrent policy: each minibatch's logits are the current
    network unrolled over the whole stored sequence from its stored initial state (no stale cached
    hidden states), the old log-probs stay the rollout's, and later epochs see a moved policy."""
    cfg = PPOConfig(hidden=16, head_hidden=8, n_epochs=3, n_minibatches=2, target_kl=None, lr=0.02)
    policy, trainer = _make(cfg)
    rollout = make_rollout(policy, trainer)
    old_logp = rollout["op", "action_log_prob"].clone()
    seen = []
    real_loss = trainer.loss_fn

    def spy(td):
        with torch.no_grad():
            h0 = td["recurrent_state", "h"][:, 0].unsqueeze(0)
            c0 = td["recurrent_state", "c"][:, 0].unsqueeze(0)
            fresh = policy.rescore(td["observation"], (h0, c0), td["op", "action"], td["slot", "action"])
        torch.testing.assert_close(td["current", "op", "logits"], fresh["op", "logits"])
        torch.testing.assert_close(td["current", "state_value"], fresh["state_value"])
        first = rollout["observation"][:, 0]
        rows = [int(torch.nonzero((first == o).all(-1))[0]) for o in td["observation"][:, 0]]
        torch.testing.assert_close(td["op", "action_log_prob"], old_logp[rows])
        seen.append((rows, td["current", "op", "logits"].detach().clone()))
        return real_loss(td)

    monkeypatch.setattr(trainer.step.learner, "loss_fn", spy)  # the minibatch steps' loss
    trainer.update(rollout)
    assert len(seen) == 6
    by_env = {}
    for rows, logits in seen:
        for r, lg in zip(rows, logits):
            by_env.setdefault(r, []).append(lg)
    assert all(len(v) == 3 for v in by_env.values()), "every env's sequence is re-scored once per epoch"
    assert any(not torch.allclose(v[0], v[-1]) for v in by_env.values()), "later epochs see updated weights"


def test_H5_rescoring_starts_from_the_stored_initial_state_not_from_zeros(monkeypatch):
    """Each minibatch is re-scored from the recurrent state stored at its first step. With a zero
    stored state (every test rollout above) a trainer that started from zeros would pass unnoticed
    (issue 10), so this rollout starts mid-stream, from a non-zero state."""
    cfg = PPOConfig(hidden=16, head_hidden=8, n_epochs=2, n_minibatches=2, target_kl=None)
    policy, trainer = _make(cfg)
    g = torch.Generator().manual_seed(7)
    h0, c0 = (torch.randn(1, 4, cfg.hidden, generator=g) for _ in range(2))
    rollout = make_rollout(policy, trainer, state=(h0, c0))
    torch.testing.assert_close(rollout["recurrent_state", "h"][:, 0], h0[0])
    real_loss, checked = trainer.loss_fn, []

    def spy(td):
        with torch.no_grad():
            first = td["recurrent_state"][:, 0]
            stored = (first["h"].unsqueeze(0), first["c"].unsqueeze(0))
            fresh = policy.rescore(td["observation"], stored, td["op", "action"], td["slot", "action"])
            zero = policy.initial_state(td.shape[0])
            zeros = policy.rescore(td["observation"], zero, td["op", "action"], td["slot", "action"])
        torch.testing.assert_close(td["current", "op", "logits"], fresh["op", "logits"])
        torch.testing.assert_close(td["current", "state_value"], fresh["state_value"])
        assert not torch.allclose(fresh["op", "logits"], zeros["op", "logits"]), "must tell them apart"
        checked.append(1)
        return real_loss(td)

    monkeypatch.setattr(trainer.step.learner, "loss_fn", spy)  # the minibatch steps' loss
    trainer.update(rollout)
    assert len(checked) == 4


def test_C5_S2_statistics_updated_before_the_update_and_observations_untouched(monkeypatch):
    policy, trainer = _make()
    rollout = make_rollout(policy, trainer)
    stored = rollout["observation"].clone()
    counts_at_step = []
    real_step = trainer.optimizer.step

    def spy(*a, **k):
        counts_at_step.append(float(trainer.agent.obs_stats["count"]))
        return real_step(*a, **k)

    monkeypatch.setattr(trainer.optimizer, "step", spy)
    trainer.update(rollout)
    n = rollout["raw_observation"].shape[0] * rollout["raw_observation"].shape[1]
    assert counts_at_step and all(c == n for c in counts_at_step), "the batch was in the stats at every step"
    torch.testing.assert_close(rollout["observation"], stored)
    mean = rollout["raw_observation"].reshape(-1, RAW).double().mean(0)
    torch.testing.assert_close(trainer.agent.obs_stats["mean"], mean)


def test_first_minibatch_sees_ratio_one():
    """act and evaluate agree, so the first step of the update starts from ratio 1 and KL 0."""
    cfg = PPOConfig(hidden=16, head_hidden=8, n_epochs=1, n_minibatches=1, target_kl=None)
    policy, trainer = _make(cfg)
    rollout = trainer.prepare(make_rollout(policy, trainer))
    rollout["current"] = trainer._rescore(rollout)
    losses = trainer.loss_fn(rollout)
    assert losses["max_ratio"].item() == pytest.approx(1.0, abs=1e-4)
    assert losses["kl_approx"].item() == pytest.approx(0.0, abs=1e-6)


def test_kl_early_stop_skips_the_step():
    cfg = PPOConfig(hidden=16, head_hidden=8, n_epochs=5, n_minibatches=2, target_kl=1e-9, lr=0.05)
    policy, trainer = _make(cfg)
    metrics = trainer.update(make_rollout(policy, trainer))
    assert metrics["early_stopped"] is True
    assert metrics["minibatch_steps"] < 10


class _ThreadRank:
    """Process ``rank`` of two, simulated by a thread: ``all_reduce_sum`` sums both threads' tensors (in
    rank order, the same on both), as gloo's would; ``exchange`` is the two threads' slots and barrier."""

    world, active = 2, True

    def __init__(self, rank: int, exchange: tuple[list, threading.Barrier]) -> None:
        self.rank, self.exchange = rank, exchange

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        slots, barrier = self.exchange
        slots[self.rank] = t.detach().clone()
        barrier.wait()
        total = slots[0] + slots[1]
        barrier.wait()  # both have read the sum before either writes its next tensor
        return t.copy_(total)


def _on_two_ranks(fn) -> list:
    """``fn(rank)`` of ranks 0 and 1, each in its own thread (one intra-op thread), in rank order."""
    out, errors = [None, None], []

    def run(rank: int) -> None:
        try:
            out[rank] = fn(rank)
        except BaseException as e:  # re-raised below
            errors.append(e)

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        torch.set_num_threads(before)
    if errors:
        raise errors[0]
    return out


def test_issue102_two_processes_stop_on_the_summed_kl_not_on_their_own_part():
    """With two processes (:class:`~esper.shell.agent.steps.SharedStep`) the KL early stop is decided on
    the KL summed over them, the whole minibatch's, so both stop where one process would: here each
    process's part is under ``1.5 * target_kl`` and their sum over it. Decided on its own part, each
    would go on (issue 102), and processes whose parts fall either side of it would disagree."""
    cfg = PPOConfig(hidden=16, head_hidden=8, n_epochs=1, n_minibatches=1, target_kl=None)
    policy, whole = _make(cfg)
    batch = whole.prepare(make_rollout(policy, whole, E=4, T=5, seed=7))
    with torch.no_grad():  # the policy moved since the rollout: a KL to stop on
        g = torch.Generator().manual_seed(1)
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)

    def two(c: PPOConfig) -> list[PPOTrainer]:  # the two processes' trainers, each its policy's replica
        exchange = ([None, None], threading.Barrier(2, timeout=60))
        return [
            PPOTrainer(_agent(copy.deepcopy(policy), c), c, dist=_ThreadRank(r, exchange)) for r in (0, 1)
        ]

    halves = [batch[2 * r : 2 * r + 2].clone() for r in range(2)]  # each process's 2 of the 4 envs
    idx = torch.arange(4)  # one minibatch of every env: half of it on each process
    ranks = two(cfg)

    def part(r: int) -> float:  # this process's part of the minibatch's KL
        mine = halves[r][local_rows(idx, 2, ranks[r].dist)]
        return descend(ranks[r].learner, mine, 0.0, ranks[r].dist).losses["kl_approx"].item()

    parts = _on_two_ranks(part)
    kl = descend(whole.learner, batch[idx], 0.0).losses["kl_approx"].item()  # one process's
    assert sum(parts) == pytest.approx(kl, rel=1e-4) and min(parts) > 0
    threshold = (max(parts) + sum(parts)) / 2  # 1.5 * target_kl: above each part, under their sum
    assert max(parts) < threshold < kl
    stopping = dataclasses.replace(cfg, target_kl=threshold / 1.5)
    one = PPOTrainer(_agent(copy.deepcopy(policy), stopping), stopping)
    ranks = two(stopping)
    for t in (one, *ranks):
        assert isinstance(t.step, SharedStep) == (t is not one)
        t.step.begin_update(cfg.lr, block=2)
    assert one.step(batch, idx, 0.0)[0] is True  # one process stops
    stopped = _on_two_ranks(lambda r: ranks[r].step(halves[r], idx, 0.0))
    assert [s[0] for s in stopped] == [True, True]  # both stop, as one process does
    assert [s[2] for s in stopped] == [None, None]  # and neither steps


def test_nonfinite_rollout_is_refused_with_the_key_named():
    policy, trainer = _make()
    rollout = make_rollout(policy, trainer)
    rollout["next", "raw_reward"][1, 2] = float("nan")
    with pytest.raises(FloatingPointError, match=r"\('next', 'raw_reward'\)"):
        trainer.update(rollout)


def test_minibatches_must_divide_envs():
    policy, trainer = _make(dataclasses.replace(PPOConfig(hidden=16, head_hidden=8), n_minibatches=3))
    with pytest.raises(ValueError, match="must divide n_envs=4"):
        trainer.update(make_rollout(policy, trainer))


def test_weight_decay_on_the_critic_only():
    policy, trainer = _make(PPOConfig(hidden=16, head_hidden=8, critic_weight_decay=0.1))
    groups = trainer.optimizer.param_groups
    critic = {id(p) for p in policy.value_head.parameters()}
    for group in groups:
        ids = {id(p) for p in group["params"]}
        assert group["weight_decay"] == (0.1 if ids == critic else 0.0)


def test_entropy_coefficient_anneals_linearly():
    cfg = PPOConfig(entropy_coef=0.1, entropy_coef_end=0.0, entropy_anneal_updates=10)
    assert [round(cfg.entropy_coef_at(u), 6) for u in (0, 5, 10, 20)] == [0.1, 0.05, 0.0, 0.0]


def test_learning_rate_anneals_linearly_and_the_update_uses_it():
    """``lr_at``: ``lr`` to ``lr_end`` over ``lr_anneal_updates`` (constant without them); each update
    sets the optimizer's rate to its own and reports it; a resumed trainer goes on from its update."""
    cfg = PPOConfig(hidden=16, head_hidden=8, lr=1e-2, lr_end=0.0, lr_anneal_updates=4, n_epochs=1)
    assert [round(cfg.lr_at(u), 6) for u in (0, 1, 2, 4, 9)] == [0.01, 0.0075, 0.005, 0.0, 0.0]
    assert PPOConfig(lr=1e-3).lr_at(50) == 1e-3 and PPOConfig(lr=1e-3, lr_end=0.0).lr_at(50) == 1e-3
    policy, trainer = _make(cfg)
    rollout = make_rollout(policy, trainer)
    assert [trainer.update(rollout.clone())["lr"] for _ in range(2)] == [0.01, 0.0075]
    assert all(g["lr"] == 0.0075 for g in trainer.optimizer.param_groups)
    _, trainer2 = _make(cfg, seed=3)
    trainer2.load_state_dict(copy.deepcopy(trainer.state_dict()))  # as torch.load gives: no shared tensors
    assert trainer2.update(rollout.clone())["lr"] == 0.005


def test_bad_ppo_config_is_refused():
    with pytest.raises(ValueError, match="ppo.gamma"):
        PPOConfig(gamma=1.5)
    with pytest.raises(ValueError, match="head_entropy_weights needs 8"):
        PPOConfig(head_entropy_weights=(1.0, 2.0))


def test_checkpoint_state_round_trip():
    policy, trainer = _make()
    trainer.update(make_rollout(policy, trainer))
    sd = resume_state(trainer)
    policy2, trainer2 = _make(seed=3)
    resume(trainer2, sd)
    for a, b in zip(policy.parameters(), policy2.parameters()):
        assert torch.equal(a, b)
    assert trainer2.state.updates == 1
    torch.testing.assert_close(trainer2.agent.obs_stats["mean"], trainer.agent.obs_stats["mean"])
    # the optimizer resumes too (Adam's step and moments, the lr schedule): the next update on the same
    # rollout lands both learners on the same parameters (a fresh Adam would take another step)
    trainer.update(make_rollout(policy, trainer, seed=7))
    trainer2.update(make_rollout(policy2, trainer2, seed=7))
    for a, b in zip(policy.parameters(), policy2.parameters(), strict=True):
        assert torch.equal(a, b)


# ------------------------------------------------------------------------- non-finite updates (issue 10)
def _learner_state(policy, trainer):
    return ({k: v.clone() for k, v in policy.state_dict().items()},
            copy.deepcopy(trainer.optimizer.state_dict()))  # fmt: skip


def _assert_same_learner(policy, trainer, state):
    params, opt = state
    for k, v in policy.state_dict().items():
        assert torch.equal(v, params[k]), k
    now = trainer.optimizer.state_dict()
    assert now["state"].keys() == opt["state"].keys()
    for i, st in opt["state"].items():
        for name, t in st.items():
            assert torch.equal(now["state"][i][name], t), (i, name)


def _trained_once():
    """A trainer after one healthy update (so the optimizer has moments to roll back to)."""
    cfg = PPOConfig(hidden=16, head_hidden=8, n_epochs=2, n_minibatches=2, target_kl=None)
    policy, trainer = _make(cfg)
    trainer.update(make_rollout(policy, trainer, seed=1))
    return policy, trainer


def test_a_nonfinite_loss_is_never_applied_the_update_rolls_back(monkeypatch):
    policy, trainer = _trained_once()
    rollout = make_rollout(policy, trainer, seed=2)
    start = _learner_state(policy, trainer)
    real_loss, calls = trainer.loss_fn, []

    def second_step_nan(td):
        out = real_loss(td)
        calls.append(1)
        if len(calls) == 2:
            out["loss_objective"] = out["loss_objective"] * float("nan")
        return out

    monkeypatch.setattr(trainer.step.learner, "loss_fn", second_step_nan)
    metrics = trainer.update(rollout)
    assert metrics["rolled_back"] is True and metrics["nonfinite_steps"] == 1
    assert metrics["minibatch_steps"] == 1 and len(calls) == 2, "the update ends at the bad step"
    _assert_same_learner(policy, trainer, start)  # the good first step is undone too
    assert trainer.bad_streak == 1
    assert all(math.isfinite(v) for v in (metrics["loss_objective"], metrics["grad_norm"]))
    monkeypatch.setattr(trainer.step.learner, "loss_fn", real_loss)
    healthy = trainer.update(make_rollout(policy, trainer, seed=3))
    assert healthy["rolled_back"] is False and trainer.bad_streak == 0


def test_a_nonfinite_gradient_with_a_finite_loss_rolls_back():
    policy, trainer = _trained_once()
    start = _learner_state(policy, trainer)
    weight = (
        policy.value_head[0].weight
        if isinstance(policy.value_head, torch.nn.Sequential)
        else next(policy.value_head.parameters())
    )
    handle = weight.register_hook(lambda g: g * float("inf"))
    metrics = trainer.update(make_rollout(policy, trainer, seed=2))
    handle.remove()
    assert metrics["rolled_back"] is True and metrics["nonfinite_steps"] == 1
    assert metrics["minibatch_steps"] == 0
    _assert_same_learner(policy, trainer, start)


def test_nonfinite_parameters_after_a_step_roll_back(monkeypatch):
    """A step whose loss and gradient were finite but whose result is not (an overflowing update) is
    caught by the end-of-update check."""
    policy, trainer = _trained_once()
    start = _learner_state(policy, trainer)
    real_step = trainer.optimizer.step

    def overflowing_step(*args, **kwargs):
        out = real_step(*args, **kwargs)
        with torch.no_grad():
            next(policy.parameters())[0] = float("inf")
        return out

    monkeypatch.setattr(trainer.optimizer, "step", overflowing_step)
    metrics = trainer.update(make_rollout(policy, trainer, seed=2))
    assert metrics["nonfinite_steps"] == 1, "the next step's loss is no longer finite"
    assert metrics["rolled_back"] is True
    _assert_same_learner(policy, trainer, start)
    cfg = PPOConfig(hidden=16, head_hidden=8, n_epochs=1, n_minibatches=1, target_kl=None)
    policy, trainer = _make(cfg)  # a single step: only the end-of-update check sees it
    start = _learner_state(policy, trainer)
    real_step = trainer.optimizer.step
    monkeypatch.setattr(trainer.optimizer, "step", overflowing_step)
    metrics = trainer.update(make_rollout(policy, trainer))
    assert metrics["minibatch_steps"] == 1 and metrics["nonfinite_steps"] == 0
    assert metrics["rolled_back"] is True
    _assert_same_learner(policy, trainer, start)


def test_the_issue_lr_1e20_never_leaves_nonfinite_or_exploded_weights():
    cfg = PPOConfig(hidden=16, head_hidden=8, n_epochs=2, n_minibatches=2, target_kl=None, lr=1e20)
    policy, trainer = _make(cfg)
    start = _learner_state(policy, trainer)
    for seed in range(3):
        metrics = trainer.update(make_rollout(policy, trainer, seed=seed))
        assert metrics["rolled_back"] is True
    assert trainer.bad_streak == 3
    _assert_same_learner(policy, trainer, start)


def test_a_resumed_trainer_uses_its_own_config_lr_not_the_saved_one():
    """A run that blew up with --ppo.lr 1e20 must be resumable with --ppo.lr 1e-3 (the optimizer's
    load_state_dict alone would restore the saved lr)."""
    _, trainer = _make(PPOConfig(hidden=16, head_hidden=8, n_epochs=1, n_minibatches=2, lr=1e20))
    sd = trainer.state_dict()
    sane = PPOConfig(hidden=16, head_hidden=8, n_epochs=1, n_minibatches=2, lr=1e-3, critic_weight_decay=0.1)
    _, trainer2 = _make(sane, seed=3)
    trainer2.load_state_dict(sd)
    assert [g["lr"] for g in trainer2.optimizer.param_groups] == [1e-3, 1e-3]
    assert [g["weight_decay"] for g in trainer2.optimizer.param_groups] == [0.0, 0.1]


def test_the_finiteness_check_adds_no_host_sync_per_step(monkeypatch):
    """One read per minibatch step (the KL flag and the finiteness flag together) and one for the
    report: the same count as before the check existed."""
    policy, trainer = _make()
    rollout = make_rollout(policy, trainer)
    trainer.prepare(rollout.clone())  # warm the statistics path outside the count
    reads = []
    real = torch.Tensor.tolist

    def counting(self):
        reads.append(self.numel())
        return real(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    metrics = trainer.update(rollout)
    step_reads = [n for n in reads if n == 2]
    assert len(step_reads) == metrics["minibatch_steps"] == 4


# ------------------------------------------------------------------------------ ppo.replay (decoupled)
def _replay_cfg(**kw) -> PPOConfig:
    base = dict(hidden=16, head_hidden=8, n_epochs=2, n_minibatches=2, target_kl=None, lr=0.05, replay=2)
    return PPOConfig(**{**base, **kw})


def test_replay_keeps_the_last_rollouts_as_they_came_in_and_trains_on_them():
    policy, trainer = _make(_replay_cfg())
    replayed = []
    for i in range(3):
        rollout = make_rollout(policy, trainer, seed=10 + i)
        kept = rollout.clone()
        replayed.append(trainer.update(rollout)["replayed_envs"])
        assert len(trainer.state.replay) == min(i + 1, 2)
        assert torch.equal(trainer.state.replay[0]["next", "raw_reward"], kept["next", "raw_reward"])
        assert "advantage" not in trainer.state.replay[0].keys()  # stored as it came in, not prepared
    assert replayed == [0, 4, 8]


def test_a_replayed_rollout_is_rescored_by_the_current_policy_critic_and_statistics():
    """The replayed part of the prepared batch: rewards scaled with today's statistics, V from today's
    critic (the last bootstrap the rollout's), each head's log-prob the current (proximal) policy's, the
    GAE advantage weighted by min(1, the joint ratio to the policy that acted); the new part is what a
    preparation without replay gives."""
    cfg = _replay_cfg(normalize_advantage=False)
    policy, trainer = _make(cfg)
    old = make_rollout(policy, trainer, seed=20)
    trainer.update(old.clone())  # the policy moves (lr 0.05) and the statistics change
    new = make_rollout(policy, trainer, seed=21)
    snapshot = resume_state(trainer)
    trainer.state.replay = []
    plain = trainer.prepare(new.clone())
    _, trainer2 = _make(cfg, seed=3)
    resume(trainer2, snapshot)
    batch = trainer2.prepare(new.clone(), replayed=[old])
    assert batch.batch_size[0] == 8
    for key in ("advantage", "value_target", "state_value", ("next", "reward")):
        torch.testing.assert_close(batch[:4][key], plain[key])
    part = batch[4:]
    with torch.no_grad():
        now = trainer2._rescore(old)
    ref = old.clone()
    stats = trainer2.state.reward_stats
    ref["next", "reward"] = scale(stats, old["next", "raw_reward"], clip=cfg.reward_clip)
    ref["state_value"] = now["state_value"]
    ref["next", "state_value"] = torch.cat([now["state_value"][:, 1:], old["next", "state_value"][:, -1:]], 1)
    gae(ref, gamma=cfg.gamma, lmbda=cfg.gae_lambda)
    log_w = torch.zeros(4, old.batch_size[1])
    rel = head_relevance(old["op", "action"].long())
    for h in HEADS:
        lp = D.log_prob(now[h, "logits"], old[h, "action"], old[h, "action_mask"])
        torch.testing.assert_close(part[h, "action_log_prob"], lp)
        counts = rel[..., HEAD_INDEX[h]] & (old[h, "action_mask"].sum(-1) > 1)
        log_w += torch.where(counts, lp - old[h, "action_log_prob"], 0.0)
    w = log_w.exp().clamp(max=1.0)
    assert bool((w < 0.99).any())  # the policy did move
    torch.testing.assert_close(part["state_value"], now["state_value"])
    torch.testing.assert_close(part["next", "reward"], ref["next", "reward"])
    torch.testing.assert_close(part["value_target"], ref["value_target"])
    torch.testing.assert_close(part["advantage"], ref["advantage"] * w.reshape(ref["advantage"].shape))


def test_replay_rebases_the_kl_so_stale_batches_do_not_stop_the_update():
    """Measured from the behaviour policy, a batch two updates old is far from the current policy; the
    decoupled KL is measured from the policy at the update's start, so the first step of an update sees
    KL 0 and ratio 1 on the replayed envs too."""
    policy, trainer = _make(_replay_cfg(n_minibatches=1))
    for i in range(2):
        trainer.update(make_rollout(policy, trainer, seed=30 + i))
    batch = trainer.prepare(make_rollout(policy, trainer, seed=32), replayed=trainer.state.replay)
    assert batch.batch_size[0] == 12
    batch["current"] = trainer._rescore(batch)
    losses = trainer.loss_fn(batch)
    assert losses["kl_approx"].item() == pytest.approx(0.0, abs=1e-6)
    assert losses["max_ratio"].item() == pytest.approx(1.0, abs=1e-4)


def test_replay_round_trips_through_the_checkpoint():
    policy, trainer = _make(_replay_cfg())
    for i in range(2):
        trainer.update(make_rollout(policy, trainer, seed=40 + i))
    policy2, trainer2 = _make(_replay_cfg(), seed=3)
    resume(trainer2, resume_state(trainer))
    assert len(trainer2.state.replay) == 2
    for a, b in zip(trainer.state.replay, trainer2.state.replay):
        assert (a == b).all()
    rollout = make_rollout(policy, trainer, seed=42)
    m1, m2 = trainer.update(rollout.clone()), trainer2.update(rollout.clone())
    assert m1["replayed_envs"] == m2["replayed_envs"] == 8
    for p, q in zip(policy.parameters(), policy2.parameters()):
        torch.testing.assert_close(p, q)


def test_replay_past_the_recompile_limit_is_refused_with_compile_in_one_line():
    """Each batch size while the kept rollouts fill up is a graph of its own; more than dynamo keeps
    would fall back to eager without a word, so it is refused up front."""
    policy = FactoredRecurrentActorCritic(RAW + 6, SPEC, hidden=16, head_hidden=8)
    limit = torch._dynamo.config.recompile_limit
    with pytest.raises(ValueError, match=rf"ppo.replay={limit} with --compile needs {limit + 1} graphs"):
        PPOTrainer(_agent(policy), _replay_cfg(replay=limit), compile=True)
    PPOTrainer(_agent(policy), _replay_cfg(replay=limit - 1), compile=True)  # within it


def test_local_rows_find_each_process_envs_in_the_one_process_layout():
    """The prepared batch of one process is [new rollout, replayed rollouts...], each block of N = W * L
    global envs; process r holds L of every block. Global env g must map to the row of r's stack that
    holds the same env of the same block, in the order of ``idx``."""
    W, L, blocks = 3, 2, 3
    layout = torch.arange(W * L * blocks)  # one process's rows: env labels in global order
    for rank in range(W):
        # the rows process `rank` holds: its L envs of every block, blocks stacked
        held = torch.cat([layout[b * W * L + rank * L : b * W * L + (rank + 1) * L] for b in range(blocks)])
        idx = torch.randperm(W * L * blocks, generator=torch.Generator().manual_seed(rank))[:7]
        rows = local_rows(idx, L, Dist(rank=rank, world=W))
        mine = idx[torch.isin(idx, held)]
        assert torch.equal(held[rows], mine)  # the right envs, in idx's order
    assert torch.equal(local_rows(torch.tensor([5, 2, 3]), 4, SINGLE), torch.tensor([5, 2, 3]))


def test_replay_checkpoint_is_whole_and_each_process_keeps_its_slice():
    """A checkpoint's replayed rollouts hold every env (the number of processes may change on resume):
    loaded by process 1 of 2, the trainer keeps the second half of each."""
    policy, trainer = _make(_replay_cfg())
    for i in range(2):
        trainer.update(make_rollout(policy, trainer, seed=50 + i))
    sd = copy.deepcopy(trainer.state_dict())
    assert [d["is_init"].shape[0] for d in sd["replay"]] == [4, 4]
    assert trainer.state_dict(replay=False)["replay"] == []
    policy2 = FactoredRecurrentActorCritic(RAW + 6, SPEC, hidden=16, head_hidden=8)
    half = PPOTrainer(_agent(policy2), _replay_cfg(), dist=Dist(rank=1, world=2))
    half.load_state_dict(sd)
    assert len(half.state.replay) == len(trainer.state.replay) == 2
    for whole, part in zip(trainer.state.replay, half.state.replay):
        assert part.batch_size[0] == 2 and (part == whole[2:]).all()


def test_host_groups_take_each_envs_advantage_against_the_others_of_its_group():
    """``ppo.host_group 2``: GAE's advantages, then each env's less its partner's, on the new rollout
    and on a replayed one alike (both go through the trainer's GAE; the replayed rollout comes from the
    policy as it is, so its behaviour weight is 1); the value targets stay GAE's."""
    base = _replay_cfg(normalize_advantage=False)
    policy, trainer = _make(dataclasses.replace(base, host_group=2))
    old = make_rollout(policy, trainer, seed=30)
    new = make_rollout(policy, trainer, seed=31)
    snapshot = resume_state(trainer)
    grouped = trainer.prepare(new.clone(), replayed=[old.clone()])
    _, plain = _make(base)
    resume(plain, snapshot)
    ungrouped = plain.prepare(new.clone(), replayed=[old.clone()])
    torch.testing.assert_close(grouped["value_target"], ungrouped["value_target"])
    for part in (slice(0, 4), slice(4, 8)):
        want = group_relative(ungrouped[part]["advantage"], 2)
        torch.testing.assert_close(grouped[part]["advantage"], want)
    a = grouped[:4]["advantage"]
    torch.testing.assert_close(a[0::2], -a[1::2])  # in pairs, each is the other's negative
    assert not torch.allclose(a, ungrouped[:4]["advantage"])
    with pytest.raises(ValueError, match="group 3 must divide the 4 envs"):
        _make(dataclasses.replace(base, host_group=3))[1].prepare(new.clone())
