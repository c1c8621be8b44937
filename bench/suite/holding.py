"""Where a learned controller's seeds wait: why they are not fossilized, step by step.

The suite's diagnosis (docs/experiment-log.md) finds that ``ppo_greedy`` keeps most of its seeds out of
FOSSILIZE's reach, and that fossilizing wherever it is legal recovers only part of the gap. This
reading splits the rest. It replays a controller's evaluation episodes of one suite seed (the same
hosts, draw and batches as the table's) and looks, before every step, at each slot whose seed is
blending or holding:

- ``blend_in``: BLENDING, its blend-in ramp running (from alpha 0).
- ``blend_ramp_same``: BLENDING, a ramp running to the alpha the seed already holds (a SET_ALPHA_TARGET
  that changes nothing, and while it runs the mechanical advance to HOLDING, G3, waits).
- ``blend_ramp_other``: BLENDING, a ramp running to another alpha.
- ``blend_settled``: BLENDING, no ramp running: G3 waits only for its epochs (``g3_min_epochs``) under
  ``auto_advance``, or for an ADVANCE without it.
- ``legal``: HOLDING, no ramp running, the seed pays (G5): FOSSILIZE is offered.
- ``ramp_same``: HOLDING, a ramp running to the alpha the seed already holds (FOSSILIZE and PRUNE wait).
- ``ramp_other``: HOLDING, a ramp running to another alpha.
- ``below_gate``: HOLDING, settled, but the seed does not pay (G5's contribution, or alpha 0).

Where a seed is ``blend_settled`` or ``legal``, it also tallies what the controller did on that step:
acted on that seed (with which op), acted elsewhere, or waited.

It also reads each episode's end: every seed left in the final host but not fossilized, by the same
categories. Counts are per episode, averaged over the episodes.

It imports only ``esper`` (no ``bench``), so it runs against another revision's package, as the suite's
first run needs (trained and evaluated at 6aa96a5)::

    cd WORKTREE && PYTHONPATH=. python /path/to/main/bench/suite/holding.py RUN_DIR --eval-seed 1202 \
        --data-seed 100202 --episodes 10

Its episodes then are the table's, to the bit (it prints each episode's test accuracy to compare).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

import torch

from esper.core.spec import Op, Stage
from esper.shell.common.checkpoint import load_checkpoint
from esper.shell.common.fields import from_dict
from esper.shell.common.seeding import eval_host_seeds
from esper.shell.config.presets import RunConfig
from esper.shell.eval.controllers import make_controller
from esper.shell.eval.runner import run_hosts

#: The categories of a blending or holding seed before a step, in the order the table prints them.
CATEGORIES = (
    "blend_in", "blend_ramp_same", "blend_ramp_other", "blend_settled", "legal", "ramp_same", "ramp_other",
    "below_gate",
)  # fmt: skip
#: The categories where what the controller does decides whether the seed moves on.
CHOICE_CATEGORIES = ("blend_settled", "legal")


def classify(step) -> list[list[str | None]]:
    """Per env and slot ``[E][S]`` of a step's input (its ``slots`` and ``legal`` masks): the category of
    a BLENDING or HOLDING seed (:data:`CATEGORIES`), None for any other slot. Whether FOSSILIZE is legal
    is read from the env's own mask, so a settled HOLDING seed it does not offer is below G5."""
    slots = step.slots
    stage = slots["stage"]
    ramping = slots["ramp_pos"] < slots["ramp_len"]
    same = ramping & (slots["ramp_from"] == slots["ramp_to"])
    blend_in = ramping & (slots["ramp_from"] == 0) & (slots["ramp_to"] > 0)
    legal = step.legal["slot_by_op"][:, int(Op.FOSSILIZE)]
    blending, holding = stage == int(Stage.BLENDING), stage == int(Stage.HOLDING)
    code = torch.full_like(stage, -1)
    for i, where in enumerate((
        blending & blend_in, blending & same, blending & ramping & ~blend_in & ~same, blending & ~ramping,
        holding & ~ramping & legal, holding & same, holding & ramping & ~same, holding & ~ramping & ~legal,
    )):  # fmt: skip
        code = torch.where(where, i, code)
    return [[CATEGORIES[c] if c >= 0 else None for c in row] for row in code.tolist()]


class Recorder:
    """A controller that passes every call to ``inner`` and tallies, per env, what :func:`classify`
    finds before each step and what the controller chose where FOSSILIZE was legal."""

    def __init__(self, inner):
        self.inner = inner
        self.learns = inner.learns
        self.counts: list[Counter] = []

    def begin(self, n_envs: int) -> None:
        self.inner.begin(n_envs)
        self.counts = [Counter() for _ in range(n_envs)]

    def seed_envs(self, host_seeds):
        self.inner.seed_envs(host_seeds)

    def explain(self):
        return self.inner.explain()

    def bootstrap(self, step):
        # the post-episode observation: the seeds' state at the end
        final = step.slots["stage"].tolist()
        for i, row in enumerate(classify(step)):
            for cat in row:
                if cat is not None:
                    self.counts[i][f"end:{cat}"] += 1
            self.counts[i]["end:fossilized"] += sum(st == int(Stage.FOSSILIZED) for st in final[i])
        return self.inner.bootstrap(step)

    def act(self, step):
        out = self.inner.act(step)
        cats = classify(step)
        ops, chosen = out["op", "action"].tolist(), out["slot", "action"].tolist()
        for i, row in enumerate(cats):
            for s, cat in enumerate(row):
                if cat is None:
                    continue
                self.counts[i][cat] += 1
                if cat not in CHOICE_CATEGORIES:
                    continue
                op = Op(ops[i])
                if op == Op.WAIT:
                    what = "waited"
                elif chosen[i] != s:
                    what = "acted elsewhere"
                else:
                    what = op.name.lower()
                self.counts[i][f"{cat}: {what}"] += 1
        return out


