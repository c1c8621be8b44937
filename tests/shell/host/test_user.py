"""The user's own network as a host (esper.shell.user): slots declared in any module, the parameter
partition when the network owns them, germination of every cnn1d blueprint into a user slot, the
one-line errors (no slots, a slot of the wrong width, a run whose controller cannot act on the host),
and growth on fresh hosts."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from esper.core.spec import Stage, Style
from esper.shell.agent.agent import build_agent
from esper.shell.common.checkpoint import save_checkpoint
from esper.shell.common.fields import to_dict
from esper.shell.config.presets import preset
from esper.shell.host.bank import snapshot_state
from esper.shell.host.blueprints import BLUEPRINTS
from esper.shell.host.model import EnvModel
from esper.shell.user import Slot, UserHost, check_controller_fits, grow, grown_model, user_task


def _block(c_in: int, c_out: int, pool: int = 1) -> nn.Sequential:
    layers = [nn.Conv1d(c_in, c_out, 1, bias=False), nn.BatchNorm1d(c_out), nn.ReLU()]
    return nn.Sequential(*layers, *([nn.MaxPool1d(pool)] if pool > 1 else []))


class Net1d(nn.Module):
    """A user's 1-D CNN: ``len(widths)`` blocks, a slot after each (registered in reverse, to check
    that the host orders them as the forward reaches them)."""

    def __init__(self, widths=(8, 8, 8), slot_widths=None, n_classes: int = 4):
        super().__init__()
        slot_widths = slot_widths or widths
        self.tail = nn.ModuleList(Slot(w) for w in reversed(slot_widths))  # registered last-first
        self.blocks = nn.ModuleList(_block(i, o, 2) for i, o in zip((1, *widths[:-1]), widths))
        self.head = nn.Linear(widths[-1], n_classes)

    def forward(self, x):
        n = len(self.blocks)
        for i, block in enumerate(self.blocks):
            x = self.tail[n - 1 - i](block(x))
        return self.head(x.mean(-1))


class Net2d(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), Slot(6), nn.MaxPool2d(2))
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.body(x).mean((2, 3)))


class Residual(nn.Module):
    """A residual-stream model ``[N, L, D]``: its slot is of family transformer (stated)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.embed = nn.Embedding(16, d)
        self.mix = nn.Linear(d, d)
        self.grow = Slot(d, name="stream")
        self.out = nn.Linear(d, 16)

    def forward(self, idx):
        return self.out(self.grow(self.embed(idx) + self.mix(self.embed(idx))))


X1 = torch.randn(4, 1, 16)


def _host(**kwargs) -> UserHost:
    torch.manual_seed(0)
    return UserHost(Net1d(**kwargs), example_input=X1)


def _data(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 16, generator=g), torch.randint(4, (n,), generator=g)


# ------------------------------------------------------------------------------------------ the adapter
def test_slots_in_forward_order_named_by_path_family_inferred():
    host = _host()
    assert host.family == "cnn1d" and host.n_slots == 3
    assert host.slot_names == ("tail.2", "tail.1", "tail.0")  # the order the forward reaches them
    assert host.blueprint_names == BLUEPRINTS["cnn1d"]
    assert host.output_shape == (4,)
    torch.manual_seed(0)
    assert UserHost(Net2d(), example_input=torch.randn(2, 1, 8, 8)).family == "cnn"
    stream = UserHost(Residual(), example_input=torch.randint(16, (2, 5)), family="transformer")
    assert stream.family == "transformer" and stream.slot_names == ("stream",)


def test_parameter_partition_no_parameter_twice_host_parameters_exclude_seeds_and_gates():
    torch.manual_seed(0)
    plain = sum(p.numel() for p in Net1d().parameters())  # the user's own parameters (slots have none)
    host = _host()
    for s in range(host.n_slots):  # every slot holds a seed, each with a gate
        host.germinate(s, BLUEPRINTS["cnn1d"].index("conv_heavy"), Style.GATED_GATE)
    named = list(host.named_parameters(remove_duplicate=False))
    assert len(named) == len({id(p) for _, p in named}), "a parameter is registered twice"
    seeds = {id(p) for s in range(host.n_slots) for p in host.seed_parameters(s)}
    gates = {id(p) for s in host.slots for p in s.gate.parameters()}
    own = {id(p) for p in host.host_parameters()}
    assert gates and gates <= seeds and not own & seeds
    assert own | seeds == {id(p) for _, p in named}
    assert sum(p.numel() for p in host.host_parameters()) == plain
    # every seed's state lives under slots.<i>. (what a snapshot and the parameter counts read)
    keys = host.state_dict().keys()
    assert all(k.startswith("slots.") for k in keys if ".seed." in k or ".gate." in k)
    assert not any(k.startswith("slots.") for k in snapshot_state(host))  # nothing fossilized yet
    model = EnvModel(host)
    assert {id(p) for g in model.host_opt.param_groups for p in g["params"]} == own


