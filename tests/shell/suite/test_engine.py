"""The suite's engine without a cluster (issue 105): stages in order in this process, each on one torch
thread; a stage started again goes on from its run directory (a training resumes from its checkpoint, and
its time is counted once); a stage's subprocess dies with the process that started it; and without
``distributed`` a cluster is refused in one line naming the extra. The engine on Dask is
``test_cluster.py``'s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from esper.shell.suite import engine as eng
from esper.shell.suite import launch
from esper.shell.suite.engine import Engine, Stage


def _add(a: int, b: int) -> int:
    return a + b


def _threads(*_after) -> int:
    return torch.get_num_threads()


def test_stages_run_in_order_on_one_thread_each_reading_what_they_follow():
    seen = []
    before = torch.get_num_threads()
    stages = [Stage("one", _add, (1, 2)), Stage("two", _add, (10,), ("one",)),
              Stage("t", _threads, (), ("two",))]  # fmt: skip
    got = Engine(workers=0, show_progress=False, done=lambda k, v: seen.append((k, v))).run(stages)
    assert got == {"one": 3, "two": 13, "t": 1}
    assert seen == [("one", 3), ("two", 13), ("t", 1)]  # streamed as each finished
    assert torch.get_num_threads() == before  # this process's own threads are given back
    with pytest.raises(ValueError, match="given twice"):
        Engine(workers=0).run([Stage("a", _add, (1, 1)), Stage("a", _add, (1, 1))])
    with pytest.raises(ValueError, match="reads \\['b'\\], not before it"):
        Engine(workers=0).run([Stage("a", _add, (1,), ("b",)), Stage("b", _add, (1, 1))])
    with pytest.raises(ValueError, match="--workers must be >= 0"):
        Engine(workers=-1)


def test_a_cluster_without_distributed_is_refused_in_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    with pytest.raises(RuntimeError) as e:
        Engine(workers=2).run([Stage("one", _add, (1, 2))])
    assert str(e.value) == eng.MISSING and '".[cluster]"' in str(e.value) and "\n" not in str(e.value)
    assert Engine(workers=0, show_progress=False).run([Stage("one", _add, (1, 2))]) == {"one": 3}


def _events(path: Path, *lines: dict) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))


def test_a_training_started_again_resumes_from_its_checkpoint_and_counts_its_time_once(tmp_path, monkeypatch):
    """A stage whose worker died left a checkpoint and no run_end: the stage run again resumes it
    (``--resume``), and the training time is each process's own, summed; a finished run is kept."""
    seen: list[list[str]] = []

    def run(cmd, **kw):
        seen.append(cmd)
        _events(run_dir / "events.jsonl", {"event": "run_start", "t": 0.0}, {"event": "ppo_update", "t": 4.0},
                {"event": "run_start", "t": 0.0}, {"event": "ppo_update", "t": 2.5},
                {"event": "run_end", "t": 3.0, "interrupted": False})  # fmt: skip
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(launch.subprocess, "run", run)
    run_dir = tmp_path / "seed3"
    run_dir.mkdir()
    (run_dir / "checkpoint.pt").write_bytes(b"")
    _events(run_dir / "events.jsonl", {"event": "run_start", "t": 0.0}, {"event": "ppo_update", "t": 4.0})
    got, seconds = launch.train(3, tmp_path, ["--preset", "mnist1d"])
    assert got == run_dir and seconds == pytest.approx(7.0)  # 4 s killed, 3 s resumed
    assert seen[0][-5:] == ["esper.shell.run", "--resume", str(run_dir), "--progress", "false"]
    assert seen[0][:4] == [sys.executable, "-m", "esper.shell.suite.child", seen[0][3]]
    assert launch.train(3, tmp_path, ["--preset", "mnist1d"]) == (run_dir, pytest.approx(7.0))
    assert len(seen) == 1  # finished: nothing runs again


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_a_stage_s_subprocess_dies_with_the_process_that_started_it(tmp_path):
    """A worker killed with SIGKILL takes its training with it: the child asks to be killed when its
    parent dies, so no orphan goes on writing the run directory while the stage runs again elsewhere."""
    pid_file = tmp_path / "child.pid"
    parent = (
        "import subprocess, sys, time\n"
        "from esper.shell.suite.launch import command\n"
        "child = subprocess.Popen(command('timeit', ['-n', '1', '-r', '1', 'import time; time.sleep(60)']))\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent])
    child = None
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the parent never started its child"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        time.sleep(1.0)  # the child is past its start (runpy is running timeit)
        assert Path(f"/proc/{child}").exists()
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 20
        while Path(f"/proc/{child}").exists() and "Z" not in _state(child):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.05)
    finally:
        proc.kill()
        if child is not None and _state(child) not in ("", "Z"):  # the test failed: leave no orphan
            os.kill(child, signal.SIGKILL)


def _state(pid: int) -> str:
    """A process's state letter from /proc (a zombie, ``Z``, is dead; '' when gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
