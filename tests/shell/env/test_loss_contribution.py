"""Issue 104, item 3: the counterfactual's validation loss (``loss_contribution``: the loss with the seed at
alpha 0 minus the loss as blended), measured in the same pass as the accuracy contribution, on both host
paths (the per-env reference and the batched step) and through a rollback's re-validation, against a hand
computation with the slot's ``force_alpha(0)``; and carried into the env's signals and slot state."""

from __future__ import annotations

import pytest
import torch

from esper.core.lifecycle import LifecycleConfig
from esper.core.spec import ALPHA_TARGETS, Op, Stage, Style, Tempo
from esper.shell.env.config import EnvConfig
from esper.shell.env.governor import GovernorConfig
from esper.shell.env.vecenv import VecEnv
from esper.shell.host.bank import REVALIDATED
from esper.shell.host.hosts import Host
from tests.core.test_lifecycle import make_action
from tests.shell.env.test_batched import FAMILIES, _assert_same_measure, _banks, _both

#: (env, slot, blueprint, stage, alpha) of each seed: two that blend (measured), one incubating (not).
SEEDS = (
    (0, 1, "conv_light", Stage.HOLDING, 1.0),
    (1, 0, "conv_heavy", Stage.BLENDING, 0.6),
    (1, 2, "conv_light", Stage.TRAINING, 0.0),
)


def _hand_loss(host: Host, batches, slot: int | None = None) -> float:
    """The host's mean validation loss over ``batches`` (eval mode), with ``slot`` forced to alpha 0."""
    host.eval()
    total, items = 0.0, 0
    try:
        with torch.inference_mode():
            for batch in batches:
                if slot is None:
                    loss, _, n = host.loss_and_correct(batch)
                else:
                    with host.slot(slot).force_alpha(0.0):
                        loss, _, n = host.loss_and_correct(batch)
                total += float(loss) * n
                items += n
    finally:
        host.train()
    return total / items


def _grown_banks(family: str):
    ref, bat, names = _banks(family, 2)
    for e, s, bp, stage, alpha in SEEDS:
        _both(ref, bat, "germinate", e, s, names.index(bp), Style.LINEAR_ADD, 1)
        for bank in (ref, bat):
            bank.set_slot(e, s, alpha=alpha, stage=int(stage))
            with torch.no_grad():  # a seed far from its near-zero start, so it moves the loss
                for p in bank.host(e).seed_parameters(s):
                    p.mul_(40.0)
    return ref, bat


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_issue104_both_host_paths_measure_the_loss_contribution_by_hand(family):
    """After an epoch of training, each blended seed's ``loss_contribution`` is the validation loss with
    its slot forced to alpha 0 minus the loss as it is, on the per-env and on the batched path alike (and
    the two paths agree); the incubating seed and the empty slots read 0."""
    torch.set_num_threads(1)
    ref, bat = _grown_banks(family)
    got = {"per_env": ref.measure(1.0), "batched": bat.measure(1.0)}
    _assert_same_measure(got["per_env"], got["batched"])
    for path, bank in (("per_env", ref), ("batched", bat)):
        out = got[path]["loss_contribution"]
        want = torch.zeros_like(out)
        for e, s, _, stage, _ in SEEDS:
            val = bank.loaders[e].val
            if stage in (Stage.HOLDING, Stage.BLENDING):
                want[e, s] = _hand_loss(bank.host(e), val, s) - _hand_loss(bank.host(e), val)
            torch.testing.assert_close(got[path]["val_loss"][e], torch.tensor(_hand_loss(bank.host(e), val)),
                                       atol=1e-5, rtol=1e-5)  # fmt: skip
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-4, msg=lambda m, p=path: f"{p}: {m}")
        blended = [(e, s) for e, s, _, st, _ in SEEDS if st != Stage.TRAINING]
        assert all(abs(float(out[e, s])) > 1e-3 for e, s in blended), out  # the seeds do move the loss
    # the re-validation a rollback runs (here without one: env 1 keeps its seeds) reads it as the epoch did
    again = {"per_env": ref.revalidate([1]), "batched": bat.revalidate([1])}
    assert tuple(again["per_env"]) == REVALIDATED
    _assert_same_measure(again["per_env"], again["batched"])
    want = got["per_env"]["loss_contribution"][1]
    torch.testing.assert_close(again["per_env"]["loss_contribution"][0], want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("host_step", ["per_env", "batched"])
def test_issue104_the_env_records_the_loss_contribution_into_the_slot_state(host_step):
    """The env's signals carry the hosts' ``loss_contribution`` and ``record_signals`` copies it into the
    slot state: a seed germinated without incubation blends at once, and from the next measurement its
    loss contribution is there (non-zero), 0 on the empty slots."""
    torch.set_num_threads(1)
    cfg = EnvConfig(n_envs=2, workers=1, host_step=host_step, **FAMILIES["cnn1d"])
    lc = LifecycleConfig(max_epochs=4, incubate=False, auto_advance=True)
    env = VecEnv(cfg, lc, GovernorConfig(), seed=0)
    try:
        env.reset(0)
        grow = make_action(2, Op.GERMINATE, 1, blueprint=env.blueprint_names.index("conv_heavy"),
                           tempo=Tempo.FAST, alpha_target=ALPHA_TARGETS.index(1.0))  # fmt: skip
        env.step(grow)
        tr = env.step(make_action(2, Op.WAIT, 0))
        sig = tr.next.measurement["slots", "loss_contribution"]
        assert (tr.slots["alpha"][:, 1] > 0).all()
        assert sig[:, 1].ne(0).all() and sig[:, [0, 2]].eq(0).all(), sig
        assert torch.equal(env.slots["loss_contribution"], sig)
    finally:
        env.close()
