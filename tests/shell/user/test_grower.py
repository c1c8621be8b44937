"""Growing the user's network in the user's own loop (esper.shell.user.Grower): the same lifecycle as an
environment's, the seeds' parameter groups joining and leaving the user's optimizer (its state for the
host untouched), a schedule they follow, mixed precision, the grown network saved and reloaded, and a
growth resumed from its state dict."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from esper.core.spec import Stage
from esper.shell.baselines.simple import GrowAllController
from esper.shell.common.checkpoint import save_checkpoint
from esper.shell.common.fields import to_dict, with_overrides
from esper.shell.config.presets import preset
from esper.shell.env.rollout import EpisodeRunner
from esper.shell.env.vecenv import VecEnv
from esper.shell.user import Grower, Slot, user_task
from tests.shell.host.test_user import X1, Net1d, _checkpoint, _data

#: Gates that always pass (G2, G3, G5): the lifecycle's path depends on the epochs alone.
OPEN = {"lifecycle.g2_min_gain": -100.0, "lifecycle.g2_min_grad_ratio": 0.0, "lifecycle.g2_min_epochs": 1,
        "lifecycle.g3_min_epochs": 1, "lifecycle.g5_min_contribution": -100.0}  # fmt: skip
PLAN = {"tail.1": "conv_light"}


def _net() -> Net1d:
    torch.manual_seed(0)
    return Net1d()


def _batches(n: int, seed: int, batch: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = _data(n, seed)
    return list(zip(x.split(batch), y.split(batch), strict=True))


def _train(g: Grower, batches, epochs: int, *, sched=None, scaler=None, amp=None) -> list[dict]:
    """The user's loop."""
    model, opt, log = g.model, g.optimizer, []
    for _ in range(epochs):
        model.train()
        for x, y in batches:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
                out = model(x)
                loss = F.cross_entropy(out.float(), y)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            g.after_backward(x, y, loss=loss, output=out)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
        if sched is not None:
            sched.step()
        log.append(g.on_epoch_end())
    return log


def test_a_plan_grows_in_the_users_loop_as_in_an_environment():
    """AdamW, a cosine schedule, a DataLoader: the seed's group joins the optimizer at germination (the
    host's state untouched), follows the host's learning rate, and the lifecycle's path (gates open) is
    the environment's, epoch for epoch; at the end the seed is permanent and the network reloads."""
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=8)
    train = DataLoader(TensorDataset(*_data(96, 0)), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0))  # fmt: skip
    g = Grower(model, opt, val=DataLoader(TensorDataset(*_data(64, 1)), batch_size=32), controller=PLAN,
               epochs=8, overrides=OPEN)  # fmt: skip
    assert g.model is model and g.epochs == 8 and g.host.slot_names == ("tail.2", "tail.1", "tail.0")
    host_params = list(model.parameters())
    first = _train(g, train, 1, sched=sched)[0]
    assert [(e["slot"], e["kind"], e["blueprint"]) for e in first["events"]] == [("tail.1", "germinated",
                                                                                 "conv_light")]  # fmt: skip
    seed = g.host.slots[1].seed_parameters()
    assert len(opt.param_groups) == 2 and opt.param_groups[1]["params"] == seed
    assert all(opt.state[p]["step"] == 3 for p in host_params)  # AdamW's host state carried on
    log = [first, *_train(g, train, 7, sched=sched)]
    assert opt.param_groups[1]["lr"] == opt.param_groups[0]["lr"] < 0.01  # the seed rides the schedule
    assert all(opt.state[p]["step"] == 24 for p in host_params)
    assert all(0 < opt.state[p]["step"] < 24 for p in seed)  # stepped since germination
    ours = [(e["epoch"], e["slot"], e["kind"]) for r in log for e in r["events"]]
    # the same plan, gates and epochs in an environment (VecEnv, env by env)
    cfg = with_overrides(preset("default"), {**OPEN, "lifecycle.max_epochs": 8, "env.n_envs": 1,
                                             "env.host_step": "per_env", "env.device": "cpu",
                                             "ppo.n_minibatches": 1})  # fmt: skip
    task = user_task(Net1d, train=_data(96, 0), val=_data(64, 1), test=_data(32, 2), batch_size=32)
    env = VecEnv(cfg.env, cfg.lifecycle, cfg.governor, seed=0, task=task, reward=cfg.reward)
    ctl = GrowAllController({1: env.blueprint_names.index("conv_light")}, cfg.lifecycle)
    theirs = [(e["epoch"], env.slot_names[e["slot"]], e["kind"])
              for e in EpisodeRunner(env, ctl).run(0, host_seeds=[0]).lifecycle]  # fmt: skip
    assert ours == theirs and [k for _, _, k in ours] == ["germinated", "advanced", "advanced", "fossilized"]
    assert log[-1]["finished"] and g.finished and g.grown == {"tail.1": "conv_light"}
    model.eval()
    x = _data(16, 5)[0]
    fresh = _net().eval()
    fresh.load_state_dict(model.state_dict())
    assert torch.equal(fresh(x), model(x)) and fresh.tail[1].stage == Stage.FOSSILIZED


