"""``python -m esper.shell.evaluate RUN_DIR``: judge a trained controller on hosts it never saw.

    python -m esper.shell.evaluate runs/default-20261123-101500                   # 20 episodes each
    python -m esper.shell.evaluate RUN_DIR --episodes 50 --seed 7 --controllers ppo,static,grow_all

The run's controller is loaded from ``RUN_DIR/checkpoint.pt`` and frozen (no update, observation
statistics as saved) and run twice: ``ppo`` samples its policy as in training (seeded), ``ppo_greedy``
takes each head's most likely choice (``--controllers ppo_mixed`` adds a third readout: sampled op and
slot, the most likely blueprint and blend). They and the baselines of
:mod:`esper.shell.baselines.simple` — ``static`` (always WAIT), ``random`` (uniform over legal actions),
``heuristic`` (the reference's rules), ``grow_all`` (germinate the task's best blueprint everywhere,
blend and fossilize as fast as the gates allow) — each run the **same** episodes: host seeds derived
from ``--seed`` under a purpose of their own (:func:`esper.shell.env.seeding.eval_host_seeds`), so no
evaluation host is a training host, and every controller meets the same hosts and data orders.

The verdict is the held-out **test** accuracy of each episode's final host (a split neither the host's
training nor the controller ever reads) and the parameters the controller added. Written to
``RUN_DIR/eval/`` (``--out DIR`` elsewhere):

- ``results.json``: ``{"controllers": {name: {"test_acc_mean", "test_acc_ci95": [lo, hi],
  "params_added_mean", "episodes", ...}}, "correlations": {...}, "meta": {...}}``: accuracy in %,
  95 % Student-t intervals over episodes, ``params_added`` = final host's parameters minus the static
  host's; every episode's numbers under ``per_episode``; Spearman correlations between the episode
  return and the final test accuracy (and accuracy per parameter, and the held-out objective) over
  all evaluation episodes;
- ``report.md`` and ``plots/``: test accuracy against parameters added (one point per episode), and
  validation accuracy over the epochs per controller.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esper.core.rewards import RewardConfig, parameter_cost
from esper.core.spec import ALPHA_TARGETS, HEADS, Style, Tempo
from esper.shell.agent.agent import build_agent
from esper.shell.agent.controller import PPOController
from esper.shell.baselines.heuristic import HeuristicController
from esper.shell.baselines.simple import (
    GROW_ALL_BLUEPRINT,
    GrowAllController,
    RandomController,
    StaticController,
)
from esper.shell.config.fields import from_dict
from esper.shell.config.presets import RunConfig
from esper.shell.data.tasks import Task
from esper.shell.env.rollout import EpisodeRunner
from esper.shell.env.seeding import eval_host_seeds
from esper.shell.env.vecenv import BLEND_SETTINGS, VecEnv
from esper.shell.eval.stats import mean_ci95, spearman
from esper.shell.runtime.checkpoint import load_checkpoint
from esper.shell.runtime.cli import OneLineParser, repeat_line, report
from esper.shell.telemetry.events import progress

PROG = "python -m esper.shell.evaluate"
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
}
PPO_CONTROLLERS = tuple(PPO_READOUTS)
CONTROLLERS = ("ppo", "ppo_greedy", "static", "random", "heuristic", "grow_all")
#: Fixed placements: ``grow:SLOT=BLUEPRINT[+SLOT=BLUEPRINT...]`` grows only those slots, each with its
#: blueprint, as fast as the gates allow (:class:`~esper.shell.baselines.simple.GrowAllController`
#: with a plan).
PLAN_PREFIX = "grow:"
#: A fixed schedule blends as :data:`~esper.core.spec.DEFAULT_BLEND` says (LINEAR_ADD, FAST, alpha 1.0)
#: unless its name ends in settings, each after an ``@``: any of a style, a tempo and an alpha target, in
#: any order (``--controllers`` is comma-separated): ``grow:b0=conv_heavy@GATED_GATE``,
#: ``grow:b0=conv_heavy@STANDARD@0.7``.
STYLE_SEP = "@"
EXTRA_CONTROLLERS = (
    "ppo_mixed, grow_all:BLUEPRINT, grow:SLOT=BLUEPRINT[+SLOT=BLUEPRINT...], "
    "either with @STYLE@TEMPO@ALPHA (any)"
)
#: Episode fields kept in ``per_episode`` (and averaged where numeric).
EPISODE_FIELDS = ("return", "final_test_acc", "final_val_acc", "params_added", "objective", "test_objective",
                  "n_fossilized", "n_pruned", "host_seed", "grown", "germinated_at",
                  "germinations")  # fmt: skip


# ------------------------------------------------------------------------------------- controllers
def make_controller(name: str, cfg: RunConfig, env: VecEnv, *, checkpoint: dict | None, seed: int):
    """A fresh controller ``name`` for ``env`` (the PPO ones restored from ``checkpoint`` and frozen)."""
    if name in PPO_CONTROLLERS:
        if checkpoint is None:
            raise ValueError(f"controller {name!r} needs the run's checkpoint")
        device = torch.device(cfg.env.device)
        agent = build_agent(cfg.ppo, env.spec, device=device, germination_cost=env.germination_cost)
        agent.load(checkpoint["trainer"])
        agent.policy.eval()
        generator = torch.Generator(device=device).manual_seed(seed)
        return PPOController(agent, generator=generator, deterministic=PPO_READOUTS[name][0], learns=False)
    if name == "static":
        return StaticController()
    if name == "random":
        return RandomController(seed=seed)
    if name == "heuristic":
        return HeuristicController(env.blueprint_names, cfg.lifecycle)
    base, at, settings = name.partition(STYLE_SEP)
    blend = parse_blend(name, settings) if at else {}
    if base == "grow_all" or base.startswith("grow_all:"):
        blueprint = base.partition(":")[2] or GROW_ALL_BLUEPRINT[env.task.family]
        return GrowAllController(_blueprint_index(name, blueprint, env), cfg.lifecycle, **blend)
    if base.startswith(PLAN_PREFIX):
        return GrowAllController(parse_plan(base, env), cfg.lifecycle, **blend)
    if at:
        raise ValueError(f"{name}: only grow_all and grow: placements take {STYLE_SEP}BLEND settings")
    raise ValueError(
        f"unknown controller {name!r}; controllers: {', '.join(CONTROLLERS)} (or {EXTRA_CONTROLLERS})"
    )


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
    the slots a fixed placement grows, each with its blueprint (one-line errors name what is wrong)."""
    body = name.removeprefix(PLAN_PREFIX)
    plan: dict[int, int] = {}
    for part in body.split("+") if body else []:
        slot, eq, blueprint = part.partition("=")
        if not eq or slot not in env.slot_names:
            slots = ", ".join(env.slot_names)
            raise ValueError(f"{name}: {part!r} is not SLOT=BLUEPRINT with a slot of {slots}")
        index = env.slot_names.index(slot)
        if index in plan:
            raise ValueError(f"{name}: slot {slot} planned twice")
        if not env.enabled[index]:
            raise ValueError(f"{name}: slot {slot} is not enabled (env.slots)")
        plan[index] = _blueprint_index(name, blueprint, env)
    if not plan:
        raise ValueError(f"{name}: an empty plan; write e.g. {PLAN_PREFIX}b0=conv_heavy+b2=depthwise")
    return plan