def test_host_trains_and_moves_with_its_slots():
    host = _host()
    model = EnvModel(host, host_lr=0.05, seed_lr=0.05)
    model.germinate(0, BLUEPRINTS["cnn1d"].index("conv_light"), Style.LINEAR_ADD)
    host.set_slot(0, alpha=1.0, stage=Stage.BLENDING)
    x, y = _data(64, 1)
    before = host.slot(0).seed[0].weight.detach().clone()
    out = model.train_epoch([(x, y)])
    assert torch.isfinite(out["loss"]) and 0 <= float(out["acc"]) <= 100
    assert not torch.equal(before, host.slot(0).seed[0].weight)  # the seed trained
    loss, acc, contribution = model.counterfactual_validation([(x, y)])
    assert torch.isfinite(loss) and 0 <= float(acc) <= 100 and contribution.shape == (3,)
    host.to(torch.float64)  # the network's reference to the slot follows the host's slot
    assert host.model.tail[2](torch.randn(2, 8, 8, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("blueprint", BLUEPRINTS["cnn1d"])
def test_each_cnn1d_blueprint_germinates_into_a_user_slot_and_changes_the_output_once_blended(blueprint):
    host = _host()
    host.eval()
    x = torch.randn(5, 1, 16)
    with torch.no_grad():
        plain = host(x)
        params = host.germinate(1, BLUEPRINTS["cnn1d"].index(blueprint), Style.LINEAR_ADD)
        assert host.slot(1).blueprint == blueprint and host.slot(1).stage == Stage.GERMINATED
        torch.testing.assert_close(host(x), plain, rtol=0, atol=0)  # incubating: the host as before
        for p in params:  # a trained seed (a fresh one starts at or near zero)
            p.copy_(torch.randn_like(p) * 0.5)
        host.set_slot(1, alpha=1.0, stage=Stage.BLENDING)
        blended = host(x)
        with host.counterfactual(1):
            torch.testing.assert_close(host(x), plain, rtol=0, atol=0)
    if blueprint == "noop":
        torch.testing.assert_close(blended, plain)
    else:
        assert not torch.allclose(blended, plain, atol=1e-4), f"{blueprint} did not change the output"


def test_slot_outside_a_host_is_the_identity_and_checks_its_width():
    slot = Slot(8)
    h = torch.randn(2, 8, 5)
    assert slot(h) is h
    with pytest.raises(ValueError, match=r"width 8 but receives 3 channels .*make it Slot\(3\)"):
        slot(torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match="width must be an int >= 1"):
        Slot(0)


# ---------------------------------------------------------------------------------------------- errors
def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def test_error_model_without_slots():
    with pytest.raises(ValueError, match=r"Sequential has no seed slots; place esper.shell.user.Slot") as err:
        UserHost(nn.Sequential(nn.Conv1d(1, 4, 1), nn.Flatten()), example_input=X1)
    _one_line(err)
    with pytest.raises(ValueError, match="no seed slots"):
        user_task(lambda: nn.Sequential(nn.Conv1d(1, 4, 1)), train=_data(8, 0), val=_data(8, 1),
                  test=_data(8, 2))  # fmt: skip


def test_error_slot_width_does_not_match_the_activation():
    # at wrap time, from the example input (and so when the task is built)
    with pytest.raises(ValueError, match=r"slot 'tail.1' has width 5 but receives 8 channels") as err:
        _host(slot_widths=(8, 5, 8))
    assert "make it Slot(8)" in _one_line(err)
    with pytest.raises(ValueError, match="has width 5 but receives 8 channels"):
        user_task(lambda: Net1d(slot_widths=(8, 5, 8)), train=_data(8, 0), val=_data(8, 1), test=_data(8, 2))
    # without an example input: at the slot's first forward
    host = UserHost(Net1d(slot_widths=(8, 8, 6)), family="cnn1d")
    with pytest.raises(ValueError, match=r"slot 'tail.0' has width 6 but receives 8 channels"):
        host(X1)


def test_error_slot_never_reached_mixed_families_missing_family_wrapped_twice():
    class Unused(Net1d):
        def __init__(self):
            super().__init__()
            self.spare = Slot(8)

    with pytest.raises(ValueError, match=r"slot\(s\) \['spare'\] never ran in the forward"):
        UserHost(Unused(), example_input=X1)
    with pytest.raises(ValueError, match="pass example_input"):
        UserHost(Net1d())
    with pytest.raises(ValueError, match="state different families"):
        UserHost(nn.Sequential(Slot(1, family="cnn"), Slot(1, family="cnn1d")), example_input=X1)
    net = Net1d()
    UserHost(net, example_input=X1)
    with pytest.raises(ValueError, match="wrapped by a host already; build one per host"):
        UserHost(net, example_input=X1)


def _checkpoint(run_cfg, task) -> dict:
    """A checkpoint (its ``agent`` entry) of an untrained controller for ``task``'s host."""
    host = task.make_host()
    names = host.blueprint_names
    from esper.core.observation import obs_dim
    from esper.core.spec import ActionSpec

    spec = ActionSpec(host.n_slots, len(names), (names.index("noop"),))
    raw = obs_dim(host.n_slots, len(names), seed_grads=run_cfg.lifecycle.seed_grad_features)
    agent = build_agent(run_cfg.ppo, spec, device="cpu", germination_cost=host.germination_cost(),
                        raw_obs_dim=raw)  # fmt: skip
    return {"agent": agent.state_dict()}


def test_error_run_whose_controller_cannot_act_on_the_host():
    # the flat policy (a cnn1d host with three slots, data in 0.2 s): its shapes are one host's
    run_cfg = preset("smoke", {"env.task": "longrange", "ppo.policy": "flat"})
    checkpoint = _checkpoint(run_cfg, run_cfg.env.build_task())
    splits = {"train": _data(8, 0), "val": _data(8, 1), "test": _data(8, 2)}
    check_controller_fits(run_cfg, checkpoint, user_task(Net1d, **splits))  # three cnn1d slots: it fits
    with pytest.raises(ValueError, match=r"slots: the run's host has 3 \(b0, b1, b2\), this one 2") as err:
        check_controller_fits(run_cfg, checkpoint, user_task(lambda: Net1d((8, 8)), **splits), run="run R")
    msg = _one_line(err)
    assert msg.startswith("run R: its controller cannot act on this host") and "observation length" in msg
    assert "give the model 3 slots of family cnn1d" in msg
    images = {k: (torch.randn(8, 1, 8, 8), y) for k, (_, y) in splits.items()}
    three_2d = lambda: nn.Sequential(Net2d().body, Slot(6), Slot(6), nn.Flatten(), nn.LazyLinear(3))
    with pytest.raises(ValueError, match=r"family: the run's host is cnn1d, this one cnn") as err:
        check_controller_fits(run_cfg, checkpoint, user_task(three_2d, **images))
    _one_line(err)
    # same sizes, but a checkpoint of another network (here: other hidden sizes) does not load
    other = _checkpoint(
        preset("smoke", {"env.task": "longrange", "ppo.policy": "flat", "ppo.hidden": 8}),
        run_cfg.env.build_task(),
    )
    with pytest.raises(ValueError, match="its controller does not load for this host") as err:
        check_controller_fits(run_cfg, other, user_task(Net1d, **splits))
    _one_line(err)


def test_a_set_policy_run_acts_on_user_hosts_of_any_slots_and_family(tmp_path):
    """``ppo.policy set``: the controller of a run on the 3-slot MNIST-1D host fits a user network with 2
    ``cnn1d`` slots and a 2-D one (another family and catalogue); ``grow`` runs it on the 2-slot one; a
    checkpoint of another ``ppo.policy`` still does not load, in one line."""
    run_cfg = preset("smoke", {"env.task": "longrange", "ppo.policy": "set", "ppo.germinate_bias": 3})
    checkpoint = _checkpoint(run_cfg, run_cfg.env.build_task())
    splits = {"train": _data(64, 0), "val": _data(32, 1), "test": _data(32, 2)}
    two = user_task(lambda: Net1d((8, 8)), batch_size=32, **splits)
    check_controller_fits(run_cfg, checkpoint, two)
    images = {k: (torch.randn(8, 1, 8, 8), y[:8]) for k, (_, y) in splits.items()}
    check_controller_fits(run_cfg, checkpoint, user_task(Net2d, **images))  # one cnn slot
    flat_cfg = preset("smoke", {"env.task": "longrange", "ppo.policy": "flat"})
    flat = _checkpoint(flat_cfg, run_cfg.env.build_task())
    with pytest.raises(ValueError, match="its controller does not load for this host") as err:
        check_controller_fits(run_cfg, flat, two)
    _one_line(err)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(to_dict(run_cfg)))
    save_checkpoint(run_dir / "checkpoint.pt", checkpoint)
    out = grow(two, ("ppo_greedy", "ppo"), run_dir=run_dir, episodes=2, epochs=3, n_envs=2)
    for records in out.values():
        assert len(records) == 2 and all(0 <= g["slot"] < 2 for r in records for g in r["germinations"])
    assert any(r["germinations"] for r in out["ppo"]), "it acted on the user's slots"


# -------------------------------------------------------------------------------------------- growing
def test_grow_static_and_a_placement_on_the_same_fresh_hosts():
    task = user_task(Net1d, train=_data(96, 0), val=_data(32, 1), test=_data(32, 2), batch_size=32)
    assert (task.family, task.input_shape, task.n_classes) == ("cnn1d", (1, 16), 4)
    out = grow(task, ("static", "grow:tail.1=conv_heavy"), episodes=2, epochs=3, n_envs=2)
    static, placed = out["static"], out["grow:tail.1=conv_heavy"]
    assert [r["host_seed"] for r in static] == [r["host_seed"] for r in placed]
    assert all(r["params_added"] == 0 and r["grown"] == "" and not r["germinations"] for r in static)
    # noise data: the seed never passes its gate into blending, but it was built where the plan says
    built = [[(g["slot"], g["blueprint"]) for g in r["germinations"]] for r in placed]
    assert built == [[(1, "conv_heavy")]] * 2
    assert (
        static[0]["host_params"]
        == placed[0]["host_params"]
        == sum(p.numel() for p in task.make_host().host_parameters())
    )
    with pytest.raises(ValueError, match="ppo is a run's trained controller: pass run_dir"):
        grow(task, ("ppo",), episodes=1)


# -------------------------------------------------------------------------------------- the grown model
def _top1(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(-1) == y).float().mean() * 100)


