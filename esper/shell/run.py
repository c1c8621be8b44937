"""``python -m esper.shell.run``: train Tamiyo (or run the heuristic) and leave a run directory.

    python -m esper.shell.run                         # the embedded default (digits, CPU, minutes)
    python -m esper.shell.run --preset stdlib_text    # byte-level LM on the stdlib's source
    python -m esper.shell.run --preset cifar10 --env.data_path /data/cifar-10-batches-bin
    python -m esper.shell.run --policy heuristic      # the reference's rules as a baseline
    python -m esper.shell.run --ppo.lr 1e-4 --env.n_envs 8 --updates 20
    python -m esper.shell.run --resume runs/default-20261122-101500 --updates 12

Every config field is an option (``--section.field VALUE``; see ``--help``); unknown options and bad
values are refused with a message. The run directory holds ``config.json``, ``provenance.json``
(versions, git revision, machine), ``events.jsonl`` (every epoch, episode, lifecycle event, PPO update
and anomaly), ``checkpoint.pt`` (policy, optimizer, normalizer statistics, RNG states, config, progress;
written atomically and loaded with ``weights_only=True``), ``summary.txt``, ``report.md`` and
``plots/``. Ctrl-C writes a checkpoint before exiting; ``--resume`` continues from it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from esper.shell.agent import PPOController, build_learner
from esper.shell.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from esper.shell.config import PRESETS, RunConfig, preset
from esper.shell.configtools import fields_flat, from_dict, to_dict, with_overrides
from esper.shell.env import VecEnv
from esper.shell.heuristic import HeuristicController
from esper.shell.rollout import EpisodeRunner
from esper.shell.stats import mean_ci95
from esper.shell.telemetry import AnomalyDetector, EventLog, progress, summary_table

CHECKPOINT = "checkpoint.pt"


# ------------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m esper.shell.run",
        description="Train Tamiyo, the morphogenetic-growth controller, with recurrent PPO.",
        allow_abbrev=False,  # a misspelled or partial option is an error, never a silent prefix match
    )
    p.add_argument("--preset", default="default", choices=list(PRESETS), help="starting configuration")
    p.add_argument("--config", metavar="JSON", help="a config.json to start from instead of a preset")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its checkpoint")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    group = p.add_argument_group("config fields (--section.field VALUE; [value in the default preset])")
    defaults = _flat_values(to_dict(preset("default")))
    for name, tp, text in fields_flat(RunConfig):
        kind = "bool" if tp is bool else _type_name(tp)
        shown = f"{text} [{defaults.get(name)}]".replace("%", "%%")
        group.add_argument(f"--{name}", dest=f"cfg:{name}", metavar=kind.upper(), help=shown, default=None)
    return p


def _flat_values(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flat_values(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def resolve_config(args: argparse.Namespace) -> RunConfig:
    overrides = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg:") and v is not None}
    if args.resume:
        path = Path(args.resume) / "config.json"
        if not path.is_file():
            raise SystemExit(f"--resume: {path} not found (is {args.resume} a run directory?)")
        base = from_dict(RunConfig, json.loads(path.read_text()))
    elif args.config:
        base = from_dict(RunConfig, json.loads(Path(args.config).read_text()))
    else:  # the preset and the options are validated together (cifar10 needs --env.data_path)
        return preset(args.preset, overrides)
    return with_overrides(base, overrides)


# ---------------------------------------------------------------------------------------- provenance
def provenance(cfg: RunConfig) -> dict:
    import tensordict
    import torchrl

    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip() or None  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        rev = None
    return {
        "git_rev": rev,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "tensordict": tensordict.__version__,
        "torchrl": torchrl.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "device": cfg.env.device,
        "argv": sys.argv,
    }


# --------------------------------------------------------------------------------------------- run
class Run:
    """Everything one run holds; :meth:`train` is the loop."""

    def __init__(self, cfg: RunConfig, run_dir: Path, *, resume: bool) -> None:
        self.cfg, self.dir = cfg, run_dir
        torch.manual_seed(cfg.seed)
        self.env = VecEnv(cfg.env, cfg.lifecycle, cfg.governor, seed=cfg.seed)
        device = torch.device(cfg.env.device)
        self.policy, self.trainer = build_learner(
            cfg.ppo, self.env.spec, device=device, seed=cfg.seed, compile=cfg.compile
        )
        self.generator = torch.Generator(device=device).manual_seed(cfg.seed)
        if cfg.policy == "ppo":
            self.controller = PPOController(self.policy, self.trainer, generator=self.generator)
        else:
            self.controller = HeuristicController(self.env.blueprint_names, cfg.lifecycle)
        self.detector = AnomalyDetector(cfg.anomaly, target_kl=cfg.ppo.target_kl)
        self.start = 0
        self.rows: list[dict] = []
        if resume:
            self._load()
        self.log = EventLog(self.dir / "events.jsonl", append=resume)

    def _load(self) -> None:
        ckpt = load_checkpoint(self.dir / CHECKPOINT, map_location=self.cfg.env.device)
        self.trainer.load_state_dict(ckpt["trainer"])
        self.generator.set_state(ckpt["policy_generator"].to(self.generator.device))
        self.detector.load_state_dict(ckpt["detector"])
        set_rng_state(ckpt["rng"])
        self.start = int(ckpt["progress"]["update"])
        self.rows = list(ckpt["progress"]["rows"])

    def save(self, update: int) -> Path:
        payload = {
            "trainer": self.trainer.state_dict(),
            "policy_generator": self.generator.get_state(),
            "detector": self.detector.state_dict(),
            "rng": rng_state(),
            "config": to_dict(self.cfg),
            "progress": {"update": update, "rows": self.rows},
        }
        path = save_checkpoint(self.dir / CHECKPOINT, payload)
        self.log.write("checkpoint", update=update, path=str(path))
        return path

    def train(self) -> int:
        cfg = self.cfg
        T = cfg.lifecycle.max_epochs
        bar = progress(
            (cfg.updates - self.start) * T, desc=f"{cfg.policy} {cfg.env.task}", enabled=cfg.progress
        )
        runner = EpisodeRunner(
            self.env, self.controller, lifecycle=cfg.lifecycle, reward=cfg.reward, gamma=cfg.ppo.gamma,
            on_epoch=lambda ev: bar.update(1),
        )  # fmt: skip
        update = self.start
        try:
            for update in range(self.start, cfg.updates):
                t0 = time.perf_counter()
                result = runner.run(update)
                self._log_episodes(update, result)
                row = {"update": update + 1, **_episode_means(result.episodes)}
                if self.controller.learns:
                    metrics = self.trainer.update(result.rollout)
                    self.log.write("ppo_update", update=update + 1, **metrics)
                    for anomaly in self.detector.check(metrics):
                        self.log.write("anomaly", update=update + 1, **anomaly.as_dict())
                        bar.write(f"anomaly at update {update + 1}: {anomaly}")
                    row.update(kl=metrics.get("kl_approx"), entropy=metrics.get("entropy"),
                               ev=metrics.get("explained_variance"))  # fmt: skip
                row["seconds"] = time.perf_counter() - t0
                self.rows.append(row)
                bar.set_postfix(test=f"{row['test_acc']:.1f}", ret=f"{row['return']:.2f}")
                if (update + 1) % cfg.checkpoint_every == 0 or update + 1 == cfg.updates:
                    self.save(update + 1)
        except KeyboardInterrupt:
            bar.close()
            path = self.save(update)
            print(f"\ninterrupted: checkpoint of the last finished update in {path}; resume with "
                  f"--resume {self.dir}", file=sys.stderr)  # fmt: skip
            self.log.write("run_end", interrupted=True, updates=update)
            self.log.close()
            return 130
        bar.close()
        table = summary_table(self.rows, [c for c in SUMMARY_COLUMNS if any(c in r for r in self.rows)])
        print(table)
        check = self.heldout_check() if cfg.eval_episodes else None
        if check is not None:
            print(check["text"])
            table += "\n\n" + check["text"]
            self.log.write("heldout_check", **{k: v for k, v in check.items() if k != "text"})
        (self.dir / "summary.txt").write_text(table + "\n")
        self.log.write(
            "run_end", interrupted=False, updates=cfg.updates, summary=self.rows[-1] if self.rows else {}
        )
        self.log.close()
        if cfg.report:
            from esper.shell.report import write_report

            write_report(self.dir)
            print(f"report: {self.dir / 'report.md'}")
        print(f"run directory: {self.dir}")
        return 0

    def heldout_check(self) -> dict:
        """The trained controller and the static host on ``eval_episodes`` fresh hosts (evaluation
        seeds of their own, the same for both): did growth pay on data neither ever saw?"""
        from esper.shell.evaluate import evaluate_config

        cfg = self.cfg
        checkpoint = {"trainer": self.trainer.state_dict(), "progress": {"update": cfg.updates}}
        res = evaluate_config(
            cfg, [cfg.policy, "static"], episodes=cfg.eval_episodes, seed=HELDOUT_SEED + cfg.seed,
            checkpoint=checkpoint, show_progress=cfg.progress, task=self.env.task,
        )  # fmt: skip
        grown, static = res["controllers"][cfg.policy], res["controllers"]["static"]
        paired = [g["final_test_acc"] - s["final_test_acc"]
                  for g, s in zip(grown["per_episode"], static["per_episode"])]  # fmt: skip
        gain, (lo, hi) = mean_ci95(paired)
        text = (
            f"held-out check on {cfg.eval_episodes} fresh hosts (the same for both): the {cfg.policy} "
            f"controller's final hosts reach {grown['test_acc_mean']:.1f} % test accuracy with "
            f"{grown['params_added_mean']:.0f} parameters added; the static host "
            f"{static['test_acc_mean']:.1f} %; "
            f"growth paid {gain:+.1f} points (95 % CI {lo:+.1f} to {hi:+.1f}). "
            f"Full comparison: python -m esper.shell.evaluate {self.dir}"
        )
        return {"text": text, "episodes": cfg.eval_episodes, "controller": cfg.policy,
                "test_acc": grown["test_acc_mean"], "static_test_acc": static["test_acc_mean"],
                "params_added": grown["params_added_mean"], "gain": gain, "gain_ci95": [lo, hi]}  # fmt: skip

    def _log_episodes(self, update: int, result) -> None:
        for ev in result.epochs:
            self.log.write("epoch", update=update + 1, **ev)
        for ev in result.lifecycle:
            self.log.write("lifecycle", update=update + 1, **ev)
        for ev in result.governor:
            self.log.write("governor", update=update + 1, **ev)
        for ep in result.episodes:
            self.log.write("episode", update=update + 1, **ep)
        self.log.write("timings", update=update + 1, **result.timings)


SUMMARY_COLUMNS = ("update", "return", "test_acc", "val_acc", "params", "fossilized", "pruned", "kl",
                   "entropy", "ev", "seconds")  # fmt: skip
#: Evaluation seeds of the end-of-run held-out check start here (plus the run seed).
HELDOUT_SEED = 7_000_000


def _episode_means(episodes: list[dict]) -> dict:
    n = max(len(episodes), 1)
    mean = lambda k: sum(e[k] for e in episodes) / n
    return {
        "return": mean("return"),
        "test_acc": mean("final_test_acc"),
        "val_acc": mean("final_val_acc"),
        "params": mean("params_added"),
        "fossilized": mean("n_fossilized"),
        "pruned": mean("n_pruned"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = resolve_config(args)
    except (ValueError, TypeError) as e:
        parser.error(str(e))
    if args.print_config:
        print(json.dumps(to_dict(cfg), indent=2))
        return 0
    if args.resume:
        run_dir = Path(args.resume)
    else:
        name = cfg.name or f"{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}"
        run_dir = Path(cfg.run_dir) / name
        if (run_dir / CHECKPOINT).exists():
            parser.error(f"{run_dir} already holds a run; use --resume {run_dir} or another --name")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    if args.resume:
        (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    (run_dir / "provenance.json").write_text(json.dumps(provenance(cfg), indent=2))
    torch.set_num_threads(cfg.torch_threads())
    try:
        run = Run(cfg, run_dir, resume=bool(args.resume))
    except (OSError, ValueError) as e:  # bad data path, unreadable checkpoint, ...: one clear line
        print(f"esper: error: {e}", file=sys.stderr)
        return 2
    run.log.write("run_start", config=to_dict(cfg), provenance=provenance(cfg), resumed_from=run.start)
    shape = f"{cfg.env.n_envs} envs x {cfg.lifecycle.max_epochs} epochs"
    todo = f"{cfg.updates - run.start} update(s)"
    print(f"esper: {cfg.policy} on {cfg.env.task}, {shape}, {todo} -> {run_dir}", file=sys.stderr)
    return run.train()


if __name__ == "__main__":
    sys.exit(main())
