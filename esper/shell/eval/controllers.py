"""The controllers an evaluation runs, by name: the trained controller's readouts (``ppo``,
``ppo_greedy``, ``ppo_mixed``), the baselines (``static``, ``random``, ``heuristic``, ``grow_all``),
the baselines that search on training hosts first (``heuristic_tuned``, ``heuristic_tuned_wide[@random]``,
``probe[@random]``, ``plan_search[@BUDGET][@random]``, ``plan_search_timed[@BUDGET][@random]``: Optuna's TPE,
or random search with ``@random``; :mod:`esper.shell.eval.search`),
fixed placements (``grow:SLOT=BLUEPRINT+...``) and schedules (``grow:SLOT=BLUEPRINT:EPOCH+...``), any
fixed schedule with its own blend (``@STYLE@TEMPO@ALPHA``), and the static network at a plan's final
size (``born_big[:PLAN|:CONTROLLER]``). :func:`make_controller` builds one for an env; ``--controllers``
of ``python -m esper.shell.evaluate`` takes these names.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from esper.core.spec import ALPHA_TARGETS, DEFAULT_BLEND, HEADS, Style, Tempo
from esper.shell.agent.agent import build_agent
from esper.shell.agent.controller import PPOController
from esper.shell.baselines.heuristic import GAIN_TRIGGER, HeuristicController
from esper.shell.baselines.probe import ProbeController
from esper.shell.baselines.simple import (
    BornBigController,
    GrowAllController,
    RandomController,
    StaticController,
)
from esper.shell.config.presets import RunConfig
from esper.shell.env.vecenv import VecEnv
from esper.shell.eval.search import (
    HEURISTIC_TUNED,
    HEURISTIC_TUNED_WIDE,
    PROBE,
    enabled_slots,
    is_searched,
    plan_kind,
    prices,
    search_kind,
)
from esper.shell.eval.store import STATIC, born_spec, grow_spec

#: The heads ``ppo_mixed`` takes the mode of.
MIXED_MODE_HEADS = tuple(h for h in HEADS if h not in ("op", "slot"))
#: Each PPO readout: the heads that take their most likely choice (True all, False none; the policy's
#: ``act(deterministic=...)``) and how it acts, in words (``results.json``'s ``meta.ppo_acts`` and the
#: growth bench's tables). ``ppo`` samples its policy, as it did in training (a generator seeded from
#: the evaluation seed); ``ppo_greedy`` takes every head's most likely choice. A policy that has learned
#: to germinate early but not at one particular epoch can put most of its mass on WAIT at every single
#: epoch, so its greedy version never grows: both are reported. ``ppo_mixed`` (asked for by name, not
#: in the default set) samples when and where (the op and slot heads) and takes the most likely what and
#: how (blueprint and blend heads): the sampled policy's misses were weaker blueprints drawn for a slot
#: whose mode was the strong one, the greedy policy's a WAIT that was the mode at every epoch.
PPO_READOUTS: dict[str, tuple[bool | tuple[str, ...], str]] = {
    "ppo": (False, "samples its policy, as in training (seeded)"),
    "ppo_greedy": (True, "takes each head's most likely choice"),
    "ppo_mixed": (
        MIXED_MODE_HEADS,
        "samples the op and slot heads and takes the other heads' most likely choice",
    ),
    "ppo_greedy_fossilize": (
        True,
        "takes each head's most likely choice, but fossilizes wherever FOSSILIZE is legal (a diagnostic "
        "of how the controller keeps its seeds)",
    ),
}
#: The readouts whose actions are overridden where FOSSILIZE is legal (diagnostics, evaluation only).
FOSSILIZING_READOUTS = ("ppo_greedy_fossilize",)
PPO_CONTROLLERS = tuple(PPO_READOUTS)
CONTROLLERS = ("ppo", "ppo_greedy", "static", "random", "heuristic", "grow_all")
#: The heuristic with the predicted-decrease trigger (:data:`~esper.shell.baselines.heuristic.GAIN_TRIGGER`;
#: needs ``lifecycle.grad_init`` or ``lifecycle.grad_gain_features``).
HEURISTIC_GAIN = "heuristic_gain"
#: Fixed placements: ``grow:SLOT=BLUEPRINT[+SLOT=BLUEPRINT...]`` grows only those slots, each with its
#: blueprint, as fast as the gates allow (:class:`~esper.shell.baselines.simple.GrowAllController`
#: with a plan). A fixed schedule also says when: ``SLOT=BLUEPRINT:EPOCH`` germinates that slot at that
#: epoch (1, the first measurement's, to ``max_epochs``), or as soon after as the gates allow.
PLAN_PREFIX = "grow:"
#: Between a planned slot's blueprint and its first epoch of germination (``b0=conv_heavy:3``).
EPOCH_SEP = ":"
#: ``born_big`` (``grow_all``'s plan), ``born_big:PLAN`` or ``born_big:CONTROLLER``: the plan's seeds
#: present from epoch 0, FOSSILIZED at alpha 1, trained with the host
#: (:class:`~esper.shell.baselines.simple.BornBigController`): the static network at the plan's final
#: size. ``CONTROLLER`` (a name without ``=``, evaluated earlier in the same evaluation, e.g.
#: ``born_big:ppo_greedy``): that controller's most frequent final plan there.
BORN_BIG = "born_big"
#: A fixed schedule blends as :data:`~esper.core.spec.DEFAULT_BLEND` says (LINEAR_ADD, FAST, alpha 1.0)
#: unless its name ends in settings, each after an ``@``: any of a style, a tempo and an alpha target, in
#: any order (``--controllers`` is comma-separated): ``grow:b0=conv_heavy@GATED_GATE``,
#: ``grow:b0=conv_heavy@STANDARD@0.7``.
STYLE_SEP = "@"
EXTRA_CONTROLLERS = (
    "ppo_mixed, ppo_greedy_fossilize, heuristic_tuned, heuristic_tuned_wide[@random], probe[@random], "
    "heuristic_gain (with lifecycle.grad_init), "
    "plan_search[@HOST_EPOCHS|@Kx][@random], plan_search_cap[@HOST_EPOCHS|@Kx][@random] (within the learned "
    "controller's cap), plan_search_timed[@HOST_EPOCHS|@Kx][@random] (the searches sample with Optuna's TPE, "
    "or at random with @random), grow_all:BLUEPRINT, grow:SLOT=BLUEPRINT[:EPOCH][+SLOT=BLUEPRINT"
    "[:EPOCH]...], either with @STYLE@TEMPO@ALPHA (any), born_big[:SLOT=BLUEPRINT+...|:CONTROLLER]"
)


def born_source(name: str) -> str | None:
    """The controller whose most frequent plan ``born_big:CONTROLLER`` grows from the start (None for any
    other name)."""
    base, colon, rest = name.partition(":")
    return rest if base == BORN_BIG and colon and rest and "=" not in rest else None


def is_born_big(name: str) -> bool:
    """``born_big``, ``born_big:PLAN`` or ``born_big:CONTROLLER`` (blend settings after it are refused)."""
    base = name.partition(STYLE_SEP)[0]
    return base == BORN_BIG or base.startswith(BORN_BIG + ":")


def make_controller(name: str, cfg: RunConfig, env: VecEnv, *, checkpoint: dict | None, seed: int,
                    searched: dict | None = None, host_seed: int | None = None):  # fmt: skip
    """A fresh controller ``name`` for ``env`` (the PPO ones restored from ``checkpoint`` and frozen;
    ``heuristic_tuned``, ``heuristic_tuned_wide``, ``probe`` and the plan searches from their search's
    result, ``searched``: :func:`esper.shell.eval.search.search`; ``born_big:CONTROLLER`` from its plan,
    ``searched["chosen"]``). ``host_seed``: a host of the batch it will run, which prices the widened
    heuristic's and the probe's budgets on a family (each member its own:
    :func:`~esper.shell.eval.search.prices`; None: the task's host)."""
    if is_born_big(name):
        return _born_big(name, env, searched)
    if is_searched(name):
        if searched is None:
            raise ValueError(f"controller {name!r} needs its search's result (esper.shell.eval.search)")
        kind = search_kind(name)  # probe@random is a probe, chosen by another search
        if kind == HEURISTIC_TUNED:
            return HeuristicController(env.blueprint_names, cfg.lifecycle, **searched["chosen"])
        if kind == HEURISTIC_TUNED_WIDE:
            p = prices(cfg, env.task, host_seed)
            chosen = searched["chosen"]
            return HeuristicController(env.blueprint_names, cfg.lifecycle, costs=p.costs,
                                       grow_all_params=p.grow_all, cap=p.budget, **chosen)  # fmt: skip
        if kind == PROBE:
            p = prices(cfg, env.task, host_seed)
            unit = p.grow_all / enabled_slots(cfg, env.task)
            return ProbeController(env.blueprint_names, cfg.lifecycle, p.costs, budget=p.budget, unit=unit,
                                   **searched["chosen"])  # fmt: skip
        return _schedule(PLAN_PREFIX + searched["chosen"], cfg, env)
    if name in PPO_CONTROLLERS:
        if checkpoint is None:
            raise ValueError(f"controller {name!r} needs the run's checkpoint")
        device = torch.device(cfg.env.device)
        agent = build_agent(
            cfg.ppo, env.spec, device=device, germination_cost=env.germination_cost, raw_obs_dim=env.obs_dim,
            budget_input=bool(cfg.env.budget_shares),
        )  # fmt: skip
        agent.load(checkpoint["agent"])
        agent.policy.eval()
        generator = torch.Generator(device=device).manual_seed(seed)
        return PPOController(agent, generator=generator, deterministic=PPO_READOUTS[name][0], learns=False,
                             fossilize_when_legal=name in FOSSILIZING_READOUTS)  # fmt: skip
    if name == "static":
        return StaticController()
    if name == "random":
        return RandomController(seed=seed)
    if name == "heuristic":
        return HeuristicController(env.blueprint_names, cfg.lifecycle)
    if name == HEURISTIC_GAIN:
        return HeuristicController(env.blueprint_names, cfg.lifecycle, gain_trigger=GAIN_TRIGGER)
    base, at, settings = name.partition(STYLE_SEP)
    if base == "grow_all" or base.startswith("grow_all:"):
        blend = parse_blend(name, settings) if at else {}
        blueprint = base.partition(":")[2] or env.task.grow_all
        return GrowAllController(_blueprint_index(name, blueprint, env), cfg.lifecycle, **blend)
    if base.startswith(PLAN_PREFIX):
        return _schedule(name, cfg, env)
    if at:
        raise ValueError(f"{name}: only grow_all and grow: placements take {STYLE_SEP}BLEND settings")
    raise ValueError(
        f"unknown controller {name!r}; controllers: {', '.join(CONTROLLERS)} (or {EXTRA_CONTROLLERS})"
    )


def _schedule(name: str, cfg: RunConfig, env: VecEnv) -> GrowAllController:
    """A ``grow:`` placement or schedule, with its blend settings."""
    base, at, settings = name.partition(STYLE_SEP)
    blend = parse_blend(name, settings) if at else {}
    plan, when = parse_schedule(base, env, max_epochs=cfg.lifecycle.max_epochs)
    return GrowAllController(plan, cfg.lifecycle, **blend, **({"at": when} if when else {}))


def _born_big(name: str, env: VecEnv, searched: dict | None) -> BornBigController:
    """``born_big`` (``grow_all``'s plan in every enabled slot), ``born_big:PLAN``, or ``born_big:CONTROLLER``
    with that controller's plan in ``searched["chosen"]``."""
    if STYLE_SEP in name:
        raise ValueError(f"{name}: born_big takes no {STYLE_SEP}BLEND settings (its seeds are in at alpha 1)")
    if name == BORN_BIG:
        blueprint = _blueprint_index(name, env.task.grow_all, env)
        return BornBigController({s: blueprint for s, on in enumerate(env.enabled) if on})
    source = born_source(name)
    if source is None:
        return BornBigController(parse_plan(PLAN_PREFIX + name.partition(":")[2], env))
    if searched is None or "chosen" not in searched:
        raise ValueError(f"{name}: needs {source}'s plan: evaluate {source} before it, in one evaluation")
    plan = searched["chosen"]
    return BornBigController(parse_plan(PLAN_PREFIX + plan, env) if plan else {})


def episode_spec(name: str, cfg: RunConfig, task, searched: dict | None = None) -> str | None:
    """The spec of controller ``name``'s episodes where it is a fixed plan
    (:mod:`esper.shell.eval.store`: ``static``, ``grow_all[:BLUEPRINT][@BLEND]``, ``grow:...``, a plan
    search's choice from ``searched``, ``born_big[:PLAN]``, ``born_big:CONTROLLER`` with its plan in
    ``searched``), else None (the learned controller, ``random``, the heuristics, the probe). Controllers
    with one spec act alike on every env: their episodes on the same hosts and draw are the same. Errors
    in a name are ``make_controller``'s."""
    kind = plan_kind(name)
    if name == "static":
        return STATIC
    if kind is None and not is_born_big(name) and not name.startswith(("grow_all", PLAN_PREFIX)):
        return None
    if kind is not None and (searched is None or "chosen" not in searched):
        return None
    with torch.random.fork_rng(devices=[]):  # a host draws its init: leave the caller's stream
        host = task.make_host()
    enabled = [not cfg.env.slots or i in cfg.env.slots for i in range(host.n_slots)]
    env = SimpleNamespace(slot_names=tuple(host.slot_names), blueprint_names=tuple(host.blueprint_names),
                          enabled=enabled, task=task)  # fmt: skip
    names, blueprints = env.slot_names, env.blueprint_names
    if is_born_big(name):
        ctl = _born_big(name, env, searched)
        return born_spec(ctl.plan, names, blueprints)
    if kind is not None:
        name = PLAN_PREFIX + searched["chosen"]
    base, at, settings = name.partition(STYLE_SEP)
    blend = {"style": Style(DEFAULT_BLEND["style"]), "tempo": Tempo(DEFAULT_BLEND["tempo"]),
             "alpha_target": ALPHA_TARGETS[DEFAULT_BLEND["alpha_target"]],
             **(parse_blend(name, settings) if at else {})}  # fmt: skip
    if base == "grow_all" or base.startswith("grow_all:"):
        blueprint = _blueprint_index(name, base.partition(":")[2] or task.grow_all, env)
        plan, when = {s: blueprint for s, on in enumerate(enabled) if on}, {}
    else:
        plan, when = parse_schedule(base, env, max_epochs=cfg.lifecycle.max_epochs)
    return grow_spec(plan, names, blueprints, at=when, style=int(blend["style"]), tempo=int(blend["tempo"]),
                     alpha=ALPHA_TARGETS.index(blend["alpha_target"]))  # fmt: skip


def _blueprint_index(name: str, blueprint: str, env: VecEnv) -> int:
    names = env.blueprint_names
    if blueprint not in names or blueprint == "noop":
        real = [b for b in names if b != "noop"]
        raise ValueError(f"{name}: no blueprint {blueprint!r}; blueprints: {', '.join(real)}")
    return names.index(blueprint)


def parse_blend(name: str, settings: str) -> dict[str, Style | Tempo | float]:
    """The blend settings after ``@`` in a fixed schedule's name, as
    :class:`~esper.shell.baselines.simple.GrowAllController` keywords: ``"STANDARD@0.7"`` ->
    ``{"tempo": Tempo.STANDARD, "alpha_target": 0.7}`` (a style, a tempo and an alpha target, each at
    most once, in any order; the ones left out keep the fixed schedule's)."""
    out: dict[str, Style | Tempo | float] = {}
    for token in settings.split(STYLE_SEP):
        key, value = _blend_setting(token.strip())
        if key is None:
            raise ValueError(
                f"{name}: no blend setting {token!r}; styles: {', '.join(s.name for s in Style)}; tempos: "
                f"{', '.join(t.name for t in Tempo)}; alpha targets: {', '.join(map(str, ALPHA_TARGETS))}"
            )
        if key in out:
            raise ValueError(f"{name}: gives the {key.replace('_', ' ')} twice")
        out[key] = value
    return out


def _blend_setting(token: str) -> tuple[str | None, Style | Tempo | float | None]:
    if token.upper() in Style.__members__:
        return "style", Style[token.upper()]
    if token.upper() in Tempo.__members__:
        return "tempo", Tempo[token.upper()]
    try:
        alpha = float(token)
    except ValueError:
        return None, None
    return ("alpha_target", alpha) if alpha in ALPHA_TARGETS else (None, None)


def parse_plan(name: str, env: VecEnv) -> dict[int, int]:
    """``grow:b0=conv_heavy+b2=depthwise`` -> ``{0: index of conv_heavy, 2: index of depthwise}``:
    the slots a fixed placement grows, each with its blueprint (one-line errors name what is wrong; a
    timed schedule is :func:`parse_schedule`'s)."""
    plan, at = parse_schedule(name, env)
    if at:
        raise ValueError(f"{name}: a plan here says what, not when: no {EPOCH_SEP}EPOCH")
    return plan


def parse_schedule(name: str, env: VecEnv, *,
                   max_epochs: int | None = None) -> tuple[dict[int, int], dict[int, int]]:  # fmt: skip
    """``grow:b0=conv_heavy:3+b2=depthwise`` -> ``({0: conv_heavy, 2: depthwise}, {0: 3})`` (blueprint
    indices): the slots a fixed schedule grows, each with its blueprint, and the epoch from which each
    slot with an ``:EPOCH`` germinates (an integer from 1, at most ``max_epochs`` where given)."""
    body = name.removeprefix(PLAN_PREFIX)
    plan: dict[int, int] = {}
    at: dict[int, int] = {}
    for part in body.split("+") if body else []:
        slot, eq, rest = part.partition("=")
        if not eq or slot not in env.slot_names:
            slots = ", ".join(env.slot_names)
            form = f"SLOT=BLUEPRINT[{EPOCH_SEP}EPOCH]"
            raise ValueError(f"{name}: {part!r} is not {form} with a slot of {slots}")
        index = env.slot_names.index(slot)
        if index in plan:
            raise ValueError(f"{name}: slot {slot} planned twice")
        if not env.enabled[index]:
            raise ValueError(f"{name}: slot {slot} is not enabled (env.slots)")
        blueprint, colon, epoch = rest.partition(EPOCH_SEP)
        plan[index] = _blueprint_index(name, blueprint, env)
        if colon:
            top = f" to {max_epochs}" if max_epochs is not None else ""
            if not epoch.isdigit() or int(epoch) < 1 or (max_epochs is not None and int(epoch) > max_epochs):
                raise ValueError(f"{name}: {part!r}: the epoch after {EPOCH_SEP} is an integer from 1{top}")
            at[index] = int(epoch)
    if not plan:
        raise ValueError(f"{name}: an empty plan; write e.g. {PLAN_PREFIX}b0=conv_heavy+b2=depthwise")
    return plan, at
