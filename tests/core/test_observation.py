"""Observation: history bookkeeping, the layout, and finite, pre-scaled features for any finite signals."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict

from esper.core.lifecycle import LifecycleConfig, init_slots, lifecycle_step, record_signals
from esper.core.observation import (
    GRAD_GAIN_FEATURES,
    SEED_GRAD_FEATURES,
    global_dim,
    init_history,
    layout_options,
    obs_dim,
    observation_layout,
    observe,
    slot_state_names,
    split_observation,
    update_history,
)
from esper.core.spec import SLOT_FIELDS, Op, Stage, Tempo
from tests.core.test_lifecycle import N_BP, make_action, make_signals, random_rollout


def _obs(signals, history, slots, cfg=None, max_epochs=25):
    return observe(
        signals,
        history,
        slots,
        max_epochs=max_epochs,
        n_blueprints=N_BP,
        lifecycle_cfg=cfg or LifecycleConfig(),
    )


def col(name: str, S: int = 3) -> int:
    return observation_layout(S, N_BP).index(name)


# ------------------------------------------------------------------------------------------ history
def test_history_deltas_best_plateau_and_window():
    h = init_history(2, window=3)
    seq = [(2.0, 40.0), (1.5, 42.0), (1.6, 42.2), (1.4, 42.3)]
    out = []
    for loss, acc in seq:
        h = update_history(h, make_signals(2, 1, val_loss=loss, val_acc=acc))
        out.append(h)
    first = out[0]
    assert first["val_loss_delta"].tolist() == [0.0, 0.0] and first["val_acc_delta"].tolist() == [0.0, 0.0]
    assert first["plateau"].tolist() == [0, 0]
    torch.testing.assert_close(out[1]["val_loss_delta"], torch.tensor([0.5, 0.5]))  # prev - cur: + is better
    torch.testing.assert_close(out[1]["val_acc_delta"], torch.tensor([2.0, 2.0]))
    assert [int(o["plateau"][0]) for o in out] == [0, 0, 1, 2]
    assert float(out[-1]["best_val_acc"][0]) == pytest.approx(42.3)
    assert float(out[-1]["best_val_loss"][0]) == pytest.approx(1.4)
    assert out[1]["val_acc_window"][0].tolist() == [0.0, 40.0, 42.0]  # oldest first, front-padded
    torch.testing.assert_close(out[3]["val_loss_window"][0], torch.tensor([1.5, 1.6, 1.4]))
    assert int(out[-1]["count"][0]) == 4


def test_history_plateau_threshold_is_a_parameter():
    h = init_history(1)
    for acc in (40.0, 40.8, 41.6):
        h = update_history(h, make_signals(1, 1, val_acc=acc), plateau_threshold=1.0)
    assert int(h["plateau"][0]) == 2
    with pytest.raises(ValueError, match="plateau_threshold"):
        update_history(h, make_signals(1, 1), plateau_threshold=float("nan"))


def test_history_shape_errors():
    with pytest.raises(ValueError, match="window"):
        init_history(2, window=0)
    with pytest.raises(ValueError, match="batch size"):
        update_history(init_history(2), make_signals(3, 1))


# ------------------------------------------------------------------------------------------- layout
def test_layout_names_are_unique_and_sized():
    for S, nb, w in [(1, 1, 1), (3, 4, 5), (5, 13, 2)]:
        names = observation_layout(S, nb, window=w)
        assert len(names) == len(set(names)) == obs_dim(S, nb, window=w)
    per_slot = [n for n in observation_layout(3, N_BP) if n.startswith("slot0.")]
    assert len(observation_layout(3, N_BP)) == 23 + 3 * len(per_slot)
    assert "slot2.g5_ready" in observation_layout(3, N_BP)


@pytest.mark.parametrize(("seed_grads", "grad_gain"), [(a, b) for a in (False, True) for b in (False, True)])
@pytest.mark.parametrize(("S", "nb"), [(1, 1), (3, 8), (5, 7)])
def test_split_observation_names_every_column_whatever_the_host(S, nb, seed_grads, grad_gain):
    """The global part, each slot's features without the blueprint one-hot (their own, host-independent
    names) and the one-hot: every column of the layout lands where its name says, once."""
    names = observation_layout(S, nb, seed_grads=seed_grads, grad_gain=grad_gain)
    x = torch.arange(len(names), dtype=torch.float32).expand(2, -1)  # [*L, obs_dim]
    glob, state, onehot = split_observation(x, S, nb)
    assert glob.shape == (2, global_dim()) and [names[int(i)] for i in glob[0]] == list(names[: global_dim()])
    per = slot_state_names(seed_grads=seed_grads, grad_gain=grad_gain)
    assert state.shape == (2, S, len(per)) and onehot.shape == (2, S, nb)
    for s in range(S):
        assert [names[int(i)] for i in state[1, s]] == [f"slot{s}.{n}" for n in per]
        assert [names[int(i)] for i in onehot[1, s]] == [f"slot{s}.blueprint_{b}" for b in range(nb)]
    assert glob.numel() // 2 + state.numel() // 2 + onehot.numel() // 2 == len(names)
    with pytest.raises(ValueError, match="split_observation: .* (not an observation of|fit no layout)"):
        split_observation(x[..., :-1], S, nb)
    with pytest.raises(ValueError, match="fit no layout"):
        split_observation(torch.zeros(obs_dim(S, nb) + S), S, nb)


def test_features_land_in_their_columns():
    cfg = LifecycleConfig()
    slots = init_slots(1, [True, True, False])
    h = init_history(1)
    for t in range(1, 7):  # germinate slot 1 at step 1 (blueprint 2, tempo SLOW), wait
        sig = make_signals(
            1, 3, epoch=t, val_acc=30.0 + 2 * t, grad_ratio=0.5, seed_params=[[0.0, 1000.0, 0.0]]
        )
        slots = record_signals(slots, sig, cfg)
        h = update_history(h, sig)
        op = Op.GERMINATE if t == 1 else Op.WAIT
        obs = _obs(sig, h, slots, cfg)
        if t < 6:
            slots, _ = lifecycle_step(slots, make_action(1, op, 1, blueprint=2, tempo=Tempo.SLOW), sig, cfg)
    assert obs.shape == (1, obs_dim(3, N_BP)) and obs.dtype == torch.float32
    o = obs[0]
    assert float(o[col("val_acc")]) == pytest.approx(0.42)
    assert float(o[col("epoch_frac")]) == pytest.approx(6 / 25)
    assert float(o[col("slot1.stage_TRAINING")]) == 1.0 and float(o[col("slot0.stage_DORMANT")]) == 1.0
    assert float(o[col("slot1.blueprint_2")]) == 1.0 and float(o[col("slot1.blueprint_0")]) == 0.0
    assert float(o[col("slot1.tempo_2")]) == 1.0 and float(o[col("slot0.tempo_0")]) == 0.0
    assert float(o[col("slot1.g2_ready")]) == 1.0  # 3 epochs in TRAINING, +8 pts, ratio 0.5
    assert float(o[col("slot1.prunable")]) == 1.0 and float(o[col("slot0.prunable")]) == 0.0
    assert float(o[col("slot2.enabled")]) == 0.0
    assert float(o[col("slot1.param_frac")]) == pytest.approx(0.5)
    assert float(o[col("slot1.gain")]) == pytest.approx(0.8)  # +8 pts since TRAINING began (step 2)
    assert float(o[col("seed_utilization")]) == pytest.approx(1 / 3)
    assert float(o[col("plateau")]) == 0.0


def _with_seed_grads(sig: TensorDict, norm, vanishing, exploding) -> TensorDict:
    E, S = sig["slots"].batch_size
    f = lambda v: torch.as_tensor(v, dtype=torch.float32).expand(E, S).clone()
    sig["slots", "seed_grad_norm"] = f(norm)
    sig["slots", "seed_grad_vanishing"] = f(vanishing)
    sig["slots", "seed_grad_exploding"] = f(exploding)
    return sig


def test_seed_gradient_features_behind_the_switch():
    """Issue 47: ``lifecycle.seed_grad_features`` adds, per slot after ``grad_ratio``, the seed's
    gradient norm (log scale), the original's health score and the vanishing and exploding shares; off
    (the default) the layout is the old one. A slot without a seed reads 0."""
    on = LifecycleConfig(seed_grad_features=True)
    plain, wide = observation_layout(3, N_BP), observation_layout(3, N_BP, seed_grads=True)
    assert len(wide) == len(plain) + 3 * 4 == obs_dim(3, N_BP, seed_grads=True)
    assert wide.index("slot0.seed_grad_norm") == wide.index("slot0.grad_ratio") + 1
    added = [f"slot{k}.{f}" for k in range(3) for f in SEED_GRAD_FEATURES]
    assert [n for n in wide if n not in plain] == added
    slots, h = init_slots(1, [True, True, True]), init_history(1)
    sig = make_signals(1, 3, epoch=1, seed_params=[[0.0, 500.0, 0.0]])
    slots = record_signals(slots, sig, on)
    slots, _ = lifecycle_step(slots, make_action(1, Op.GERMINATE, 1, blueprint=2), sig, on)
    sig = _with_seed_grads(make_signals(1, 3, epoch=2, seed_params=[[0.0, 500.0, 0.0]]), 9.0, 0.25, 0.5)
    slots = record_signals(slots, sig, on)
    h = update_history(h, sig)
    o = _obs(sig, h, slots, on)[0]
    name = lambda f, k=1: wide.index(f"slot{k}.{f}")
    assert float(o[name("seed_grad_norm")]) == pytest.approx(math.log1p(9.0) / math.log1p(100.0))
    assert float(o[name("seed_grad_health")]) == pytest.approx(1 - 0.5 * 0.25 - 0.8 * 0.5)
    assert float(o[name("seed_grad_vanishing")]) == 0.25 and float(o[name("seed_grad_exploding")]) == 0.5
    assert all(float(o[name(f, 0)]) == 0.0 for f in SEED_GRAD_FEATURES), "no seed in slot 0"
    # off, the same signals give the old observation, column for column
    off = _obs(sig, h, slots, LifecycleConfig())[0]
    keep = [i for i, n in enumerate(wide) if n in plain]
    torch.testing.assert_close(off, o[keep])
    # NaN or huge gradients stay finite and in [0, 1]
    bad = _with_seed_grads(sig.clone(), float("nan"), float("nan"), float("inf"))
    x = _obs(bad, h, slots, on)[0][[name(f) for f in SEED_GRAD_FEATURES]]
    assert torch.isfinite(x).all() and (x >= 0).all() and (x <= 1).all()


def test_predicted_decrease_features_behind_the_switch():
    """Issue 91 item 5: ``lifecycle.grad_gain_features`` adds, per slot after the seed-gradient features,
    the slot's predicted first-order loss decrease (log scale) and its decrease per parameter over the
    env's largest; off (the default) the layout and values are the old ones. A disabled slot reads 0."""
    on = LifecycleConfig(grad_gain_features=True)
    assert on.grad_stats and LifecycleConfig(grad_init=True).grad_stats and not LifecycleConfig().grad_stats
    plain, wide = observation_layout(3, N_BP), observation_layout(3, N_BP, grad_gain=True)
    assert len(wide) == len(plain) + 3 * 2 == obs_dim(3, N_BP, **layout_options(on))
    assert wide.index("slot0.grad_gain") == wide.index("slot0.grad_ratio") + 1
    added = [f"slot{k}.{f}" for k in range(3) for f in GRAD_GAIN_FEATURES]
    assert [n for n in wide if n not in plain] == added
    both = observation_layout(3, N_BP, seed_grads=True, grad_gain=True)
    assert both.index("slot0.grad_gain") == both.index("slot0.seed_grad_exploding") + 1
    slots, h = init_slots(1, [True, True, False]), init_history(1)
    sig = make_signals(1, 3, epoch=1)
    sig["slots", "grad_gain"] = torch.tensor([[0.1, 0.3, 5.0]])
    sig["slots", "grad_gain_rms"] = torch.tensor([[0.01, 0.04, 0.9]])
    slots = record_signals(slots, sig, on)
    h = update_history(h, sig)
    o = _obs(sig, h, slots, on)[0]
    name = lambda f, k: wide.index(f"slot{k}.{f}")
    assert float(o[name("grad_gain", 0)]) == pytest.approx(math.log1p(1.0) / math.log1p(10.0))
    assert float(o[name("grad_gain", 1)]) == pytest.approx(math.log1p(3.0) / math.log1p(10.0))
    assert [float(o[name("grad_gain_share", k)]) for k in range(3)] == pytest.approx([0.25, 1.0, 0.0])
    assert float(o[name("grad_gain", 2)]) == 0.0, "slot 2 is disabled"
    off = _obs(sig, h, slots, LifecycleConfig())[0]
    torch.testing.assert_close(off, o[[i for i, n in enumerate(wide) if n in plain]])
    # NaN, infinite or all-zero gains stay finite and in [0, 1]
    sig["slots", "grad_gain"] = torch.tensor([[float("nan"), float("inf"), 1e9]])
    sig["slots", "grad_gain_rms"] = torch.zeros(1, 3)
    x = _obs(sig, h, slots, on)[0][[name(f, k) for f in GRAD_GAIN_FEATURES for k in range(3)]]
    assert torch.isfinite(x).all() and (x >= 0).all() and (x <= 1).all()