def test_a_pruned_seed_leaves_the_optimizer_with_its_state():
    """G5 never passes: the HOLDING timeout prunes the seed; its group and state leave the optimizer, the
    host's stay; the next germination adds a fresh group."""
    model = _net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    never = {**OPEN, "lifecycle.g5_min_contribution": 1000.0, "lifecycle.holding_timeout": 1,
             "lifecycle.embargo_epochs": 1}  # fmt: skip
    g = Grower(model, opt, val=_data(32, 1), controller=PLAN, epochs=12, overrides=never)
    log = _train(g, _batches(64, 0), 12)
    kinds = [e["kind"] for r in log for e in r["events"]]
    assert kinds.count("germinated") >= 2 and "timeout_pruned" in kinds and "removed" in kinds
    live = [p for s in g.host.slots for p in s.seed_parameters()]
    assert len(opt.param_groups) == 1 + bool(live)
    assert set(opt.state) == set(model.parameters())  # no state of a removed seed is left
    assert all(opt.state[p]["step"] == 24 for p in g.host.host_parameters())


def test_the_grower_reads_attach_at_its_seeds_read_the_live_activation_from_blending_on():
    """``lifecycle.attach_at blending`` in the owner's loop: the model's slots read the live activation
    from BLENDING on, as a run's hosts do (the default keeps the reference's isolation)."""
    for attach_at, blending_live in (("fossilized", False), ("blending", True)):
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = Grower(model, opt, val=_data(32, 1), controller=PLAN, epochs=8,
                   overrides={**OPEN, "lifecycle.attach_at": attach_at})  # fmt: skip
        assert all((Stage.BLENDING not in s.detached_stages) == blending_live for s in g.host.slots)


def test_mixed_precision_incubating_seeds_learn_through_the_scaler():
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    g = Grower(model, opt, val=_data(32, 1), controller=PLAN, epochs=3, scaler=scaler,
               autocast_dtype=torch.bfloat16)  # fmt: skip
    _train(g, _batches(64, 0), 1, scaler=scaler, amp=torch.bfloat16)
    slot = g.host.slots[1]
    before = [p.detach().clone() for p in slot.seed_parameters()]
    log = _train(g, _batches(64, 0), 1, scaler=scaler, amp=torch.bfloat16)
    assert slot.stage == Stage.TRAINING and log[0]["events"] == []  # incubating: the default gates wait
    moved = [not torch.equal(b, p) for b, p in zip(before, slot.seed_parameters(), strict=True)]
    assert all(moved) and all(torch.isfinite(p).all() for p in slot.seed_parameters())


def test_a_growth_resumes_from_its_state_dict(tmp_path):
    """A learned controller (set policy, sampled): 3 epochs, a checkpoint of the network, the optimizer
    and the Grower (weights-only loading), then 3 more on fresh objects, gives what 6 epochs in one go
    gives: the same events and the same network."""
    run_cfg = preset("smoke", {"env.task": "longrange", "ppo.policy": "set", "ppo.germinate_bias": 3})
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(to_dict(run_cfg)))
    save_checkpoint(run / "checkpoint.pt", _checkpoint(run_cfg, run_cfg.env.build_task()))
    train, val = _batches(64, 0), _data(32, 1)

    def fresh() -> Grower:
        model = _net()
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        return Grower(model, opt, val=val, controller=run, epochs=6)

    whole = fresh()
    log = _train(whole, train, 6)
    first = fresh()
    head = _train(first, train, 3)
    torch.save({"model": first.model.state_dict(), "opt": first.optimizer.state_dict(),
                "grower": first.state_dict()}, tmp_path / "ckpt.pt")  # fmt: skip
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    second = fresh()
    second.load_state_dict(ckpt["grower"])
    second.model.load_state_dict(ckpt["model"])
    second.optimizer.load_state_dict(ckpt["opt"])
    tail = _train(second, train, 3)
    events = lambda rs: [(e["epoch"], e["slot"], e["kind"], e["blueprint"]) for r in rs for e in r["events"]]
    assert events(head + tail) == events(log) and events(log), "the controller grew something"
    assert [r["val_acc"] for r in head + tail] == [r["val_acc"] for r in log]
    for a, b in zip(whole.model.state_dict().values(), second.model.state_dict().values(), strict=True):
        assert a == b if isinstance(a, dict) else torch.equal(a, b)


def test_grower_errors_are_one_line():
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for kwargs, match in [
        ({"controller": "ppo"}, "is a run's controller: pass controller=RUN_DIR"),
        ({"controller": "nope"}, "unknown controller"),
        ({"controller": "heuristic_tuned"}, "searches on fresh hosts first"),
        ({"controller": {"tail.9": "conv_light"}}, "is not SLOT=BLUEPRINT"),
    ]:
        with pytest.raises(ValueError, match=match) as err:
            Grower(_net(), opt, val=_data(8, 1), **kwargs)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="an iterator is read once"):
        Grower(model, opt, val=iter(_batches(8, 1)))
    grown = torch.nn.Sequential(torch.nn.Conv1d(1, 8, 1), Slot(8))
    grown[1].set_extra_state({"blueprint": "norm", "family": "cnn1d", "style": 0, "stage": 5, "alpha": 1.0})
    with pytest.raises(ValueError, match=r"slot\(s\) 1 \(norm\) hold seeds already"):
        Grower(grown, torch.optim.SGD(grown.parameters(), lr=0.1), val=(X1, torch.zeros(4, 8, 16)))
