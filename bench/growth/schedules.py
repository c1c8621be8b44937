"""Fixed schedules, trained nothing: the sweep (``static`` and ``grow_all:<blueprint>``), the placement
stage (fixed placements on the sweep's hosts) and the plans stage (fixed plans on the learn stage's
hosts, paired with the learned controllers of those seeds)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.growth.pooling import BASELINES, _arm, _paired, shares
from esper.shell.config.presets import preset
from esper.shell.env.tasks import GROW_ALL_BLUEPRINT
from esper.shell.eval.stats import mean_ci95
from esper.shell.host.blueprints import BLUEPRINTS

#: The preset the fixed-schedule stages read: the suite's configuration (22 updates on batches of 128),
#: the hosts every committed growth table ran on; the default trains its hosts on batches of 256 since
#: issue 90, so its fixed plans would not be those tables' (``--train-args "--preset mnist1d"`` for the
#: learn stage's).
FIXED_PRESET = "mnist1d"


# --------------------------------------------------------------------------------------------- sweep
def sweep(episodes: int, seed: int) -> dict[str, Any]:
    family = preset(FIXED_PRESET).env.build_task().family
    out = _fixed_schedules(
        ["static"] + [f"grow_all:{b}" for b in BLUEPRINTS[family] if b != "noop"], episodes, seed
    )
    best = max((r for r in out["rows"] if r["controller"] != "static"), key=lambda r: r["test_acc_mean"])
    return {**out, "best": best["controller"], "grow_all_blueprint": GROW_ALL_BLUEPRINT[family]}


# ----------------------------------------------------------------------------------------- placement
#: The fixed placements the placement stage measures (cnn1d family): every slot alone with the best
#: blueprint, the cheaper blueprints in the first slot, and two- and three-seed mixes.
PLACEMENTS = (
    "grow:b0=conv_heavy", "grow:b1=conv_heavy", "grow:b2=conv_heavy",
    "grow:b0=conv_light", "grow:b0=depthwise",
    "grow:b0=conv_heavy+b1=depthwise", "grow:b0=conv_heavy+b2=depthwise",
    "grow:b0=conv_heavy+b2=conv_light", "grow:b0=conv_heavy+b1=conv_heavy",
    "grow:b0=conv_heavy+b2=conv_heavy",
    "grow:b0=conv_heavy+b1=depthwise+b2=depthwise", "grow_all",
)  # fmt: skip


def placement(episodes: int, seed: int) -> dict[str, Any]:
    return _fixed_schedules(["static", *PLACEMENTS], episodes, seed)


def _fixed_schedules(names: list[str], episodes: int, seed: int) -> dict[str, Any]:
    """``names`` (``static`` first) on the same ``episodes`` fresh hosts; gains paired with static's."""
    from esper.shell.eval.episodes import compare_on_config

    cfg = preset(FIXED_PRESET)
    torch.set_num_threads(cfg.torch_threads())  # as a run would: two env threads, one intra-op thread each
    t0 = time.perf_counter()
    res = compare_on_config(cfg, names, episodes=episodes, seed=seed, show_progress=True)
    static = res["controllers"]["static"]
    rows = []
    for name, s in res["controllers"].items():
        gains = [
            e["final_test_acc"] - b["final_test_acc"] for e, b in zip(s["per_episode"], static["per_episode"])
        ]
        gm, (glo, ghi) = mean_ci95(gains)  # paired: the same host seeds
        rows.append(
            {
                "controller": name,
                "test_acc_mean": s["test_acc_mean"],
                "test_acc_ci95": s["test_acc_ci95"],
                "gain_mean": gm,
                "gain_ci95": [glo, ghi],
                "params_added_mean": s["params_added_mean"],
                "fossilized_mean": s["n_fossilized_mean"],
            }
        )
    return {"episodes": episodes, "eval_seed": seed, "rows": rows, "seconds": time.perf_counter() - t0}


# --------------------------------------------------------------------------------------------- plans
#: The fixed plans the plans stage holds the learned controllers against by default: the cheapest
#: placement that met the efficiency target in the placement stage, blended as the fixed schedules blend
#: (LINEAR_ADD, FAST, alpha 1.0), then with the tempo and alpha target the learned controllers chose
#: most often, one at a time and together.
PLANS = (
    "grow:b0=conv_heavy", "grow:b0=conv_heavy@STANDARD", "grow:b0=conv_heavy@0.7",
    "grow:b0=conv_heavy@0.5", "grow:b0=conv_heavy@STANDARD@0.7",
)  # fmt: skip