# ------------------------------------------------------------------------------------------ running
def run_episodes(cfg: RunConfig, task: Task, name: str, episodes: Sequence[int], *, eval_seed: int,
                 checkpoint: dict | None, on_epoch=None) -> list[dict]:  # fmt: skip
    """Run controller ``name`` on evaluation episodes ``episodes`` (indices; host seeds from
    ``eval_seed``), ``cfg.env.n_envs`` at a time. Returns one record per episode, in order."""
    records: list[dict] = []
    width = cfg.env.n_envs
    for start in range(0, len(episodes), width):
        chunk = list(episodes[start : start + width])
        env_cfg = dataclasses.replace(cfg.env, n_envs=len(chunk))
        env = VecEnv(env_cfg, cfg.lifecycle, cfg.governor, seed=cfg.seed, task=task)
        try:
            ctl = make_controller(name, cfg, env, checkpoint=checkpoint, seed=eval_seed + start)
            runner = EpisodeRunner(
                env, ctl, lifecycle=cfg.lifecycle, reward=cfg.reward, gamma=cfg.ppo.gamma, on_epoch=on_epoch
            )
            result = runner.run(start, host_seeds=eval_host_seeds(eval_seed, chunk))
        finally:
            env.close()
        curves = np.array([ev["val_acc"] for ev in result.epochs]).T  # [E, T]
        for i, ep in enumerate(result.episodes):
            rec = {"controller": name, "episode": chunk[i], **ep}
            rec["test_objective"] = _objective(ep["final_test_acc"], ep["params_added"], ep["host_params"],
                                               cfg.reward)  # fmt: skip
            rec["val_acc_curve"] = [float(a) for a in curves[i]]
            records.append(rec)
    return records