def test_grown_model_is_the_hosts_forward_saved_and_reloaded_into_a_fresh_network(tmp_path):
    """Every way a slot can end: blended at alpha 0.6 (a gate, LINEAR_MULTIPLY), fossilized at 1, still
    incubating (dropped), pruned and ramping down at 0.3 (kept at 0.3): the grown network's outputs are
    the host's; saved as a state dict, it loads into a fresh ``Net1d`` (on weights-only loading) and
    gives them again; the host is left as it was."""
    host = _host(widths=(8, 8, 8, 8))
    names = BLUEPRINTS["cnn1d"]
    ends = [("conv_light", Style.GATED_GATE, Stage.BLENDING, 0.6), ("depthwise", Style.LINEAR_ADD,
            Stage.FOSSILIZED, 1.0), ("conv_heavy", Style.LINEAR_ADD, Stage.TRAINING, 0.0),
            ("attention", Style.LINEAR_MULTIPLY, Stage.PRUNED, 0.3)]  # fmt: skip
    for s, (bp, style, stage, alpha) in enumerate(ends):
        host.germinate(s, names.index(bp), style)
        with torch.no_grad():  # seeds far from their gentle init, so each one shows in the output
            for p in host.seed_parameters(s):
                p.add_(torch.randn_like(p) * 0.5)
        host.set_slot(s, alpha=alpha, stage=stage)
    x = torch.randn(16, 1, 16)
    host.eval()
    want = host(x)
    net = grown_model(host).eval()
    assert type(net) is Net1d and not any(type(m).__name__ == "_SlotRef" for m in net.modules())
    assert torch.equal(net(x), want)
    kept = {path: (s.blueprint, s.stage, s.alpha) for path, s in net.named_modules() if isinstance(s, Slot)}
    assert kept == {
        "tail.3": ("conv_light", Stage.FOSSILIZED, 0.6), "tail.2": ("depthwise", Stage.FOSSILIZED, 1.0),
        "tail.1": (None, Stage.DORMANT, 0.0), "tail.0": ("attention", Stage.FOSSILIZED, 0.3),
    }  # fmt: skip
    assert [s.stage for s in host.slots] == [e[2] for e in ends] and torch.equal(host(x), want)
    torch.save(net.state_dict(), tmp_path / "grown.pt")
    fresh = Net1d(widths=(8, 8, 8, 8)).eval()
    assert not torch.equal(fresh(x), want)
    fresh.load_state_dict(torch.load(tmp_path / "grown.pt", weights_only=True))
    assert torch.equal(fresh(x), want)
    n = lambda m: sum(p.numel() for p in m.parameters())
    assert (
        n(fresh)
        == n(net)
        == n(Net1d(widths=(8, 8, 8, 8))) + sum(n(s) for s in net.modules() if isinstance(s, Slot))
    )