def plans(
    names: list[str], seeds: int, episodes: int, first_seed: int = 0, learned_files: list[Path] | None = None,
    preset_name: str = FIXED_PRESET, overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Fixed schedules ``names`` on the learn stage's evaluation hosts, without training anything: for
    training seed k (``first_seed`` on), the preset's config with ``seed`` k on the ``episodes`` hosts
    of evaluation seed ``1000 + k``, with ``static`` and ``grow_all`` beside them. Per schedule, the mean
    over seeds of each seed's mean test accuracy (Student-t 95 % interval over seeds), the parameters
    added, and the shares of ``grow_all``'s gain and parameters.

    ``learned_files``: learn-stage results files of those seeds (not pooled ones). Each learned
    controller is then paired with each schedule by training seed (learned minus schedule, the unit the
    seed's mean over its hosts). The files' episodes must be on the same host seeds; ``hosts`` says
    whether ``grow_all`` scored identically there, episode for episode (the same machine and code), and
    if not by how much its per-seed means differ (another CPU's float sums)."""
    from esper.shell.eval.episodes import compare_on_config

    if not names:
        raise ValueError("plans: no fixed schedule to measure")
    measured = ["static", "grow_all", *[n for n in names if n not in ("static", "grow_all")]]
    ks = list(range(first_seed, first_seed + seeds))
    t0 = time.perf_counter()
    episodes_by: dict[str, list[list[dict]]] = {n: [] for n in measured}
    for k in ks:
        cfg = preset(preset_name, {**(overrides or {}), "seed": k})
        torch.set_num_threads(cfg.torch_threads())  # as the learn stage's evaluation does
        res = compare_on_config(cfg, measured, episodes=episodes, seed=1000 + k, show_progress=True)
        for n in measured:
            episodes_by[n].append(res["controllers"][n]["per_episode"])
    seed_mean = lambda n, field: [float(np.mean([e[field] for e in eps])) for eps in episodes_by[n]]
    acc = {n: seed_mean(n, "final_test_acc") for n in measured}
    params = {n: seed_mean(n, "params_added") for n in measured}
    out: dict[str, Any] = {
        "training_seeds": ks, "episodes_per_seed": episodes, "preset": preset_name,
        "overrides": overrides or {}, "rows": plan_rows(acc, params),
        "per_episode": {n: [e for eps in episodes_by[n] for e in eps] for n in measured},
        "seconds": time.perf_counter() - t0,
    }  # fmt: skip
    if learned_files:
        out["learned"] = _against_learned(learned_files, ks, episodes_by, acc)
    return out


def plan_rows(acc: dict[str, list[float]], params: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Per controller (``static`` and ``grow_all`` among them), from its per-seed mean test accuracy and
    parameters added: the mean over seeds with a Student-t 95 % interval, and its shares of
    ``grow_all``'s gain over ``static`` (None where ``grow_all`` gains nothing) and of its parameters."""
    static, grow_all = float(np.mean(acc["static"])), float(np.mean(acc["grow_all"]))
    params_all = float(np.mean(params["grow_all"]))
    rows = []
    for n in acc:
        m, (lo, hi) = mean_ci95(acc[n])
        p = float(np.mean(params[n]))
        gain_share, params_share = shares(m, p, static, grow_all, params_all)
        rows.append({
            "controller": n, "test_acc_mean": m, "test_acc_ci95": [lo, hi], "per_seed_test_acc": acc[n],
            "params_added_mean": p, "gain_share_of_grow_all": gain_share,
            "params_share_of_grow_all": params_share,
        })  # fmt: skip
    return rows


def _against_learned(files: list[Path], ks: list[int], episodes_by: dict[str, list[list[dict]]],
                     acc: dict[str, list[float]]) -> dict[str, Any]:  # fmt: skip
    by_seed, info = _arm(files, "learned")
    missing = [k for k in ks if k not in by_seed]
    if missing:
        raise ValueError(f"plans: the learned files hold no runs of training seed(s) {missing}")
    for i, k in enumerate(ks):
        hosts = lambda eps: [e["host_seed"] for e in eps]
        if hosts(by_seed[k]["grow_all"]) != hosts(episodes_by["grow_all"][i]):
            raise ValueError(f"plans: training seed {k}'s learned episodes ran on other hosts (another "
                             "--episodes, or evaluation seed?): nothing to pair")  # fmt: skip
    there = [[e["final_test_acc"] for e in by_seed[k]["grow_all"]] for k in ks]
    here = [[e["final_test_acc"] for e in eps] for eps in episodes_by["grow_all"]]
    seed_diff = [abs(float(np.mean(a)) - float(np.mean(b))) for a, b in zip(there, here)]
    ep_diff = [abs(a - b) for ta, he in zip(there, here) for a, b in zip(ta, he)]
    learned_names = [c for c in by_seed[ks[0]] if c not in BASELINES]
    plans_ = [n for n in acc if n not in ("static", "grow_all")]
    paired = {
        c: {n: _paired(acc[n], [float(np.mean([e["final_test_acc"] for e in by_seed[k][c]])) for k in ks])
            for n in plans_}
        for c in learned_names
    }  # fmt: skip
    from esper.shell.eval.controllers import PLAN_PREFIX, STYLE_SEP

    flat = lambda per_seed: [e for eps in per_seed for e in eps]
    bare = [n for n in plans_ if n.startswith(PLAN_PREFIX) and STYLE_SEP not in n]  # placements, no blend
    misses = {
        c: {n: split_by_placement(flat(by_seed[k][c] for k in ks), flat(episodes_by[n]),
                                  n.removeprefix(PLAN_PREFIX)) for n in bare}
        for c in learned_names
    }  # fmt: skip
    return {
        **info,
        "paired": paired,  # learned minus plan, per training seed ("variant_better": the learned one)
        "by_placement": misses,  # learned minus plan, episode by episode, split by holding the placement
        "hosts": {
            "identical": there == here,
            "grow_all_seed_mean_max_abs_diff": max(seed_diff),
            "grow_all_episode_median_abs_diff": float(np.median(ep_diff)),
        },
    }


def split_by_placement(learned: list[dict], plan: list[dict], placement: str) -> dict[str, Any]:
    """Where a learned controller's deficit against a fixed placement comes from. ``learned`` and
    ``plan`` are episodes on the same hosts, in the same order; ``placement`` is the plan's
    (``b0=conv_heavy+b2=depthwise``). Each learned episode's final host either holds every seed of the
    placement (``holds``) or not (``misses``); for each group: its episodes, the mean of learned minus
    plan over them, and that group's share of the mean over all episodes (``contribution``: the two
    contributions add up to ``mean``). ``misses["held"]`` counts what the missing hosts hold in the plan's
    slots instead (``b0=conv_small``, ``b0 empty``), most frequent first."""
    if [e["host_seed"] for e in learned] != [e["host_seed"] for e in plan]:
        raise ValueError("split_by_placement: the learned and planned episodes ran on other hosts")
    want = set(placement.split("+"))
    slots = sorted({w.split("=")[0] for w in want})
    groups: dict[str, list[float]] = {"holds": [], "misses": []}
    held: dict[str, int] = {}  # what the missing hosts hold in the plan's slots instead
    for e, p in zip(learned, plan):
        have = set(e["grown"].split("+")) if e["grown"] else set()
        hit = want <= have
        groups["holds" if hit else "misses"].append(e["final_test_acc"] - p["final_test_acc"])
        if not hit:
            there = {h.split("=")[0]: h for h in have}
            key = "+".join(there.get(s, f"{s} empty") for s in slots)
            held[key] = held.get(key, 0) + 1
    n = len(learned)
    out: dict[str, Any] = {"episodes": n, "mean": sum(groups["holds"] + groups["misses"]) / n}
    for g, d in groups.items():
        out[g] = {"episodes": len(d), "mean": float(np.mean(d)) if d else None, "contribution": sum(d) / n}
    out["misses"]["held"] = dict(sorted(held.items(), key=lambda kv: (-kv[1], kv[0])))
    return out