def test_prunable_feature_follows_the_prune_gate():
    """``prunable`` is PRUNE's legality: with ``prune_gate`` a blended seed that pays reads 0."""
    slots = init_slots(1, [True, True, True])
    slots["stage"] = torch.tensor([[int(Stage.HOLDING)] * 3])
    slots["age"] = torch.full((1, 3), 10)
    slots["alpha"] = torch.tensor([[1.0, 1.0, 0.0]])
    slots["contribution"] = torch.tensor([[4.0, 0.2, 0.0]])
    sig = make_signals(1, 3, epoch=10, val_acc=50.0)
    h = update_history(init_history(1), sig)
    prunable = lambda cfg: [float(_obs(sig, h, slots, cfg)[0, col(f"slot{k}.prunable")]) for k in range(3)]
    assert prunable(LifecycleConfig()) == [1.0, 1.0, 1.0]
    assert prunable(LifecycleConfig(prune_gate=True)) == [0.0, 1.0, 1.0]


# ----------------------------------------------------------------------------------------- property
_f = lambda: st.floats(allow_nan=False, allow_infinity=False, width=32)  # up to float32's max


@st.composite
def arbitrary_slots(draw, E=2, S=3):
    """Slot state with every field drawn independently (in-range stages, extreme floats): observe must
    not rely on the lifecycle's invariants to stay finite."""
    fields = {}
    for k, (dtype, _) in SLOT_FIELDS.items():
        if dtype == torch.bool:
            v = draw(st.lists(st.booleans(), min_size=E * S, max_size=E * S))
        elif k == "stage" or k == "prev_stage":
            v = draw(st.lists(st.sampled_from([int(s) for s in Stage]), min_size=E * S, max_size=E * S))
        elif dtype == torch.int64:
            v = draw(st.lists(st.integers(0, 10_000), min_size=E * S, max_size=E * S))
        else:
            v = draw(st.lists(_f(), min_size=E * S, max_size=E * S))
        fields[k] = torch.tensor(v, dtype=dtype).reshape(E, S)
    return TensorDict(fields, batch_size=[E, S])


