"""The run configuration (esper.shell.config.presets) and its tools (esper.shell.common.fields):
presets, dotted overrides, validation with clear messages, the dict round-trip, immutability."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from esper.core.rewards import RewardFamily, RewardMode
from esper.shell.common.fields import doc, fields_flat, from_dict, to_dict, with_overrides
from esper.shell.config.presets import PRESETS, RunConfig, preset

#: Presets that read local data need a path; everything else builds as is.
NEEDS_DATA = {"cifar10": "/data/cifar-10-batches-bin", "tinystories": "/data/TinyStories.txt"}


def build(name: str) -> RunConfig:
    extra = {"env.data_path": NEEDS_DATA[name]} if name in NEEDS_DATA else None
    return preset(name, extra)


def sections(cfg) -> list:
    subs = [getattr(cfg, f.name) for f in dataclasses.fields(cfg)]
    return [cfg, *(s for s in subs if dataclasses.is_dataclass(s))]


# ------------------------------------------------------------------------------------------- presets
def test_the_documented_presets_exist():
    assert {"default", "stdlib_text", "cifar10", "tinystories", "smoke"} <= set(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_a_valid_frozen_config(name):
    cfg = build(name)
    assert isinstance(cfg, RunConfig)
    for section in sections(cfg):
        params = type(section).__dataclass_params__
        assert params.frozen, type(section).__name__
    assert cfg.env.n_envs % cfg.ppo.n_minibatches == 0
    assert cfg == build(name)  # a fresh, equal object each call
    assert cfg is not build(name)


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        # the default's controller is the candidate the seeds 80-89 rule judged, with the capacity prior the
        # seeds 100-109 rule judged and the FOSSILIZE preference the suite's seeds 300-304 rule judged; its
        # lifecycle's G2 evidence the zero-shot confirmation on fresh hosts 5000+ (docs/experiment-log.md):
        # a change here needs a new rule on fresh seeds, not only a green suite; its batches of 256 the
        # time-to-a-result rules on fresh seeds 610-619 (issue 90), its 8 updates the worst-seed rule on fresh
        # seeds 1200-1209 and 42 (issue 102); the suite keeps 22 on 128
        (
            "mnist1d",
            {"env.task": "mnist1d", "updates": 22, "env.batch_size": 128, "ppo.lr_anneal_updates": 22},
        ),
        (
            "default",
            {
                "env.task": "mnist1d",
                "reward.mode": RewardMode.OBJECTIVE,
                "updates": 8,
                "ppo.lr_anneal_updates": 8,
                "ppo.entropy_anneal_updates": 8,
                "env.batch_size": 256,
                "env.host_lr": 0.1,
                "env.n_envs": 8,
                "ppo.replay": 3,
                "ppo.blend_bias": 3.0,
                "lifecycle.terminal_at_limit": True,
                "ppo.gae_lambda": 1.0,
                "reward.param_weight": 0.0,
                "reward.param_budget_share": 0.6,
                "reward.param_budget": 0.0,
                "ppo.param_cap_share": 0.6,
                "ppo.param_cap": 0.0,
                "ppo.size_bias": 1.0,
                "ppo.fossilize_bias": 4.0,
                "lifecycle.g2_evidence": "either",
            },
        ),
        ("digits", {"env.task": "digits", "env.n_envs": 4, "env.channels": (4, 8, 16), "ppo.lr": 1e-3}),
        ("stdlib_text", {"env.task": "stdlib_text", "env.n_envs": 2, "ppo.n_minibatches": 1}),
        ("cifar10", {"env.task": "cifar10", "env.device": "cuda", "env.amp": True, "ppo.entropy_coef": 0.1}),
        ("tinystories", {"env.task": "tinystories", "reward.sparse_scale": 0.5, "updates": 100}),
        ("smoke", {"lifecycle.max_epochs": 6, "report": False, "progress": False, "ppo.n_epochs": 2}),
    ],
)
def test_presets_set_their_fields(name, expect):
    cfg = build(name)
    for dotted, value in expect.items():
        obj = cfg
        for part in dotted.split("."):
            obj = getattr(obj, part)
        assert obj == value, dotted


@pytest.mark.parametrize("name", sorted(NEEDS_DATA))
def test_local_data_presets_need_a_path_and_accept_it_as_an_option(name, capsys):
    with pytest.raises(ValueError, match="env.data_path"):
        preset(name)
    cfg = preset(name, {"env.data_path": NEEDS_DATA[name], "env.n_envs": "8"})
    assert cfg.env.task == name and cfg.env.data_path == NEEDS_DATA[name]
    assert cfg.env.n_envs == 8 and cfg.env.device == "cuda"  # the preset's own values are kept

    from esper.shell.run import main  # the CLI the README documents: --preset cifar10 --env.data_path

    assert main(["--preset", name, "--env.data_path", NEEDS_DATA[name], "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["env"]["task"] == name and printed["env"]["data_path"] == NEEDS_DATA[name]


def test_unknown_preset_is_refused_with_the_list():
    with pytest.raises(ValueError, match=r"unknown preset 'nope'.*default"):
        preset("nope")


def test_preset_overrides_win_over_the_preset():
    cfg = preset("smoke", {"lifecycle.max_epochs": "9", "updates": 5})
    assert cfg.lifecycle.max_epochs == 9 and cfg.updates == 5
    assert cfg.ppo.hidden == 16  # untouched preset value


# ----------------------------------------------------------------------------------------- overrides
def test_nested_overrides_apply_with_the_fields_types():
    base = preset("default")
    cfg = with_overrides(
        base,
        {
            "ppo.lr": "1e-4",
            "env.n_envs": "8",
            "updates": "3",
            "env.channels": "2, 4,6",
            "ppo.target_kl": "none",
            "ppo.value_clip": 5,
            "reward.mode": "sparse",
            "report": "false",
            "lifecycle.g2_min_gain": "0.25",
        },
    )
    assert cfg.ppo.lr == pytest.approx(1e-4) and isinstance(cfg.ppo.lr, float)
    assert cfg.env.n_envs == 8 and isinstance(cfg.env.n_envs, int)
    assert cfg.updates == 3
    assert cfg.env.channels == (2, 4, 6)
    assert cfg.ppo.target_kl is None
    assert cfg.ppo.value_clip == 5.0
    assert cfg.reward.mode is RewardMode.SPARSE
    assert cfg.report is False
    assert cfg.lifecycle.g2_min_gain == 0.25
    # everything else is the base's, and the base is untouched
    assert cfg.ppo.gamma == base.ppo.gamma and cfg.env.task == base.env.task and cfg.seed == base.seed
    assert base == preset("default") and base.report is True


def test_overrides_of_one_section_are_validated_together():
    base = preset("default")
    # env.task and env.data_path are tied: each alone is invalid, both together are fine
    with pytest.raises(ValueError, match="env.data_path"):
        with_overrides(base, {"env.task": "cifar10"})
    with pytest.raises(ValueError, match="ships with the code"):
        with_overrides(base, {"env.data_path": "/x"})
    cfg = with_overrides(base, {"env.task": "cifar10", "env.data_path": "/x", "env.channels": ""})
    assert (cfg.env.task, cfg.env.data_path) == ("cifar10", "/x")
    # reward: family LOSS needs mode SHAPED; leaving LOSS and SHAPED at once must work
    with pytest.raises(ValueError, match="LOSS requires mode SHAPED, got OBJECTIVE"):
        with_overrides(base, {"reward.family": "loss"})
    loss = with_overrides(base, {"reward.family": "loss", "reward.mode": "shaped"})
    assert loss.reward.family is RewardFamily.LOSS
    with pytest.raises(ValueError, match="LOSS requires mode SHAPED"):
        with_overrides(loss, {"reward.mode": "sparse"})
    both = with_overrides(loss, {"reward.mode": "sparse", "reward.family": "contribution"})
    assert (both.reward.mode, both.reward.family) == (RewardMode.SPARSE, RewardFamily.CONTRIBUTION)
    # across sections: n_minibatches must divide n_envs, checked on the final pair
    with pytest.raises(ValueError, match="must divide env.n_envs=3"):
        with_overrides(base, {"env.n_envs": "3"})
    assert with_overrides(base, {"env.n_envs": "3", "ppo.n_minibatches": "1"}).env.n_envs == 3
    with pytest.raises(ValueError, match="ppo.host_group=3 must divide env.n_envs=4"):
        with_overrides(base, {"env.n_envs": "4", "ppo.n_minibatches": "1", "ppo.host_group": "3"})
    assert with_overrides(base, {"env.n_envs": "4", "ppo.host_group": "2"}).ppo.host_group == 2


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"ppo.lrr": "1"}, "'ppo.lrr'"),
        ({"env.n_env": "2"}, "'env.n_env'"),
        ({"nope": "1"}, "'nope'"),
        ({"ppo": "1"}, "'ppo' is a section"),
        ({"ppo.lr.x": "1"}, "'lr' is not a section"),
    ],
)
def test_unknown_options_are_refused_naming_them(overrides, named):
    with pytest.raises(ValueError) as exc:
        with_overrides(preset("default"), overrides)
    assert named in str(exc.value)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"ppo.lr": "fast"}, "ppo.lr: 'fast' is not a number"),
        ({"env.n_envs": "2.5"}, "env.n_envs: '2.5' is not an integer"),
        ({"env.n_envs": True}, "env.n_envs: True is not an integer"),
        ({"report": "maybe"}, "report: 'maybe' is not a boolean"),
        ({"reward.mode": "greedy"}, "reward.mode: 'greedy' is not one of"),
        ({"env.channels": "4,x,8"}, "env.channels: 'x' is not an integer"),
        ({"env.n_envs": "0"}, "env.n_envs must be >= 1"),
        ({"ppo.gamma": "1.5"}, "ppo.gamma must be in [0, 1]"),
        ({"ppo.lr": "0"}, "ppo.lr must be > 0"),
        ({"ppo.head_entropy_weights": "1,2"}, "ppo.head_entropy_weights needs 8 values"),
        ({"lifecycle.max_epochs": "0"}, "max_epochs must be an integer >= 1"),
        ({"policy": "sarsa"}, "policy must be one of"),
        ({"updates": "0"}, "updates must be >= 1"),
        ({"env.task": "mnist"}, "env.task must be one of"),
    ],
)
def test_bad_values_are_refused_naming_the_field(overrides, named):
    with pytest.raises(ValueError) as exc:
        with_overrides(preset("default"), overrides)
    assert named in str(exc.value)


# --------------------------------------------------------------------- parse-time validation (issue 10)
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [  # every value the issue found accepted, each refused in one line naming the field
        ("ppo.lr", "inf", "ppo.lr must be finite, got inf"),
        ("ppo.clip_epsilon", "inf", "ppo.clip_epsilon must be finite"),
        ("ppo.entropy_coef", "nan", "ppo.entropy_coef must be finite, got nan"),
        ("ppo.value_coef", "-5", "ppo.value_coef must be >= 0, got -5.0"),
        ("env.host_lr", "nan", "env.host_lr must be finite"),
        ("env.host_lr", "-1", "env.host_lr must be > 0, got -1.0"),
        ("env.seed_lr", "inf", "env.seed_lr must be finite"),
        ("env.momentum", "5", "env.momentum must be in [0, 1), got 5.0"),
        ("governor.penalty", "inf", "governor.penalty must be finite"),
        ("ppo.obs_momentum", "2", "ppo.obs_momentum must be in [0, 1], got 2.0"),
        ("seed", "-1", "seed must be >= 0, got -1"),
        ("ppo.value_clip", "-1", "ppo.value_clip must be > 0, got -1.0"),  # was: after a whole rollout
        ("ppo.target_kl", "0", "ppo.target_kl must be > 0"),
        ("ppo.head_entropy_weights", "1,1,1,1,1,1,1,-1", "ppo.head_entropy_weights must be >= 0, got -1.0"),
        ("env.slots", "0,-1", "env.slots must be >= 0, got -1"),
        ("anomaly.kl_spike_floor", "inf", "anomaly.kl_spike_floor must be finite"),
        ("env.device", "bogus", "env.device: 'bogus' is not a device"),
        ("env.devices", "cpu,gpu0", "env.devices: 'gpu0' is not a device"),
        ("name", "../../x", "no path separators or '..'"),
        ("name", "a/b", "no path separators"),
        ("name", ".hidden", "starting with a letter or digit"),
        ("name", "x" * 300, "name must be at most 100 characters, got 300"),
        ("run_dir", " ", "run_dir must not be empty"),
    ],
)
def test_every_bad_value_is_refused_at_parse_time_in_one_line(field, value, message):
    with pytest.raises(ValueError) as exc:
        preset("smoke", {field: value})
    assert message in str(exc.value) and "\n" not in str(exc.value)


def _float_fields() -> list[str]:
    out = []
    for name, tp, _ in fields_flat(RunConfig):
        text = str(tp)
        if tp is float or "float" in text:  # float, float | None, tuple[float, ...]
            out.append(name)
    return out


@pytest.mark.parametrize("field", _float_fields())
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_no_float_field_of_any_section_accepts_nan_or_inf(field, value):
    """One generic check (configtools.check_fields, run on every section, core ones included) instead
    of a check per field that a new field could miss."""
    cfg = preset("smoke")
    current = getattr(getattr(cfg, field.split(".")[0]), field.split(".")[1]) if "." in field else None
    if isinstance(current, tuple):
        n = len(current) or 8  # an empty default (head_entropy_weights) takes one per head
        value = ",".join([value] + ["1"] * (n - 1))
    with pytest.raises(ValueError) as exc:
        preset("smoke", {field: value})
    assert field.split(".")[-1] in str(exc.value)


def test_doc_bounds_are_checked_for_every_number_of_a_field():
    from esper.shell.common.fields import check_fields

    @dataclasses.dataclass(frozen=True)
    class Toy:
        rate: float = doc(0.5, "a rate", gt=0, le=1)
        count: int = doc(1, "a count", ge=1)
        widths: tuple[int, ...] = doc((), "widths", ge=2)
        free: float | None = doc(None, "anything finite")

    check_fields(Toy(), "toy")
    check_fields(Toy(rate=1.0, count=5, widths=(2, 3), free=-1e30), "toy")
    for kwargs, message in [
        ({"rate": 0.0}, "toy.rate must be in (0, 1], got 0.0"),
        ({"rate": 1.5}, "toy.rate must be in (0, 1], got 1.5"),
        ({"count": 0}, "toy.count must be >= 1, got 0"),
        ({"widths": (2, 1)}, "toy.widths must be >= 2, got 1"),
        ({"free": float("nan")}, "toy.free must be finite, got nan"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            check_fields(Toy(**kwargs), "toy")


# ------------------------------------------------------------------------------------- dict round-trip
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_to_dict_from_dict_round_trips_through_json(name):
    cfg = build(name)
    data = to_dict(cfg)
    text = json.dumps(data)  # JSON-ready: enums by name, tuples as lists
    assert data["reward"]["mode"] == cfg.reward.mode.name
    assert isinstance(data["env"]["channels"], list)
    back = from_dict(RunConfig, json.loads(text))
    assert back == cfg
    assert to_dict(back) == data


def test_from_dict_keeps_defaults_for_missing_keys():
    cfg = from_dict(RunConfig, {"updates": 3, "ppo": {"lr": 0.001}})
    default = RunConfig()
    assert cfg == dataclasses.replace(default, updates=3, ppo=dataclasses.replace(default.ppo, lr=0.001))
    assert from_dict(RunConfig, {}) == RunConfig()


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"ppo": {"lrr": 1.0}}, "ppo.lrr"),
        ({"colour": "red"}, "colour"),
        ({"env": {"n_envs": 4, "zz": 1}}, "env.zz"),
        ({"updates": None}, "updates: None is not an integer"),
        ({"updates": [3]}, "updates: [3] is not an integer"),
        ({"updates": True}, "updates: True is not an integer"),
        ({"ppo": {"lr": [0.1]}}, "ppo.lr: [0.1] is not a number"),
        ({"run_dir": None}, "run_dir: None is not a string"),
        ({"env": {"channels": 5}}, "env.channels: 5 is not a list"),
        ({"ppo": 3}, "ppo is a section"),
        ({"reward": {"mode": "SHAPEY"}}, "reward.mode: 'SHAPEY' is not one of"),
    ],
)
def test_from_dict_refuses_unknown_keys_and_bad_types_naming_the_key(data, named):
    with pytest.raises(ValueError) as exc:
        from_dict(RunConfig, data)
    assert named in str(exc.value)


# -------------------------------------------------------------------------------------- immutability
def test_configs_cannot_be_mutated():
    cfg = preset("default")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.updates = 99
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.ppo.lr = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.env.n_envs = 1
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError, TypeError)):
        cfg.typo_field = 1  # slotted: no stray attributes either
    assert not hasattr(cfg, "__dict__")
    assert cfg == preset("default")
    assert isinstance(cfg.env.channels, tuple)  # sequences are stored immutable
    hash(cfg)  # frozen and made of immutable values: hashable


def test_every_field_is_documented_and_defaults_are_immutable():
    flat = fields_flat(RunConfig)
    assert len(flat) > 50
    undocumented = [name for name, _, text in flat if not text.strip()]
    assert not undocumented
    with pytest.raises(TypeError, match="immutable"):
        doc([1, 2], "a list default would be shared between instances")


# ------------------------------------------------------ the set policy, several tasks, init_from (issue 46)
def test_ppo_policy_is_set_by_default_and_flat_on_request():
    """The set policy became the default by the rule written before seeds 120-129 ran (the experiment
    log: it matched the flat one within the flat one's interval at at most 1.25x its training time)."""
    assert preset("default").ppo.policy == "set" and preset("smoke").ppo.policy == "set"
    assert preset("default", {"ppo.policy": "flat"}).ppo.policy == "flat"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ppo.policy": "graph"}, "ppo.policy must be one of flat, set, got 'graph'"),
        ({"ppo.policy": "set", "ppo.slot_bias": "true"}, "ppo.slot_bias is the flat policy's"),
        ({"tasks": "mnist1d,nope"}, "tasks: unknown task(s) ['nope']"),
        ({"tasks": "mnist1d,mnist1d"}, "tasks: mnist1d, mnist1d names a task twice"),
        (
            {"tasks": "mnist1d_deep,longrange"},
            "env.task 'mnist1d' is not one of tasks (mnist1d_deep, longrange)",
        ),
        ({"tasks": "mnist1d,digits", "env.data_seed": "5"}, "tasks: digits: "),
        ({"init_from": "runs/x", "policy": "heuristic"}, "init_from starts a learned controller"),
    ],
)
def test_set_policy_tasks_and_init_from_are_refused_in_one_line(overrides, message):
    with pytest.raises(ValueError) as exc:
        preset("smoke", overrides)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_tasks_take_turns_from_the_first_and_each_is_a_config_of_its_own():
    cfg = preset("smoke", {"tasks": "mnist1d,mnist1d_deep,longrange", "ppo.policy": "set"})
    assert cfg.tasks == ("mnist1d", "mnist1d_deep", "longrange")
    assert cfg.training_tasks == cfg.tasks
    assert [cfg.task_of(u) for u in range(5)] == [
        "mnist1d",
        "mnist1d_deep",
        "longrange",
        "mnist1d",
        "mnist1d_deep",
    ]
    one = cfg.for_task("mnist1d_deep")
    assert one.env.task == "mnist1d_deep" and one.tasks == () and one.training_tasks == ("mnist1d_deep",)
    assert one.ppo == cfg.ppo and one.env.n_envs == cfg.env.n_envs  # the run's settings, on another task
    plain = preset("smoke")
    assert plain.tasks == () and plain.training_tasks == ("mnist1d",) and plain.task_of(7) == "mnist1d"
    assert from_dict(RunConfig, json.loads(json.dumps(to_dict(cfg)))) == cfg  # stored in config.json
    assert preset("smoke", {"init_from": "runs/a"}).init_from == "runs/a"


def test_a_budget_given_one_way_on_the_command_line_replaces_the_preset_s_other_way():
    """The default states its budget and cap as shares of grow_all; ``--reward.param_budget 500`` or
    ``--ppo.param_cap 300`` replaces the share instead of being refused as both set, and the reverse."""
    cfg = preset("default", {"reward.param_budget": "500", "ppo.param_cap": "300"})
    assert (cfg.reward.param_budget, cfg.reward.param_budget_share) == (500.0, 0.0)
    assert (cfg.ppo.param_cap, cfg.ppo.param_cap_share) == (300.0, 0.0)
    cfg = preset("default", {"reward.param_budget_share": "0.5"})
    assert (cfg.reward.param_budget, cfg.reward.param_budget_share) == (0.0, 0.5)
    with pytest.raises(ValueError, match="both set"):  # both on one command line: refused
        preset("default", {"ppo.param_cap": "300", "ppo.param_cap_share": "0.5"})
