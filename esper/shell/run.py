"""``python -m esper.shell.run``: train Tamiyo (or run the heuristic) and leave a run directory.

    python -m esper.shell.run                         # the embedded default (MNIST-1D, CPU, minutes)
    python -m esper.shell.run --preset stdlib_text    # byte-level LM on the stdlib's source
    python -m esper.shell.run --preset cifar10 --env.data_path /data/cifar-10-batches-bin
    python -m esper.shell.run --policy heuristic      # the reference's rules as a baseline
    python -m esper.shell.run --ppo.lr 1e-4 --env.n_envs 8 --updates 20
    python -m esper.shell.run --resume runs/default-20261122-101500 --updates 12

Every config field is an option (``--section.field VALUE``; see ``--help``); unknown options and bad
values are refused with one line (:mod:`esper.shell.common.cli`). The run directory holds ``config.json``,
``provenance.json`` (versions, git revision, machine), ``events.jsonl`` (every epoch, episode, lifecycle
event, PPO update and anomaly), ``checkpoint.pt`` (policy, optimizer, normalizer statistics, RNG
states, config, progress; written atomically with a content hash, loaded with ``weights_only=True``),
``summary.txt``, ``report.md`` and ``plots/``. This module is the command line and the start-up; the
run itself is :class:`esper.shell.runtime.training.TrainingRun`.

What holds whatever happens:

* **Nothing is touched before the request is known to be good.** Config values are validated when
  parsed; the device must exist; a ``--resume`` loads and verifies the checkpoint, checks it against
  the config (only the fields in :data:`RESUMABLE` may change) and refuses fewer ``--updates`` than
  done, all before a file of the run directory is written.
* **One process per run directory** (:class:`~esper.shell.common.rundir.RunDirLock`): a second run of the
  same ``--name``, or a ``--resume`` of a running run, is refused; a crashed run leaves no stale lock.
* **A checkpoint is always the state at an update boundary.** The state after each update (RNG states
  included) is kept in memory; the checkpoint is written from it every ``checkpoint_every`` updates,
  and on Ctrl-C or SIGTERM (handled alike) the last finished update's state is written, never a
  half-done rollout or PPO update. Ctrl-C during a checkpoint write waits for the write.
* **A non-finite update never reaches a checkpoint**: the trainer rolls it back, the checkpoint writer
  refuses NaN/Inf, and a run that cannot continue (``ppo.max_bad_updates`` rolled-back updates in a
  row, or a non-finite rollout) stops with one line, its last checkpoint intact and resumable with
  saner options.
* **Many processes, one run** (``torchrun ... -m esper.shell.run``, :mod:`esper.shell.common.distributed`):
  each process runs its slice of the envs; every step of the start-up is agreed (a request refused on
  one process is refused on all, rank 0 saying why), rank 0 alone locks and writes the run directory
  and reads a resumed run's checkpoint for all, and a process that loses another stops with one line
  within ``--dist_timeout`` seconds (rank 0 writing the last update boundary's checkpoint first).
* **The log matches the checkpoint.** A resume first moves the events of updates its checkpoint does
  not hold (a crash between logging an episode and its checkpoint) and any torn last line to
  ``events.discarded.jsonl``, and logs how many (``log_rewound``), so no episode is counted twice.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

from esper.shell.common.checkpoint import load_checkpoint, remove_stale_temporaries
from esper.shell.common.cli import STOPPED, CliError, OneLineParser, describe, report
from esper.shell.common.distributed import DEFAULT_TIMEOUT, SINGLE, Dist, PeerLost, init
from esper.shell.common.fields import fields_flat, from_dict, to_dict, with_overrides
from esper.shell.common.memory import tune_allocator
from esper.shell.common.rundir import RunDirBusy, RunDirLock, StopSignals, Terminated
from esper.shell.config.advice import print_warnings
from esper.shell.config.presets import PRESETS, RunConfig, preset
from esper.shell.env.config import check_devices
from esper.shell.runtime.training import CHECKPOINT, PROG, TrainingRun, provenance

#: Config fields a ``--resume`` may change (a dotted prefix ending in "." covers a section): how long
#: and how the run goes on, where it runs, the PPO hyperparameters other than the network's shape,
#: the anomaly thresholds. Anything else (task, host, lifecycle, reward, governor, seed, policy) defines
#: the problem the saved controller learns; changing it is a new run.
RESUMABLE = ("updates", "progress", "report", "eval_episodes", "threads", "checkpoint_every", "compile",
             "warnings", "profile", "run_dir", "name", "env.workers", "env.device", "env.devices", "env.amp",
             "env.data_path", "ppo.", "anomaly.")  # fmt: skip
#: ... except these, which fix the shapes of the saved tensors.
SHAPE_FIELDS = ("ppo.hidden", "ppo.head_hidden", "ppo.policy")


# ------------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Train Tamiyo, the morphogenetic-growth controller, with recurrent PPO.",
        allow_abbrev=False,  # a misspelled or partial option is an error, never a silent prefix match
    )
    p.add_argument("--preset", default="default", choices=list(PRESETS), help="starting configuration")
    p.add_argument("--config", metavar="JSON", help="a config.json to start from instead of a preset")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its checkpoint")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--dist_timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help="under torchrun: how long a process waits for the others before the run stops "
                   "(a dead process is noticed within this) [%(default)s]")  # fmt: skip
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


def resolve_config(args: argparse.Namespace, checkpoint: dict | None = None) -> RunConfig:
    """The run's config: a resumed run's checkpoint config, else ``--config`` or the preset, with the
    options applied and validated.

    Raises:
        ValueError, TypeError: a bad option or value, or an unreadable ``--config`` (one line).
    """
    overrides = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg:") and v is not None}
    if checkpoint is not None:
        base = from_dict(RunConfig, checkpoint["config"])
    elif args.config:
        try:
            data = json.loads(Path(args.config).read_text())
        except OSError as e:
            raise ValueError(f"--config {args.config}: {e.strerror}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"--config {args.config} is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise ValueError(f"--config {args.config} must hold a JSON object (the config sections)")
        base = from_dict(RunConfig, data)
    else:  # the preset and the options are validated together (cifar10 needs --env.data_path)
        return preset(args.preset, overrides)
    return with_overrides(base, overrides)


def check_resume(saved: dict, cfg: RunConfig, done: int) -> None:
    """Refuse (``ValueError``, one line) a resumed config that changes a field outside
    :data:`RESUMABLE` (or a shape field), or that asks for fewer updates than ``done``."""
    old = _flat_values(to_dict(from_dict(RunConfig, saved)))  # defaults filled in, like cfg's
    new = _flat_values(to_dict(cfg))
    fixed = lambda k: k in SHAPE_FIELDS or not any(k == r or (r.endswith(".") and k.startswith(r))
                                                   for r in RESUMABLE)  # fmt: skip
    changed = [k for k in sorted(set(old) | set(new)) if fixed(k) and old.get(k) != new.get(k)]
    if changed:
        diff = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in changed)
        raise ValueError(
            f"the checkpoint does not match this config: {diff}; a resumed run keeps these fields "
            "(start a new run to change them)"
        )
    if cfg.updates < done:
        raise ValueError(
            f"--updates {cfg.updates} is fewer than the {done} update(s) this run has done; pass "
            f"--updates N with N >= {done}"
        )


def main(argv: list[str] | None = None) -> int:
    """The CLI; returns the exit status (usage errors exit through ``SystemExit(2)``). Under torchrun
    every process runs it (see :mod:`esper.shell.common.distributed`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    tune_allocator()
    try:
        if args.print_config:
            checkpoint = _read_checkpoint(parser, Path(args.resume)) if args.resume else None
            cfg = _config(parser, args, checkpoint)
            print_warnings(cfg)
            print(json.dumps(to_dict(cfg), indent=2))
            return 0
        try:
            dist = init(timeout=args.dist_timeout)
        except ValueError as e:
            raise CliError(str(e)) from None
        except PeerLost as e:
            raise CliError(str(e), STOPPED) from None
        try:
            if not dist.is_main:  # rank 0 reports a refused request; the others exit with its status
                parser.exit = _quiet_exit  # type: ignore[method-assign]
            with StopSignals() as signals:
                return _start(parser, args, signals, dist)
        except _Refused as e:
            return e.status
        except PeerLost as e:  # a collective before training: another process is gone
            raise CliError(f"process {dist.rank}: {e}", STOPPED) from None
        finally:
            dist.close()
    except CliError as e:
        return report(PROG, e)
    except KeyboardInterrupt as e:  # before the first update began (after it, TrainingRun.train handles it)
        print(f"\nesper: {'stopped by SIGTERM' if isinstance(e, Terminated) else 'interrupted'} before "
              "training began; no checkpoint was written", file=sys.stderr)  # fmt: skip
        return 143 if isinstance(e, Terminated) else 130


class _Refused(Exception):
    """Another process refused the request (rank 0 says why); exit with ``status``, silently."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _quiet_exit(status: int = 0, message: str | None = None) -> None:
    raise SystemExit(status)


class _Agree:
    """Steps every process of a run must take together: a step that fails on one process (a refused
    request: :class:`CliError` or a parser exit) fails on all, rank 0 reporting it, and nobody waits
    for a process that gave up. With one process, a step is a plain call."""

    def __init__(self, dist: Dist) -> None:
        self.dist = dist

    def all(self, fn):
        """``fn()`` on every process."""
        return self._run(fn, everywhere=True)

    def main(self, fn):
        """``fn()`` on rank 0 alone (None elsewhere): the run directory is rank 0's."""
        return self._run(fn, everywhere=False)

    def share(self, fn):
        """``fn()`` on rank 0, its result handed to every process."""
        value = self._run(fn, everywhere=False)
        return value if not self.dist.active else self.dist.gather_objects(value)[0]

    def _run(self, fn, *, everywhere: bool):
        if not self.dist.active:
            return fn()
        value, failure, error = None, None, None
        if everywhere or self.dist.is_main:
            try:
                value = fn()
            except CliError as e:
                failure, error = (e.status, str(e)), e
            except SystemExit as e:  # a parser error, already printed where it was raised
                failure, error = (int(e.code or 0), None), e
        failures = [f for f in self.dist.gather_objects(failure) if f is not None]
        if not failures:
            return value
        if error is not None and self.dist.is_main:
            raise error
        status, text = failures[0]
        if self.dist.is_main and text is not None:
            raise CliError(f"another process refused: {text}", status)
        raise _Refused(status)


def _config(parser: argparse.ArgumentParser, args: argparse.Namespace, checkpoint: dict | None) -> RunConfig:
    try:
        return resolve_config(args, checkpoint)
    except (ValueError, TypeError) as e:
        parser.error(str(e))


def _read_checkpoint(parser: argparse.ArgumentParser, run_dir: Path) -> dict:
    if not run_dir.is_dir():
        parser.error(f"--resume: {run_dir} not found (is it a run directory?)")
    path = run_dir / CHECKPOINT
    if not path.is_file():
        raise CliError(
            f"--resume: {path} not found: the run in {run_dir} stopped before its first checkpoint (start it "
            "again as a new run)"
        )
    try:
        checkpoint = load_checkpoint(path, map_location="cpu")
    except (OSError, ValueError) as e:
        raise CliError(f"--resume: {describe(e)}") from None
    if not isinstance(checkpoint.get("config"), dict) or not isinstance(checkpoint.get("progress"), dict):
        raise CliError(f"--resume: {path} has no config or progress: it was not written by {PROG}")
    return checkpoint


def _start(
    parser: argparse.ArgumentParser, args: argparse.Namespace, signals: StopSignals, dist: Dist
) -> int:
    """Check, lock, build, then (only then) write: see "Nothing is touched" in the module docstring.
    Under torchrun rank 0 alone checks, locks and writes the run directory and reads a resumed run's
    checkpoint (the others receive it); every step is agreed (:class:`_Agree`)."""
    with contextlib.ExitStack() as held:  # the lock, released however this ends
        return _start_locked(parser, args, signals, dist, held)


def _start_locked(parser, args, signals: StopSignals, dist: Dist, held: contextlib.ExitStack) -> int:
    step = _Agree(dist)
    hold = lambda lock: lock if lock is None else held.enter_context(lock)
    if args.resume:
        run_dir = Path(args.resume)
        hold(step.main(lambda: _lock(parser, run_dir)))
        checkpoint = step.share(lambda: _read_checkpoint(parser, run_dir))
        cfg = step.all(lambda: _config(parser, args, checkpoint))
        done = int(checkpoint["progress"]["update"])
        step.all(lambda: _check(check_resume, checkpoint["config"], cfg, done))
    else:  # a new run: everything that can be checked without the directory is, before it exists
        checkpoint = None
        cfg = step.all(lambda: _config(parser, args, None))
        run_dir = step.share(
            lambda: Path(cfg.run_dir) / (cfg.name or f"{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
        )
        step.main(lambda: _refuse_existing(run_dir))
    if dist.is_main:
        print_warnings(cfg)  # legal but suspicious settings, one line each, once (--warnings false: none)
    step.all(lambda: _check(check_devices, cfg.env))
    step.all(lambda: _check(dist.shard, cfg.env.n_envs))
    torch.set_num_threads(cfg.torch_threads(dist.local_world))
    run = step.all(lambda: _build(cfg, run_dir, checkpoint, dist))
    if not args.resume:
        hold(step.main(lambda: _create(run_dir, parser)))
    step.main(lambda: _write_start(run, run_dir, cfg, resume=bool(args.resume)))
    run.signals = signals
    if dist.is_main:
        shape = f"{cfg.env.n_envs} envs x {cfg.lifecycle.max_epochs} epochs"
        if dist.active:
            shape += f" over {dist.world} processes"
        todo = f"{cfg.updates - run.start} update(s)" if not cfg.offline else f"offline {cfg.offline_rl.algo}"
        tasks = ", ".join(cfg.training_tasks) + (" in turn" if len(cfg.training_tasks) > 1 else "")
        print(f"esper: {cfg.policy} on {tasks}, {shape}, {todo} -> {run_dir}", file=sys.stderr)
    return run.train()


def _lock(parser: argparse.ArgumentParser, run_dir: Path) -> RunDirLock:
    if not run_dir.is_dir():
        parser.error(f"--resume: {run_dir} not found (is it a run directory?)")
    try:
        return RunDirLock(run_dir).acquire()
    except RunDirBusy as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"cannot use the run directory {run_dir}: {e.strerror}") from None


def _create(run_dir: Path, parser: argparse.ArgumentParser) -> RunDirLock:
    """Create and lock a new run's directory (refused if another run just wrote one)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"cannot create the run directory {run_dir}: {e.strerror}") from None
    lock = _lock(parser, run_dir)
    try:
        _refuse_existing(run_dir)  # again, under the lock: another run may have just written one
    except CliError:
        lock.release()
        raise
    return lock


def _write_start(run: TrainingRun, run_dir: Path, cfg: RunConfig, *, resume: bool) -> None:
    try:
        remove_stale_temporaries(run_dir / CHECKPOINT)
        # Only now, with the request known to be good, is anything of the run directory written.
        (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
        (run_dir / "provenance.json").write_text(json.dumps(provenance(cfg, run.dist), indent=2))
        run.open_log(resume=resume)
    except OSError as e:  # a read-only directory, disk full, ...
        raise CliError(describe(e)) from None


def _refuse_existing(run_dir: Path) -> None:
    if (run_dir / CHECKPOINT).exists():
        raise CliError(f"{run_dir} already holds a run; use --resume {run_dir} or another --name")


def _build(cfg: RunConfig, run_dir: Path, checkpoint: dict | None, dist: Dist = SINGLE) -> TrainingRun:
    try:
        return TrainingRun(cfg, run_dir, checkpoint, dist)
    except (OSError, ValueError) as e:  # missing or too little data, a checkpoint that does not fit, ...
        raise CliError(describe(e)) from None


def _check(fn, *args) -> None:
    """Call a validator; its ``ValueError`` becomes the run's one-line error."""
    try:
        fn(*args)
    except ValueError as e:
        raise CliError(str(e)) from None


if __name__ == "__main__":
    sys.exit(main())