@st.composite
def extreme_signals(draw, E=2, S=3):
    g = lambda: torch.tensor(draw(st.lists(_f(), min_size=E, max_size=E)))
    return TensorDict(
        {
            "epoch": torch.tensor(draw(st.lists(st.integers(-5, 10_000), min_size=E, max_size=E))),
            "val_acc": g(),
            "val_loss": g(),
            "train_acc": g(),
            "train_loss": g(),
            "host_params": g(),
            "slots": TensorDict(
                {
                    k: g().unsqueeze(-1).expand(E, S).clone()
                    for k in ("contribution", "grad_ratio", "seed_params")
                },
                batch_size=[E, S],
            ),
        },
        batch_size=[E],
    )


@given(
    slots=arbitrary_slots(),
    sigs=st.lists(extreme_signals(), min_size=1, max_size=3),
    max_epochs=st.integers(1, 300),
)
def test_observation_is_finite_and_bounded_for_extreme_signals(slots, sigs, max_epochs):
    h = init_history(2)
    for sig in sigs:
        h = update_history(h, sig)
        assert all(torch.isfinite(h[k].float()).all() for k in h.keys())
    obs = _obs(sigs[-1], h, slots, max_epochs=max_epochs)
    assert obs.shape == (2, obs_dim(3, N_BP))
    assert torch.isfinite(obs).all()
    assert obs.abs().max() <= 4.0, observation_layout(3, N_BP)[int(obs.abs().max(0).values.argmax())]