def test_grow_keep_models_returns_each_hosts_grown_network():
    """A plan that fossilizes its seed (gates opened by the overrides): the returned network is the
    final host's, with the seed composed at alpha 1 (its test accuracy and loss are the record's)."""
    train, val, test = _data(96, 0), _data(32, 1), _data(48, 2)
    task = user_task(Net1d, train=train, val=val, test=test, batch_size=32)
    gates = {"lifecycle.g2_min_gain": -100.0, "lifecycle.g2_min_grad_ratio": 0.0,
             "lifecycle.g2_min_epochs": 1, "lifecycle.g3_min_epochs": 1,
             "lifecycle.g5_min_contribution": -100.0}  # fmt: skip
    out = grow(task, ("static", "grow:tail.1=conv_light"), episodes=2, epochs=8, n_envs=2, overrides=gates,
               keep_models=True)  # fmt: skip
    for name, records in out.items():
        for r in records:
            net = r["model"].eval()
            assert _top1(net, *test) == pytest.approx(r["final_test_acc"], abs=1e-4), name
            slots = {p: s for p, s in net.named_modules() if isinstance(s, Slot)}
            if name == "static":
                assert r["grown"] == "" and not any(s.occupied for s in slots.values())
            else:
                assert r["grown"] == "tail.1=conv_light" and r["n_fossilized"] == 1
                assert (slots["tail.1"].stage, slots["tail.1"].alpha) == (Stage.FOSSILIZED, 1.0)