def _objective(acc: float, params_added: float, host_params: float, reward: RewardConfig) -> float:
    """The held-out analogue of the OBJECTIVE reward's Phi: test accuracy minus the parameter cost."""
    host = torch.tensor(max(float(host_params), 1.0))
    cost = parameter_cost(torch.tensor(float(params_added)), host, reward)
    return acc - float(cost)


def summarize(records: list[dict]) -> dict[str, Any]:
    """One controller's summary (the ``results.json`` entry)."""
    acc = [r["final_test_acc"] for r in records]
    params = [r["params_added"] for r in records]
    m, (lo, hi) = mean_ci95(acc)
    pm, (plo, phi) = mean_ci95(params)
    out: dict[str, Any] = {
        "test_acc_mean": m,
        "test_acc_ci95": [lo, hi],
        "params_added_mean": pm,
        "params_added_ci95": [plo, phi],
        "episodes": len(records),
        "test_acc_std": float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0,
    }
    for k in ("return", "final_val_acc", "objective", "test_objective", "n_fossilized", "n_pruned"):
        out[f"{k}_mean"] = float(np.mean([r[k] for r in records]))
    ops: dict[str, float] = {}
    for r in records:
        for op, n in r.get("op_counts", {}).items():
            ops[op] = ops.get(op, 0.0) + n / len(records)
    out["op_counts_mean"] = ops
    # what was grown, where and when: the final hosts' seeds in the placements' notation, most common
    # first, and the epoch of each episode's first germination (episodes that germinated at all)
    grown = Counter(r["grown"] for r in records)
    out["grown_counts"] = dict(sorted(grown.items(), key=lambda kv: (-kv[1], kv[0])))
    first = [r["germinated_at"][0] for r in records if r["germinated_at"]]
    out["first_germination_mean"] = float(np.mean(first)) if first else None
    # how it blended: the style, tempo and alpha target of every germination, most common first
    germs = [g for r in records for g in r.get("germinations", [])]
    out["blend_counts"] = {
        k: dict(Counter(str(g[k]) for g in germs if k in g).most_common()) for k in BLEND_SETTINGS
    }
    out["val_acc_curve_mean"] = np.mean([r["val_acc_curve"] for r in records], axis=0).tolist()
    out["per_episode"] = [{k: r[k] for k in (*EPISODE_FIELDS, "episode")} for r in records]
    return out


def correlations(records: list[dict]) -> dict[str, Any]:
    """Spearman's rho between each episode's return and its held-out outcome, over ``records``."""
    ret = [r["return"] for r in records]
    per_param = [r["final_test_acc"] / (r["host_params"] + r["params_added"]) * 1000.0 for r in records]
    return {
        "n_episodes": len(records),
        "return_vs_test_acc": spearman(ret, [r["final_test_acc"] for r in records]),
        "return_vs_test_acc_per_kparam": spearman(ret, per_param),
        "return_vs_test_objective": spearman(ret, [r["test_objective"] for r in records]),
    }


