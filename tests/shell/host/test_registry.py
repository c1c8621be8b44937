"""Blueprints of the user's own (esper.shell.host.registry): placed in their family's registry by size,
built, counted by the masks' parameter cap and described for the set policy like the built-in ones; a
user-registered blueprint is germinated by a fixed plan and by a learned (set-policy) controller, and a
flat-policy controller trained on the built-in catalogue is refused."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from esper.core.spec import Style
from esper.shell.common.checkpoint import save_checkpoint
from esper.shell.common.fields import to_dict
from esper.shell.config.presets import preset
from esper.shell.host.blueprints import BLUEPRINT_TRAITS, BLUEPRINTS, BUILTIN_BLUEPRINTS, build_blueprint
from esper.shell.host.descriptors import DESCRIPTOR_FEATURES, describe_host
from esper.shell.host.registry import register_blueprint, registered_blueprints, unregister_blueprint
from esper.shell.user import check_controller_fits, grow, user_task
from tests.shell.host.test_user import Net1d, _checkpoint, _data, _host


class ChannelScale(nn.Module):
    """``x · s`` per channel, ``s`` zero at germination: C parameters, fewer than any built-in seed."""

    def __init__(self, channels: int):
        super().__init__()
        self.s = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.s[:, None]


@pytest.fixture
def channel_scale():
    index = register_blueprint("cnn1d", "channel_scale", ChannelScale, kind="normalization")
    try:
        yield index
    finally:
        unregister_blueprint("cnn1d", "channel_scale")


def test_a_registered_blueprint_is_placed_by_size_built_counted_and_described(channel_scale):
    builtin = BUILTIN_BLUEPRINTS["cnn1d"]
    # 8 parameters at width 8: after noop (0), before norm (17); the others move one index up
    assert channel_scale == 1 and BLUEPRINTS["cnn1d"] == (builtin[0], "channel_scale", *builtin[1:])
    assert registered_blueprints("cnn1d") == ("channel_scale",) and registered_blueprints("cnn") == ()
    host = _host()
    assert host.blueprint_names == BLUEPRINTS["cnn1d"]
    cost = host.germination_cost()  # the parameter cap's [S, B]: the seed and a gate
    gate = cost[0, 0]
    assert cost.shape == (3, len(builtin) + 1) and (cost[:, 1] == gate + 8).all()
    layout = describe_host(host, cost)
    kind = DESCRIPTOR_FEATURES.index("kind_normalization")
    assert layout.blueprint_names[1] == "channel_scale" and layout.descriptors[:, 1, kind].eq(1).all()
    params = host.germinate(2, 1, Style.LINEAR_ADD)
    assert isinstance(host.slots[2].seed, ChannelScale) and sum(p.numel() for p in params) == 8
    # a larger one lands by its size; params= places it without building it there
    heavy = lambda c: build_blueprint("cnn1d", "conv_heavy", c)
    at = register_blueprint("cnn1d", "big", heavy, kind="convolution", reach=5, params=10_000)
    try:
        assert BLUEPRINTS["cnn1d"][at:] == ("big",)
    finally:
        unregister_blueprint("cnn1d", "big")
    assert "big" not in BLUEPRINT_TRAITS["cnn1d"] and BLUEPRINTS["cnn1d"][-1] == builtin[-1]


def test_register_blueprint_errors_are_one_line():
    bad = [
        (("cnn3d", "x", ChannelScale), {"kind": "normalization"}, "unknown family 'cnn3d'"),
        (("cnn1d", "conv_heavy", ChannelScale), {"kind": "convolution"}, "has a blueprint 'conv_heavy'"),
        (("cnn1d", "a+b", ChannelScale), {"kind": "convolution"}, "a name is letters, digits and _"),
        (("cnn1d", "x", ChannelScale), {"kind": "identity"}, "kind must be one of"),
        (("cnn1d", "x", lambda c: nn.Conv1d(c, 2 * c, 1)), {"kind": "convolution"}, "a seed's delta has its"),
        (("cnn1d", "x", lambda c: 3), {"kind": "convolution"}, "not an nn.Module"),
    ]
    state = torch.random.get_rng_state()
    for args, kwargs, match in bad:
        with pytest.raises(ValueError, match=match) as err:
            register_blueprint(*args, **kwargs)
        assert "\n" not in str(err.value)
    assert torch.equal(torch.random.get_rng_state(), state) and BLUEPRINTS == BUILTIN_BLUEPRINTS
    with pytest.raises(ValueError, match="not a registered cnn1d blueprint"):
        unregister_blueprint("cnn1d", "conv_heavy")


def test_a_registered_blueprint_is_germinated_by_a_plan_and_by_a_learned_controller(channel_scale, tmp_path):
    """A fixed plan names it; a set-policy controller (untrained, eager to germinate) under a parameter
    cap that only it fits grows it and nothing else; a flat controller trained on the built-in
    catalogue does not fit the host (one line)."""
    splits = {"train": _data(64, 0), "val": _data(32, 1), "test": _data(32, 2)}
    task = user_task(Net1d, batch_size=32, **splits)
    out = grow(task, ("grow:tail.1=channel_scale",), episodes=2, epochs=3, n_envs=2)
    built = [[(g["slot"], g["blueprint"]) for g in r["germinations"]] for r in next(iter(out.values()))]
    assert built == [[(1, "channel_scale")]] * 2
    # the set policy: an untrained controller fits any catalogue; the cap (the seed's 8; a gate is
    # charged only where built, and no gate fits) leaves only channel_scale (noop is never offered)
    run_cfg = preset("smoke", {"env.task": "longrange", "ppo.policy": "set", "ppo.germinate_bias": 3,
                               "ppo.param_cap": 10})  # fmt: skip
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(to_dict(run_cfg)))
    save_checkpoint(run_dir / "checkpoint.pt", _checkpoint(run_cfg, run_cfg.env.build_task()))
    out = grow(task, ("ppo",), run_dir=run_dir, episodes=2, epochs=4, n_envs=2)
    grown = [g["blueprint"] for r in out["ppo"] for g in r["germinations"]]
    assert grown and set(grown) == {"channel_scale"}
    # a flat controller's blueprint head and observation are the built-in catalogue's
    flat_cfg = preset("smoke", {"env.task": "longrange", "ppo.policy": "flat"})
    with torch.random.fork_rng(devices=[]):
        unregister_blueprint("cnn1d", "channel_scale")  # the run trained on the built-in catalogue
        try:
            flat = _checkpoint(flat_cfg, flat_cfg.env.build_task())
        finally:
            register_blueprint("cnn1d", "channel_scale", ChannelScale, kind="normalization")
    refusal = r"blueprints: the run's 8, this host's 9 \(registered: channel_scale\)"
    with pytest.raises(ValueError, match=refusal):
        check_controller_fits(flat_cfg, flat, task, run="run F")