# ---------------------------------------------------------------------------------- flat features: mlp
class MLP(nn.Module):
    """A user's MLP on flat features: two hidden layers of 16, a slot on each (``[N, 16]``)."""

    def __init__(self, d_in: int = 6, hidden: int = 16, n_classes: int = 3):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, hidden), nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, n_classes)
        self.grow1, self.grow2 = Slot(hidden), Slot(hidden)

    def forward(self, x):
        return self.out(self.grow2(torch.relu(self.fc2(self.grow1(torch.relu(self.fc1(x)))))))


def _tabular(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] * x[:, 1] > 0).long() + (x[:, 2] > 1).long()


def test_an_mlp_host_with_flat_slots_grows_a_widen_seed_in_an_episode():
    """Slots on ``[N, D]`` activations are of family mlp; ``widen`` (D/4 hidden units with zero outgoing
    weights) leaves the function unchanged at germination whatever its alpha, and a plan grows it through
    the lifecycle to a fossilized seed in an episode."""
    x = _tabular(8, 9)[0]
    torch.manual_seed(0)
    host = UserHost(MLP(), example_input=x[:2])
    assert (host.family, host.slot_names, host.blueprint_names) == (
        "mlp",
        ("grow1", "grow2"),
        ("noop", "norm", "lora", "widen", "mlp_small", "mlp"),
    )
    before = host(x)
    for style in (Style.LINEAR_ADD, Style.GATED_GATE):
        params = host.germinate(0, host.blueprint_names.index("widen"), style)
        assert sum(p.numel() for p in params if p.dim() and p.shape[0] == 4) > 0  # 16 // 4 new units
        host.set_slot(0, alpha=1.0, stage=Stage.BLENDING)
        assert torch.equal(host(x), before)
        host.set_slot(0, alpha=0.0, stage=Stage.PRUNED)
        host.remove_seed(0)
        host.set_slot(0, alpha=0.0, stage=Stage.DORMANT)
    task = user_task(MLP, train=_tabular(128, 0), val=_tabular(64, 1), test=_tabular(64, 2), batch_size=32)
    assert (task.family, task.n_classes) == ("mlp", 3)
    gates = {"lifecycle.g2_min_gain": -100.0, "lifecycle.g2_min_grad_ratio": 0.0,
             "lifecycle.g2_min_epochs": 1, "lifecycle.g3_min_epochs": 1,
             "lifecycle.g5_min_contribution": -100.0, "env.host_lr": 0.05}  # fmt: skip
    out = grow(task, ("static", "grow:grow1=widen", "heuristic"), episodes=1, epochs=8, n_envs=1,
               overrides=gates, keep_models=True)  # fmt: skip
    (widened,) = out["grow:grow1=widen"]
    assert (widened["grown"], widened["n_fossilized"], widened["params_added"]) == ("grow1=widen", 1, 148)
    net = widened["model"].eval()
    assert net.grow1.blueprint == "widen" and _top1(net, *_tabular(64, 2)) == pytest.approx(
        widened["final_test_acc"], abs=1e-4
    )
    assert all(0 <= r["final_test_acc"] <= 100 for r in out["static"] + out["heuristic"])