def trace(run_dir: Path, *, controller: str, episodes: int, eval_seed: int, data_seed: int | None) -> dict:
    """Replay ``controller``'s evaluation episodes of ``run_dir`` and tally (see the module)."""
    cfg = from_dict(RunConfig, json.loads((run_dir / "config.json").read_text()))
    if data_seed is not None:
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, data_seed=data_seed))
    torch.set_num_threads(cfg.torch_threads())
    ckpt = run_dir / "checkpoint.pt"  # a fixed controller (grow_all, grow:PLAN) needs none
    checkpoint = load_checkpoint(ckpt, map_location=cfg.env.device) if ckpt.is_file() else None
    task = cfg.env.build_task()
    recorders: list[Recorder] = []

    def make(env, start: int):
        inner = make_controller(controller, cfg, env, checkpoint=checkpoint, seed=eval_seed + start)
        rec = Recorder(inner)
        recorders.append(rec)
        return rec

    records = run_hosts(cfg, task, make, eval_host_seeds(eval_seed, range(episodes)))
    per_episode = [c for rec in recorders for c in rec.counts]
    keys = sorted({k for c in per_episode for k in c})
    return {
        "run_dir": str(run_dir), "controller": controller, "episodes": episodes, "eval_seed": eval_seed,
        "data_seed": data_seed,
        "mean_per_episode": {k: sum(c[k] for c in per_episode) / episodes for k in keys},
        "per_episode": [dict(c) for c in per_episode],
        "test_acc": [r["final_test_acc"] for r in records],
        "n_fossilized": [r["n_fossilized"] for r in records],
    }  # fmt: skip


#: The table's columns: (header, the tallies summed for it).
COLUMNS = (
    ("blend-in", ("blend_in",)),
    ("BLENDING, same-alpha ramp", ("blend_ramp_same",)),
    ("BLENDING, settled", ("blend_settled",)),
    ("of those, a new ramp on it", ("blend_settled: set_alpha_target",)),
    ("FOSSILIZE legal", ("legal",)),
    ("of those, fossilized", ("legal: fossilize",)),
    ("of those, a new ramp on it", ("legal: set_alpha_target",)),
    ("of those, waited or acted elsewhere", ("legal: waited", "legal: acted elsewhere")),
    ("HOLDING, same-alpha ramp", ("ramp_same",)),
    ("HOLDING, below G5", ("below_gate",)),
    ("at the end: fossilized", ("end:fossilized",)),
    ("at the end: in a same-alpha ramp", ("end:blend_ramp_same", "end:ramp_same")),
    ("at the end: otherwise waiting", tuple(f"end:{c}" for c in CATEGORIES if not c.endswith("ramp_same"))),
)  # fmt: skip


def table(records: list[dict]) -> str:
    """A markdown table of traces (:func:`trace`'s records): one row per run (its task and seed from its
    run directory, ``.../TASK/seedK``), slot-steps per episode in each column of :data:`COLUMNS`."""
    lines = ["| task | seed | " + " | ".join(h for h, _ in COLUMNS) + " |",
             "|---|---:|" + "---:|" * len(COLUMNS)]  # fmt: skip
    for r in records:
        run = Path(r["run_dir"])
        mean = r["mean_per_episode"]
        cells = [f"{sum(mean.get(k, 0.0) for k in keys):.1f}" for _, keys in COLUMNS]
        lines.append(f"| `{run.parent.name}` | {run.name.removeprefix('seed')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, nargs="?")
    p.add_argument("--table", type=Path, nargs="+", help="print the markdown table of these --out files")
    p.add_argument("--controller", default="ppo_greedy")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--eval-seed", type=int, default=None, help="the suite's: 1000 + the training seed")
    p.add_argument("--data-seed", type=int, default=None, help="the suite's final draw: 100000 + the seed")
    p.add_argument("--out", type=Path, default=None, help="write the tallies as JSON here")
    a = p.parse_args(argv)
    if a.table:
        print(table([json.loads(f.read_text()) for f in a.table]))
        return 0
    if a.run_dir is None or a.eval_seed is None:
        p.error("a run directory and --eval-seed are needed (or --table FILE...)")
    out = trace(a.run_dir, controller=a.controller, episodes=a.episodes, eval_seed=a.eval_seed,
                data_seed=a.data_seed)  # fmt: skip
    for k, v in out["mean_per_episode"].items():
        print(f"{k:28s} {v:7.2f}")
    print("test acc per episode:", " ".join(f"{x:.1f}" for x in out["test_acc"]))
    if a.out is not None:
        a.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