def evaluate(
    run_dir: str | Path,
    *,
    episodes: int = 20,
    seed: int = 0,
    controllers: Sequence[str] = CONTROLLERS,
    show_progress: bool = True,
    threads: int | None = None,
    out: str | Path | None = None,
) -> dict[str, Any]:
    """Evaluate (module docstring) and write ``out`` (``RUN_DIR/eval/`` by default); returns the results
    dict. ``threads``: torch intra-op threads to set (0: as the run would, the cores over its env
    workers; None: leave torch's setting alone). The CLI passes 0: two env threads on two cores with two
    intra-op threads each ran the evaluation ~4x slower per episode than training."""
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path} not found (is {run_dir} a run directory?)")
    if episodes < 2:
        raise ValueError(f"--episodes must be >= 2 (a confidence interval needs two), got {episodes}")
    extra = ("grow_all:", "grow_all" + STYLE_SEP, PLAN_PREFIX)
    known = (*CONTROLLERS, *PPO_CONTROLLERS)
    unknown = [c for c in controllers if c not in known and not c.startswith(extra)]
    if unknown or not controllers:
        raise ValueError(
            f"unknown controller(s) {unknown}; choose from {', '.join(CONTROLLERS)} (or {EXTRA_CONTROLLERS})"
        )
    cfg = from_dict(RunConfig, json.loads(cfg_path.read_text()))
    if threads is not None:
        torch.set_num_threads(threads or cfg.torch_threads())
    checkpoint = None
    if any(c in PPO_CONTROLLERS for c in controllers):
        ckpt = run_dir / "checkpoint.pt"
        if not ckpt.is_file():
            raise FileNotFoundError(f"{ckpt} not found: evaluate a run that finished an update")
        checkpoint = load_checkpoint(ckpt, map_location=cfg.env.device)
        if "trainer" not in checkpoint:
            raise ValueError(f"{ckpt} has no 'trainer' entry: not a checkpoint of python -m esper.shell.run")
    results = evaluate_config(cfg, controllers, episodes=episodes, seed=seed, checkpoint=checkpoint,
                              show_progress=show_progress)  # fmt: skip
    results["meta"]["run_dir"] = str(run_dir)
    write_eval(Path(out) if out is not None else run_dir / "eval", results)
    return results


