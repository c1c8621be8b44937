"""Time to quality: the default's held-out greedy controller, update by update, against wall-clock time.

    python -m bench.ttq --label before --first-seed 600 --seeds 5 --jobs 2
    python -m bench.ttq --label after --first-seed 600 --seeds 5 --jobs 2 --train-args "--updates 11"
    python -m bench.ttq --pool bench/results/perf/ttq     # pool every label's seeds: table and figure

Each training seed ``k`` trains the default (with ``--train-args`` on top) in this process, one torch
thread, keeping the controller after every ``--every`` updates; the wall clock runs from the run's
construction (data, hosts, learner) to each update's end. Then, on ``--episodes`` fresh hosts (evaluation
seed 1000 + k, the protocol of docs/results.md: hosts no training run saw, the same for every controller
of the seed), it evaluates ``grow_all`` and ``static`` once, and each kept controller by its most likely
actions (``ppo_greedy``). Its quality at an update is its **share of grow_all's gain**,
``(greedy - static) / (grow_all - static)`` in test accuracy, pooled over seeds as a ratio of means (the
README's "gain share"). A seed's file (``LABEL/seedK.json``) is kept and re-read, so a stopped run goes on
where it stopped. The evaluation's own time is recorded but not on the curve: the curve is the run's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from esper.shell.eval.stats import mean_ci95

OUT = Path(__file__).resolve().parent / "results" / "perf" / "ttq"
#: Evaluation seeds of training seed k (bench.growth's protocol).
EVAL_SEED_BASE = 1000


def train_and_measure(
    k: int, label: str, train_args: str, every: int, episodes: int, out: Path, draw_base: int | None = None
) -> dict:
    """Training seed ``k``: its run, the controller kept every ``every`` updates, each evaluated greedy on
    ``episodes`` fresh hosts beside ``grow_all`` and ``static``; with ``draw_base``, the last controller
    also greedy beside ``random`` and ``static`` on the same hosts of the fresh data draw ``draw_base + k``.
    Writes and returns ``out/label/seedK.json``, with the hash of the configuration it trained
    (:func:`esper.shell.config.presets.config_hash`)."""
    import dataclasses

    import torch

    torch.set_num_threads(1)
    from esper.shell.common.revision import git_revision, machine
    from esper.shell.config.presets import config_hash
    from esper.shell.eval.episodes import compare_on_config
    from esper.shell.run import build_parser, resolve_config
    from esper.shell.runtime.training import TrainingRun

    path = out / label / f"seed{k}.json"
    if path.is_file():
        return json.loads(path.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        flags = [
            *shlex.split(train_args),
            "--seed",
            str(k),
            "--eval_episodes",
            "0",
            "--report",
            "false",
            "--progress",
            "false",
            "--threads",
            "1",
            "--checkpoint_every",
            "1",
            "--run_dir",
            tmp,
            "--name",
            f"ttq{k}",
        ]
        cfg = resolve_config(build_parser().parse_args(flags))
        kept: dict[int, dict] = {}
        clock: dict[int, tuple[float, float]] = {}  # update -> (wall, CPU) seconds since the start
        revision = (
            git_revision()
        )  # the checkout as the run starts (a commit landing meanwhile is not the code)
        t0, c0 = time.perf_counter(), time.process_time()
        run = TrainingRun(cfg, Path(tmp) / cfg.name)
        built = time.perf_counter() - t0

        save = run.save

        def keep(payload: dict) -> Path:  # every checkpoint the run writes, kept in memory as well
            update = payload["progress"]["update"]
            clock[update] = (time.perf_counter() - t0, time.process_time() - c0)
            if update % every == 0 or update == cfg.updates:
                kept[update] = payload
            return save(payload)

        run.save = keep  # type: ignore[method-assign]
        status = run.train()
        trained = time.perf_counter() - t0
        if status:
            raise RuntimeError(f"training seed {k} stopped with status {status}")
        t1 = time.perf_counter()
        eval_seed = EVAL_SEED_BASE + k
        fixed = compare_on_config(
            cfg, ["grow_all", "static"], episodes=episodes, seed=eval_seed, show_progress=False
        )["controllers"]
        grow_all, static = fixed["grow_all"]["test_acc_mean"], fixed["static"]["test_acc_mean"]
        curve = []
        for update, payload in sorted(kept.items()):
            res = compare_on_config(
                cfg,
                ["ppo_greedy"],
                episodes=episodes,
                seed=eval_seed,
                checkpoint=payload,
                show_progress=False,
            )["controllers"]["ppo_greedy"]
            curve.append(
                {
                    "update": update,
                    "seconds": clock[update][0],
                    "cpu_seconds": clock[update][1],
                    "test_acc": res["test_acc_mean"],
                    "params_added": res["params_added_mean"],
                    "share": _share(res["test_acc_mean"], grow_all, static),
                }
            )
        fresh_draw = None
        if draw_base is not None:
            draw_cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, data_seed=draw_base + k))
            res = compare_on_config(
                draw_cfg,
                ["ppo_greedy", "random", "static"],
                episodes=episodes,
                seed=eval_seed,
                checkpoint=kept[cfg.updates],
                show_progress=False,
            )["controllers"]
            fresh_draw = {"data_seed": draw_base + k, **{n: r["test_acc_mean"] for n, r in res.items()}}
    record = {
        "label": label,
        "seed": k,
        "train_args": train_args,
        "episodes": episodes,
        "eval_seed": eval_seed,
        "updates": cfg.updates,
        "build_seconds": built,
        "train_seconds": trained,
        "train_cpu_seconds": clock[cfg.updates][1],
        "eval_seconds": time.perf_counter() - t1,
        "grow_all": grow_all,
        "static": static,
        "grow_all_params": fixed["grow_all"]["params_added_mean"],
        "curve": curve,
        "fresh_draw": fresh_draw,
        "config_hash": config_hash(cfg),
        "revision": revision,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    return record


# ------------------------------------------------------------------------------------------- pooling
def _share(acc: float, grow_all: float, static: float) -> float:
    """``acc``'s share of grow_all's gain over the static host (NaN where growing all gained nothing)."""
    return (acc - static) / (grow_all - static) if grow_all != static else float("nan")


def pool(folder: Path) -> dict:
    """Every label's seeds under ``folder``: per update, the share of grow_all's gain pooled over seeds
    (ratio of means) and the median wall time; each seed's final share."""
    labels = {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        seeds = [json.loads(f.read_text()) for f in sorted(sub.glob("seed*.json"))]
        if not seeds:
            continue
        updates = sorted({p["update"] for s in seeds for p in s["curve"]})
        rows = []
        for u in updates:
            points = [(s, p) for s in seeds for p in s["curve"] if p["update"] == u]
            if len(points) < len(seeds):
                continue
            gain = statistics.mean(p["test_acc"] - s["static"] for s, p in points)
            full = statistics.mean(s["grow_all"] - s["static"] for s, _ in points)
            rows.append(
                {
                    "update": u,
                    "seconds_median": statistics.median(p["seconds"] for _, p in points),
                    "cpu_seconds_median": statistics.median(p["cpu_seconds"] for _, p in points),
                    "share": gain / full if full else float("nan"),
                    "test_acc": statistics.mean(p["test_acc"] for _, p in points),
                    "per_seed_share": [round(p["share"], 4) for _, p in points],
                }
            )
        first = seeds[0]
        labels[sub.name] = {
            "train_args": first["train_args"],
            "seeds": [s["seed"] for s in seeds],
            "episodes": first["episodes"],
            "revision": sorted({s["revision"] for s in seeds}),
            "machine": sorted({s["machine"] for s in seeds}),
            "dates": sorted({s["date"] for s in seeds}),
            "train_seconds_median": statistics.median(s["train_seconds"] for s in seeds),
            "train_cpu_seconds_median": statistics.median(s["train_cpu_seconds"] for s in seeds),
            "grow_all": statistics.mean(s["grow_all"] for s in seeds),
            "static": statistics.mean(s["static"] for s in seeds),
            "curve": rows,
            "last": _last(seeds),
            "config_hash": sorted({s.get("config_hash", "") for s in seeds}),
            "worst_seed": min(
                ({"seed": s["seed"], "share": s["curve"][-1]["share"]} for s in seeds),
                key=lambda r: r["share"],
            ),
            "fresh_draw": _fresh_draw(seeds),
        }
    return labels


def _last(seeds: list[dict]) -> dict:
    """The last update's reading over seeds, each a mean with its 95 % interval over the seeds (a seed's
    value is its mean over its fresh hosts): the greedy controller's test accuracy, grow_all's, static's,
    and the controller's gain over static, paired by seed."""
    last = [s["curve"][-1] for s in seeds]
    values = {
        "ppo_greedy": [p["test_acc"] for p in last],
        "grow_all": [s["grow_all"] for s in seeds],
        "static": [s["static"] for s in seeds],
        "gain_over_static": [p["test_acc"] - s["static"] for s, p in zip(seeds, last, strict=True)],
    }
    out: dict = {
        "update": last[0]["update"],
        "params_added": statistics.mean(p["params_added"] for p in last),
    }
    for name, xs in values.items():
        mean, (lo, hi) = mean_ci95(xs)
        out[name] = {"mean": mean, "ci95": [lo, hi]}
    return out


def _fresh_draw(seeds: list[dict]) -> dict | None:
    """The last controller on each seed's fresh data draw: greedy minus random per seed, their mean and the
    worst seed (None where no seed was read on one)."""
    drawn = [s for s in seeds if s.get("fresh_draw")]
    if not drawn:
        return None
    gaps = {s["seed"]: s["fresh_draw"]["ppo_greedy"] - s["fresh_draw"]["random"] for s in drawn}
    worst = min(gaps, key=gaps.__getitem__)
    return {
        "seeds": len(drawn),
        "greedy_minus_random": gaps,
        "mean": statistics.mean(gaps.values()),
        "worst_seed": {"seed": worst, "gap": gaps[worst]},
    }


def write_pooled(folder: Path) -> Path:
    labels = pool(folder)
    lines = [
        "# Time to quality: the default's held-out greedy controller against wall-clock time",
        "",
        "Per training seed: the run in one process, one torch thread; its controller every few updates, "
        "greedy on fresh hosts (evaluation seed 1000 + k) beside `grow_all` and `static`; quality = share "
        "of grow_all's gain (ratio of means over seeds); time = the run's wall clock and its process's CPU "
        "time to that update (medians over seeds), evaluation excluded. CPU time is the steadier axis when "
        "other jobs share the machine; the wall time of the README's command alone on the VM is measured "
        "separately (docs/performance.md).",
        "",
    ]
    for name, lab in labels.items():
        lines += [
            f"## {name}: `{lab['train_args'] or '(the default)'}`",
            "",
            f"Seeds {lab['seeds']}, {lab['episodes']} hosts each; "
            f"revision {', '.join(lab['revision'])}; "
            f"machine {'; '.join(lab['machine'])}; {', '.join(lab['dates'])}. Training "
            f"{lab['train_seconds_median']:.0f} s wall, "
            f"{lab['train_cpu_seconds_median']:.0f} s CPU (medians); "
            f"grow_all {lab['grow_all']:.1f} %, static "
            f"{lab['static']:.1f} %.",
            "",
            _last_line(lab["last"]),
            "",
            f"Worst seed at the last update: {lab['worst_seed']['seed']}, "
            f"share {lab['worst_seed']['share']:.3f}"
            + (
                f"; on a fresh data draw greedy minus random {lab['fresh_draw']['mean']:+.1f} points "
                f"(mean over {lab['fresh_draw']['seeds']} seeds), worst seed "
                f"{lab['fresh_draw']['worst_seed']['seed']} {lab['fresh_draw']['worst_seed']['gap']:+.1f}"
                if lab["fresh_draw"]
                else ""
            )
            + f". Configuration hash {', '.join(h or '(not recorded)' for h in lab['config_hash'])}.",
            "",
            "| update | wall s | CPU s | share of grow_all's gain | test acc % | per seed |",
            "|---:|---:|---:|---:|---:|---|",
        ]
        lines += [
            f"| {r['update']} | {r['seconds_median']:.0f} | {r['cpu_seconds_median']:.0f} | "
            f"{r['share']:.3f} | {r['test_acc']:.1f} | "
            f"{', '.join(f'{x:.2f}' for x in r['per_seed_share'])} |"
            for r in lab["curve"]
        ]
        lines.append("")
    md = folder / "README.md"
    md.write_text("\n".join(lines))
    (folder / "pooled.json").write_text(json.dumps(labels, indent=1))
    _plot(labels, folder / "curve.png")
    return md


def _last_line(last: dict) -> str:
    def cell(name: str) -> str:
        r = last[name]
        return f"{r['mean']:.1f} [{r['ci95'][0]:.1f}, {r['ci95'][1]:.1f}]"

    return (
        f"At update {last['update']} (means over seeds, 95 % intervals): ppo_greedy {cell('ppo_greedy')} % "
        f"with {last['params_added']:.0f} parameters added, grow_all {cell('grow_all')} %, static "
        f"{cell('static')} %; the controller's gain over static {cell('gain_over_static')} points."
    )


def _plot(labels: dict, path: Path) -> None:
    from esper.shell.telemetry.plots import finish_figure, new_figure

    fig, ax = new_figure()
    for name, lab in labels.items():
        xs = [r["cpu_seconds_median"] for r in lab["curve"]]
        ax.plot(
            xs, [r["share"] for r in lab["curve"]], marker="o", label=f"{name} ({len(lab['seeds'])} seeds)"
        )
    ax.axhline(0.9, color="grey", linestyle="--", linewidth=1, label="0.90 of grow_all's gain")
    ax.set_xlabel("training CPU time, s (the run's process, median over seeds)")
    ax.set_ylabel("greedy share of grow_all's gain (fresh hosts)")
    ax.set_title("Time to quality: the default run")
    finish_figure(fig, ax, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ttq", description=__doc__.split("\n\n")[0])
    p.add_argument("--label", default="", help="name of this configuration (a folder under --out)")
    p.add_argument("--first-seed", type=int, default=600)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument(
        "--seed-list", default="", help="comma-separated training seeds (instead of --first-seed/--seeds)"
    )
    p.add_argument(
        "--draw-base",
        type=int,
        default=None,
        help="also read the last controller, random and static on the fresh data draw BASE + k",
    )
    p.add_argument("--train-args", default="", help="run flags on top of the default, e.g. '--updates 11'")
    p.add_argument("--every", type=int, default=2, help="evaluate the controller every N updates")
    p.add_argument("--episodes", type=int, default=8, help="fresh hosts per evaluation")
    p.add_argument("--jobs", type=int, default=1, help="seeds trained at once, one process and thread each")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument(
        "--pool", type=Path, default=None, help="only pool this folder's labels and write its table"
    )
    a = p.parse_args(argv)
    if a.pool is not None:
        print(write_pooled(a.pool).read_text())
        return 0
    if not a.label:
        p.error("--label is required to train")
    seeds = (
        [int(x) for x in a.seed_list.split(",")]
        if a.seed_list
        else list(range(a.first_seed, a.first_seed + a.seeds))
    )
    args = (a.label, a.train_args, a.every, a.episodes, a.out, a.draw_base)
    with ProcessPoolExecutor(max_workers=a.jobs) as pool_:
        for rec in pool_.map(train_and_measure, seeds, *[[x] * len(seeds) for x in args]):
            last = rec["curve"][-1]
            print(
                f"{a.label} seed {rec['seed']}: {rec['train_seconds']:.0f} s, share {last['share']:.3f} at "
                f"update {last['update']}",
                file=sys.stderr,
            )
    print(write_pooled(a.out).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