@given(data=st.data())
def test_observation_in_range_along_legal_play(data):
    """Along real trajectories every feature is in [-1, 1] (loss features: their log scale)."""
    h = init_history(2)
    names = observation_layout(3, N_BP)
    loss_cols = [i for i, n in enumerate(names) if "loss" in n and "delta" not in n]
    for pre, _, sig, _, _ in random_rollout(data, T=12):
        h = update_history(h, sig)
        obs = _obs(sig, h, pre)
        other = torch.ones(obs.shape[-1], dtype=torch.bool)
        other[loss_cols] = False
        assert (obs[:, other].abs() <= 1.0).all(), [names[i] for i in (obs.abs() > 1).any(0).nonzero()]
        assert (obs[:, loss_cols] >= 0).all() and (obs[:, loss_cols] <= 1.0).all()


def test_nan_and_inf_signals_still_give_a_finite_observation():
    sig = make_signals(2, 3, val_acc=float("nan"), val_loss=float("inf"), host_params=float("nan"))
    sig["slots", "contribution"][:] = float("-inf")
    h = update_history(init_history(2), sig)
    slots = record_signals(init_slots(2, [True] * 3), sig, LifecycleConfig())
    assert torch.isfinite(_obs(sig, h, slots)).all()


def test_observe_checks_shapes():
    sig = make_signals(2, 3)
    with pytest.raises(ValueError, match="slots"):
        _obs(sig, init_history(2), init_slots(3, [True] * 3))
    with pytest.raises(ValueError, match="history"):
        _obs(sig, init_history(1), init_slots(2, [True] * 3))