def evaluate_config(cfg: RunConfig, controllers: Sequence[str], *, episodes: int, seed: int,
                    checkpoint: dict | None = None, show_progress: bool = True,
                    task: Task | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``controllers`` on ``episodes`` evaluation episodes of the task ``cfg`` describes and
    summarize (the ``results.json`` layout, without writing it)."""
    task = task if task is not None else cfg.env.build_task()
    t0 = time.perf_counter()
    records: dict[str, list[dict]] = {}
    T = cfg.lifecycle.max_epochs
    with progress(len(controllers) * episodes * T, desc="evaluate", enabled=show_progress) as bar:
        for name in controllers:
            bar.set_postfix(controller=name)
            on_epoch = lambda ev: bar.update(len(ev["val_acc"]))
            records[name] = run_episodes(cfg, task, name, range(episodes), eval_seed=seed,
                                         checkpoint=checkpoint, on_epoch=on_epoch)  # fmt: skip
    return {
        "controllers": {name: summarize(recs) for name, recs in records.items()},
        "correlations": correlations([r for recs in records.values() for r in recs]),
        "meta": {
            "run_dir": None,
            "task": cfg.env.task,
            "episodes": episodes,
            "eval_seed": seed,
            "ppo_acts": "; ".join(f"{name} {how}" for name, (_, how) in PPO_READOUTS.items()),
            "grow_all_blueprint": GROW_ALL_BLUEPRINT.get(task.family),
            "param_weight": cfg.reward.param_weight,
            "param_budget": cfg.reward.param_budget,
            "param_over_weight": cfg.reward.param_over_weight,
            "ppo_param_cap": cfg.ppo.param_cap,  # the learned controller's hard cap (0: none)
            "reward_mode": cfg.reward.mode.name,
            "trained_updates": int(checkpoint["progress"]["update"]) if checkpoint else None,
            "torch_threads": torch.get_num_threads(),  # the numbers repeat at the same seed and threads
            "seconds": time.perf_counter() - t0,
        },
    }


# ------------------------------------------------------------------------------------------ writing
COLORS = {"ppo": "#d62828", "ppo_greedy": "#9d0208", "ppo_mixed": "#7b2cbf", "static": "#6c757d",
          "random": "#f4a261", "heuristic": "#2a9d8f", "grow_all": "#264653"}  # fmt: skip


def write_eval(out: Path, results: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, allow_nan=True))
    plots = [
        plot_acc_vs_params(results, out / "plots" / "acc_vs_params.png"),
        plot_acc_over_epochs(results, out / "plots" / "acc_over_epochs.png"),
    ]
    plots = [p for p in plots if p is not None]
    (out / "report.md").write_text(report_markdown(results, [p.relative_to(out) for p in plots]))
    return out


def new_figure(size=(7.0, 4.5)):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=110)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def finish_figure(fig, ax, path: Path, *, legend_size: int = 8, ncol: int = 1) -> Path:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size, ncol=ncol)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    return path


def plot_acc_vs_params(results: dict, path: Path, title: str | None = None) -> Path | None:
    """Final test accuracy vs parameters added, one point per episode, a diamond with its 95 % CI per
    controller. ``results``: ``{"controllers": {name: {"per_episode", "test_acc_mean",
    "test_acc_ci95", "params_added_mean"}}}`` (:func:`evaluate`'s, or bench.growth's pooled one)."""
    ctl = results["controllers"]
    if not ctl:
        return None
    fig, ax = new_figure()
    for name, s in ctl.items():
        eps = s["per_episode"]
        ax.scatter([e["params_added"] for e in eps], [e["final_test_acc"] for e in eps], s=14, alpha=0.6,
                   color=COLORS.get(name), label=f"{name} ({s['test_acc_mean']:.1f} %)")  # fmt: skip
        m, (lo, hi) = s["test_acc_mean"], s["test_acc_ci95"]
        ax.errorbar([s["params_added_mean"]], [m], yerr=[[m - lo], [hi - m]], color=COLORS.get(name),
                    marker="D", markersize=7, markeredgecolor="black", capsize=4)  # fmt: skip
    ax.set_xlabel("parameters added to the host")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title(title or "held-out accuracy vs growth (one point per episode; diamond: mean, 95 % CI)")
    return finish_figure(fig, ax, path)


def plot_acc_over_epochs(results: dict, path: Path) -> Path | None:
    ctl = results["controllers"]
    if not ctl:
        return None
    fig, ax = new_figure()
    for name, s in ctl.items():
        curves = np.array([c for c in (s.get("val_acc_curve_mean"),) if c])
        if not curves.size:
            continue
        x = np.arange(1, curves.shape[1] + 1)
        ax.plot(x, curves[0], color=COLORS.get(name), label=name)
        ax.scatter([x[-1] + 1], [s["test_acc_mean"]], color=COLORS.get(name), marker="*", s=80)
    ax.set_xlabel("host epoch (the star: final test accuracy)")
    ax.set_ylabel("validation accuracy (%), mean over episodes")
    return finish_figure(fig, ax, path)


def _f(x: float, nd: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _price(meta: dict) -> str:
    """The held-out objective's parameter price in words (``2.0 × added / host parameters``)."""
    text = f"{meta['param_weight']} × added / host parameters"
    if meta.get("param_budget", 0) > 0:
        over = f"(added − {meta['param_budget']:g}, where > 0)"
        text += f" − {meta['param_over_weight']} × {over} / host parameters"
    return text


def _blend(summary: dict) -> str:
    """``LINEAR_ADD 80 %, FAST 60 %, alpha 1.0 90 %``: each blend setting's most common value."""
    parts = []
    for k, counts in summary.get("blend_counts", {}).items():
        if counts:
            value, n = next(iter(counts.items()))
            share = 100 * n / sum(counts.values())
            parts.append(f"{'alpha ' if k == 'alpha_target' else ''}{value} {share:.0f} %")
    return ", ".join(parts) or "-"


def report_markdown(results: dict, plots: Sequence[Path]) -> str:
    meta, ctl, corr = results["meta"], results["controllers"], results["correlations"]
    static = ctl.get("static")
    lines = [
        f"# Evaluation of `{meta['run_dir']}`",
        "",
        f"{meta['episodes']} episodes per controller on fresh hosts (evaluation seed "
        f"{meta['eval_seed']}; the same host seeds for every controller; {meta['torch_threads']} torch "
        f"thread(s): another count trains the hosts to other numbers), task `{meta['task']}`; "
        f"{meta['ppo_acts']}. Accuracy is the final host's **test** accuracy (held out "
        "from host training and from the controller); intervals are 95 % Student-t over episodes."
        + (
            f" The learned controller may hold at most {meta['ppo_param_cap']:g} seed parameters "
            "(`ppo.param_cap`); the baselines have no cap."
            if meta.get("ppo_param_cap", 0) > 0 else ""
        ),
        "",
        "| controller | test acc % | 95 % CI | gain over static | params added | return | fossilized |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for name, s in ctl.items():
        gain = _f(s["test_acc_mean"] - static["test_acc_mean"]) if static else "n/a"
        lo, hi = s["test_acc_ci95"]
        lines.append(
            f"| {name} | {_f(s['test_acc_mean'])} | [{_f(lo)}, {_f(hi)}] | {gain} | "
            f"{_f(s['params_added_mean'], 0)} | {_f(s['return_mean'], 2)} | {_f(s['n_fossilized_mean'], 2)} |"
        )
    lines += [
        "",
        f"Spearman correlation of the episode return with the held-out outcome, over all "
        f"{corr['n_episodes']} episodes: test accuracy {_f(corr['return_vs_test_acc'], 3)}, test accuracy "
        f"per 1k parameters {_f(corr['return_vs_test_acc_per_kparam'], 3)}, held-out objective (test "
        f"accuracy − {_price(meta)}) "
        f"{_f(corr['return_vs_test_objective'], 3)}.",
        "",
        "What each controller grew: the seeds blended into its final hosts (`slot=blueprint`, as in the "
        "`grow:` placements; episodes out of "
        f"{meta['episodes']}), the mean epoch of its first germination, and how its germinations "
        "blend (the most common style, tempo and alpha target, with their share of all germinations).",
        "",
        "| controller | final hosts' seeds (episodes) | first germination, epoch | blend |",
        "|---|---|---:|---|",
    ]
    for name, s in ctl.items():
        counts = s["grown_counts"]
        plans = ", ".join(f"`{k or 'none'}` ({n})" for k, n in list(counts.items())[:3])
        plans += f", {len(counts) - 3} more" if len(counts) > 3 else ""
        first = s["first_germination_mean"]
        lines.append(f"| {name} | {plans} | {'-' if first is None else _f(first)} | {_blend(s)} |")
    lines.append("")
    lines += [f"![{p.stem}]({p.as_posix()})" for p in plots]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    p = OneLineParser(
        prog=PROG,
        allow_abbrev=False,
        description="Evaluate a trained controller against baselines on fresh hosts.",
    )
    p.add_argument("run_dir", help="a run directory written by python -m esper.shell.run")
    p.add_argument("--episodes", type=int, default=20, help="episodes per controller (default 20)")
    p.add_argument("--seed", type=int, default=0, help="evaluation seed: host seeds derive from it (0)")
    p.add_argument("--controllers", default=",".join(CONTROLLERS),
                   help=f"comma-separated subset of {','.join(CONTROLLERS)}, or ppo_mixed (samples when and "
                        "where, takes the most likely blueprint and blend); grow_all:BLUEPRINT grows "
                        "another blueprint than the task's best; grow:b0=conv_heavy+b2=depthwise grows only "
                        "those slots, each with its blueprint; either may end in @STYLE, @TEMPO, @ALPHA to "
                        "blend otherwise than LINEAR_ADD, FAST, 1.0 (grow_all@LINEAR_MULTIPLY, "
                        "grow:b0=conv_heavy@STANDARD@0.7)")  # fmt: skip
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (0, the default: as the run would, the cores over its env "
                        "workers); the numbers repeat at the same --seed and thread count")  # fmt: skip
    p.add_argument("--out", type=Path, default=None,
                   help="where results.json, report.md and plots/ go (default RUN_DIR/eval)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.threads < 0:
        return report(PROG, ValueError(f"--threads must be >= 0, got {args.threads}"))
    names = [c.strip() for c in args.controllers.split(",") if c.strip()]
    try:
        results = evaluate(args.run_dir, episodes=args.episodes, seed=args.seed, controllers=names,
                           show_progress=not args.no_progress, threads=args.threads,
                           out=args.out)  # fmt: skip
    except (OSError, ValueError) as e:
        return report(PROG, e)
    for name, s in results["controllers"].items():
        lo, hi = s["test_acc_ci95"]
        print(f"{name:>10}: test acc {s['test_acc_mean']:5.1f} % [{lo:5.1f}, {hi:5.1f}]  "
              f"params added {s['params_added_mean']:7.0f}  return {s['return_mean']:6.2f}")  # fmt: skip
    print(repeat_line(args.seed, results["meta"]["torch_threads"]))
    print(f"results: {(args.out or Path(args.run_dir) / 'eval') / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
