"""Faults injected into ``python -m esper.shell.run`` end to end: were they survived, was anything lost?

    python -m bench.faults                      # every fault, 10 random kill -9 points (~5 min on 2 cores)
    python -m bench.faults --trials 30 --no-write

Every scenario runs the CLI in subprocesses on one tiny config (the smoke preset, 2-epoch episodes, 3
PPO updates, one thread) and is judged against one uninterrupted reference run of that config:

* **survived**: the fault ended as promised (its exit status, a single error line where the run was
  refused or stopped), and the run directory could be carried on (resumed, or started again where the
  run died before its first checkpoint);
* **nothing lost**: the carried-on run ends with the reference's policy bit for bit (the run is
  deterministic, so a resume from a checkpoint of a half-done update, a stale RNG state or a lost
  update would show), its checkpoint loads (hash verified) and is finite, ``events.jsonl`` reads
  cleanly and holds every update's episodes and PPO update exactly once, ``python -m
  esper.shell.report`` counts them right, and no temporary file is left; a refused request changed no
  file of the run directory.

Scenarios: ``kill -9`` at a random moment (``--trials`` of them, uniform over the run's wall time once
it started), ``kill -9`` in the middle of writing the second checkpoint, SIGTERM mid-run followed by a
torn last log line, a diverging run (``--ppo.lr 1e20``) resumed with a sane learning rate, damaged
checkpoints (bytes flipped, truncated, foreign) and a mismatched one (``--ppo.hidden 32``), and two
runs of the same name started together. Writes ``bench/results/faults/<date>-<host>-faults.{md,json}``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
UPDATES, ENVS = 3, 2
CONFIG = ["--preset", "smoke", "--lifecycle.max_epochs", "2", "--env.train_batches", "1",
          "--env.val_batches", "1", "--threads", "1", "--updates", str(UPDATES)]  # fmt: skip
PROG = "python -m esper.shell.run"
#: A process that runs the CLI but dies (SIGKILL) half-way through writing its second checkpoint.
DIE_MID_SAVE = """
import os, signal, sys
import esper.shell.common.checkpoint as checkpoint
from esper.shell.run import main
real, calls = checkpoint._write_all, []
def write(f, data):  # each checkpoint is two writes: header, body
    calls.append(len(data))
    if len(calls) == 4:
        f.write(bytes(data)[: len(data) // 2]); f.flush(); os.kill(os.getpid(), signal.SIGKILL)
    real(f, data)
checkpoint._write_all = write
sys.exit(main(sys.argv[1:]))
"""


@dataclasses.dataclass
class Reference:
    run_dir: Path
    policy: dict[str, torch.Tensor]
    seconds: float  # the whole process
    startup: float  # until the run directory's log appeared


@dataclasses.dataclass
class Outcome:
    fault: str
    survived: bool
    lost: list[str]
    detail: str
    seconds: float


# ------------------------------------------------------------------------------------------- running
def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def _start(args: list, *, driver: str | None = None) -> subprocess.Popen:
    head = [sys.executable, "-c", driver] if driver else [sys.executable, "-m", "esper.shell.run"]
    return subprocess.Popen([*head, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(), cwd=ROOT)  # fmt: skip


def _finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def _run(args: list, **kwargs) -> tuple[int, str]:
    return _finish(_start(args, **kwargs))


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(f"{PROG}: error:")]


def _one_line(err: str) -> bool:
    return "Traceback" not in err and len(_errors(err)) == 1


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if path.exists():
            return True
        time.sleep(0.05)
    return path.exists()


# ------------------------------------------------------------------------------------------ judging
def reference(root: Path) -> Reference:
    """The uninterrupted run every scenario is compared with."""
    t0 = time.monotonic()
    proc = _start([*CONFIG, "--run_dir", root, "--name", "reference"])
    run_dir = root / "reference"
    _wait_for(run_dir / "events.jsonl", proc)
    startup = time.monotonic() - t0
    status, err = _finish(proc)
    if status != 0:
        raise RuntimeError(f"the reference run failed ({status}): {err[-2000:]}")
    from esper.shell.common.checkpoint import load_checkpoint

    policy = load_checkpoint(run_dir / "checkpoint.pt")["agent"]["policy"]
    return Reference(run_dir, policy, time.monotonic() - t0, startup)


def audit(run_dir: Path, ref: Reference | None) -> list[str]:
    """What was lost or damaged in a finished run directory (empty: nothing); ``ref`` None skips the
    policy comparison (a run whose hyperparameters differ from the reference's)."""
    from esper.shell.common.checkpoint import load_checkpoint
    from esper.shell.telemetry.events import scan_events
    from esper.shell.telemetry.report import write_report

    lost: list[str] = []
    try:
        ckpt = load_checkpoint(run_dir / "checkpoint.pt")
    except (OSError, ValueError) as e:
        return [f"checkpoint unreadable: {e}"]
    if ckpt["progress"]["update"] != UPDATES:
        lost.append(f"checkpoint at update {ckpt['progress']['update']}, not {UPDATES}")
    bad = [k for k, v in ckpt["agent"]["policy"].items() if not torch.isfinite(v).all()]
    lost += [f"non-finite checkpoint tensor {k}" for k in bad]
    if ref is not None:
        differ = [k for k, v in ref.policy.items() if not torch.equal(v, ckpt["agent"]["policy"][k])]
        if differ:
            lost.append(f"{len(differ)} policy tensor(s) differ from the uninterrupted run's")
    events, torn = scan_events(run_dir / "events.jsonl")
    if torn is not None:
        lost.append("the log ends with a torn line")
    episodes = sorted((e["update"], e["env"]) for e in events if e["event"] == "episode")
    want = [(u, i) for u in range(1, UPDATES + 1) for i in range(ENVS)]
    if episodes != want:
        lost.append(f"episodes logged {len(episodes)} (want each of {len(want)} once): {episodes}")
    updates = [e["update"] for e in events if e["event"] == "ppo_update"]
    if updates != list(range(1, UPDATES + 1)):
        lost.append(f"PPO updates logged: {updates}")
    with contextlib.redirect_stderr(io.StringIO()):
        md = write_report(run_dir).read_text()
    if f"{UPDATES} PPO updates, {UPDATES * ENVS} episodes" not in md:
        lost.append("the report miscounts")
    leftovers = [p.name for p in run_dir.glob(".checkpoint.pt.*")]
    if leftovers:
        lost.append(f"temporary files left: {leftovers}")
    return lost


def _carry_on(run_dir: Path, name: str, root: Path) -> tuple[int, str, str]:
    """Resume ``run_dir``, or start it again if it died before its first checkpoint."""
    if (run_dir / "checkpoint.pt").exists():
        return (*_run(["--resume", run_dir]), "resumed")
    return (*_run([*CONFIG, "--run_dir", root, "--name", name]), "started again")


# ---------------------------------------------------------------------------------------- scenarios
def kill9_random(root: Path, ref: Reference, rng: random.Random) -> Outcome:
    """SIGKILL at a uniformly random moment of the run once it started."""
    t0 = time.monotonic()
    delay = rng.uniform(0.0, max(ref.seconds - ref.startup, 0.1))
    proc = _start([*CONFIG, "--run_dir", root, "--name", "k"])
    _wait_for(root / "k" / "events.jsonl", proc)
    time.sleep(delay)
    finished = proc.poll() is not None
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    status, err, how = _carry_on(root / "k", "k", root)
    lost = audit(root / "k", ref)
    where = "after it finished" if finished else f"{delay:.2f} s into the run"
    return Outcome("kill -9 at a random moment", status == 0, lost,
                   f"killed {where}; {how}; exit {status} {err[-300:] if status else ''}".strip(),
                   time.monotonic() - t0)  # fmt: skip


def kill9_mid_save(root: Path, ref: Reference) -> Outcome:
    t0 = time.monotonic()
    status, _ = _run([*CONFIG, "--run_dir", root, "--name", "s"], driver=DIE_MID_SAVE)
    half = [p.stat().st_size for p in (root / "s").glob(".checkpoint.pt.*.tmp")]
    from esper.shell.common.checkpoint import load_checkpoint

    before = load_checkpoint(root / "s" / "checkpoint.pt")["progress"]["update"]
    resumed, _ = _run(["--resume", root / "s"])
    ok = status == -signal.SIGKILL and bool(half) and before == 1 and resumed == 0
    detail = (f"died with {status} leaving a {half[0] if half else 0}-byte temporary; the checkpoint still "
              f"held update {before}; resume exited {resumed}")  # fmt: skip
    return Outcome("kill -9 mid checkpoint write", ok, audit(root / "s", ref), detail, time.monotonic() - t0)


def sigterm_then_torn_log(root: Path, ref: Reference) -> Outcome:
    """SIGTERM during update 2, then a torn line appended to the log (power loss), then resume."""
    t0 = time.monotonic()
    proc = _start([*CONFIG, "--run_dir", root, "--name", "t"])
    log = root / "t" / "events.jsonl"
    while proc.poll() is None and '"checkpoint"' not in (log.read_text() if log.exists() else ""):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    status, err = _finish(proc)
    with open(log, "a") as f:
        f.write('{"event":"epoch","update":2,"val_acc":[0.4')
    resumed, _ = _run(["--resume", root / "t"])
    ok = status == 143 and "SIGTERM" in err and resumed == 0
    detail = f"exit {status} ({_errors(err) or err.strip().splitlines()[-1:]}); resume exited {resumed}"
    return Outcome("SIGTERM mid-run, then a torn log line", ok, audit(root / "t", ref), detail,
                   time.monotonic() - t0)  # fmt: skip


def diverging_run(root: Path) -> Outcome:
    """``--ppo.lr 1e20``: every update rolls back; the run stops; a resume with a sane lr completes."""
    t0 = time.monotonic()
    status, err = _run([*CONFIG, "--run_dir", root, "--name", "n", "--ppo.lr", "1e20"])
    resumed, _ = _run(["--resume", root / "n", "--ppo.lr", "1e-3"])
    ok = status == 3 and _one_line(err) and "rolled back" in err and resumed == 0
    detail = f"exit {status}: {(_errors(err) or [''])[0][len(PROG) + 8 :][:160]}; resume exited {resumed}"
    return Outcome("NaN/Inf PPO updates (--ppo.lr 1e20)", ok, audit(root / "n", None), detail,
                   time.monotonic() - t0)  # fmt: skip


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file() and p.name != ".lock"}


def _refused(run_dir: Path, args: list) -> tuple[bool, int]:
    """Run the CLI in this process; (refused in one line, number of files it changed)."""
    from esper.shell.run import main

    before = _snapshot(run_dir)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main([str(a) for a in args])
        except SystemExit as e:
            status = e.code
    after = _snapshot(run_dir)
    changed = sum(before.get(k) != v for k, v in after.items()) + len(set(before) - set(after))
    return status == 2 and _one_line(err.getvalue()), changed


def damaged_checkpoints(root: Path, ref: Reference, rng: random.Random) -> list[Outcome]:
    """Resumes of a finished run whose checkpoint was damaged, or whose config was changed."""
    out = []
    good = (ref.run_dir / "checkpoint.pt").read_bytes()
    flipped = bytearray(good)
    for i in rng.sample(range(len(good)), 400):
        flipped[i] ^= 1 << rng.randrange(8)
    one = bytearray(good)
    one[rng.randrange(len(good))] ^= 0x01
    cases = [("400 bytes flipped", bytes(flipped), []), ("one bit flipped", bytes(one), []),
             ("truncated", good[: len(good) // 3], []), ("not a checkpoint", b"PK\x03\x04garbage", []),
             ("mismatched config (--ppo.hidden 32)", good, ["--ppo.hidden", "32"]),
             ("fewer --updates than done", good, ["--updates", "1"])]  # fmt: skip
    for what, data, extra in cases:
        t0 = time.monotonic()
        run_dir = root / f"d{len(out)}"
        shutil.copytree(ref.run_dir, run_dir)
        (run_dir / "checkpoint.pt").write_bytes(data)
        refused, changed = _refused(run_dir, ["--resume", run_dir, "--updates", str(UPDATES + 1), *extra])
        lost = [f"{changed} file(s) of the run directory changed"] if changed else []
        detail = "refused in one line" if refused else "NOT refused"
        out.append(Outcome(f"checkpoint: {what}", refused, lost, detail, time.monotonic() - t0))
    return out


def concurrent_runs(root: Path, ref: Reference) -> Outcome:
    """Two runs of the same --name started together: one runs, the other is refused."""
    t0 = time.monotonic()
    procs = [_start([*CONFIG, "--run_dir", root, "--name", "c"]) for _ in range(2)]
    results = [_finish(p) for p in procs]
    statuses = sorted(s for s, _ in results)
    loser = next((err for s, err in results if s != 0), "")
    refused = any(m in loser for m in ("in use by another esper process", "already holds a run"))
    ok = statuses == [0, 2] and _one_line(loser) and refused
    from esper.shell.common.checkpoint import load_checkpoint
    from esper.shell.telemetry.events import read_events

    lost = audit(root / "c", ref)
    starts = len(read_events(root / "c" / "events.jsonl", "run_start"))
    config = json.loads((root / "c" / "config.json").read_text())
    if starts != 1 or config != load_checkpoint(root / "c" / "checkpoint.pt")["config"]:
        lost.append(f"{starts} runs logged; config.json and checkpoint from different runs?")
    reason = "in use" if "in use" in loser else "already holds a run"
    detail = f"exit statuses {statuses}; the refused one: {reason}"
    return Outcome("two runs of the same --name at once", ok, lost, detail, time.monotonic() - t0)


# -------------------------------------------------------------------------------------------- report
def run_all(root: Path, trials: int, seed: int) -> list[Outcome]:
    rng = random.Random(seed)
    ref = reference(root)
    out = [kill9_random(root / f"r{i}", ref, rng) for i in range(trials)]
    out.append(kill9_mid_save(root / "s", ref))
    out.append(sigterm_then_torn_log(root / "t", ref))
    out.append(diverging_run(root / "n"))
    out += damaged_checkpoints(root / "d", ref, rng)
    out.append(concurrent_runs(root / "c", ref))
    return out


def markdown(outcomes: list[Outcome], info: dict) -> str:
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(o.fault, []).append(o)
    rows = ["| fault | trials | survived | lost | time (s) |", "|---|---|---|---|---|"]
    for fault, os_ in groups.items():
        lost = sum(len(o.lost) for o in os_)
        rows.append(f"| {fault} | {len(os_)} | {sum(o.survived for o in os_)} | {lost} | "
                    f"{sum(o.seconds for o in os_):.0f} |")  # fmt: skip
    total = (f"**{sum(o.survived for o in outcomes)} of {len(outcomes)} faults survived, "
             f"{sum(len(o.lost) for o in outcomes)} things lost.**")  # fmt: skip
    details = [f"- {o.fault}: {o.detail}" + (f"; LOST: {'; '.join(o.lost)}" if o.lost else "")
               for o in outcomes]  # fmt: skip
    return "\n".join([f"# Fault injection, {info['date_utc']}", "", f"`{info['command']}` on {info['cpu']} "
                      f"({info['cpu_count']} cores), torch {info['torch']}, git {info['git']}", "", total, "",
                      *rows, "", "## Each trial", "", *details, ""])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10, help="random kill -9 points (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill points and the flipped bytes")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "faults")
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--keep", action="store_true", help="keep the run directories (their path is printed)")
    args = p.parse_args(argv)
    from bench.harness import machine_info

    root = Path(tempfile.mkdtemp(prefix="esper-faults-"))
    t0 = time.monotonic()
    try:
        outcomes = run_all(root, args.trials, args.seed)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    info = machine_info(torch.device("cpu"))
    info["command"] = "python -m bench.faults " + " ".join(argv if argv is not None else sys.argv[1:])
    info["wall_seconds"] = time.monotonic() - t0
    md = markdown(outcomes, info)
    print(md)
    if args.keep:
        print(f"run directories: {root}")
    if not args.no_write:
        stem = f"{dt.date.today().isoformat()}-{info['host']}-faults"
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{stem}.md").write_text(md)
        raw = {"machine": info, "outcomes": [dataclasses.asdict(o) for o in outcomes]}
        (args.out / f"{stem}.json").write_text(json.dumps(raw, indent=1) + "\n")
        print(f"wrote {args.out / stem}.md (+ .json)")
    return 0 if all(o.survived and not o.lost for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
