"""``--profile N`` (issue 92): a torch.profiler trace of the first N updates and the top operators' table in
the run directory, the table also in report.md."""

from __future__ import annotations

import gzip
import json
from collections import Counter

from esper.shell import run
from esper.shell.telemetry.events import read_events
from esper.shell.telemetry.profiling import TOP

SMOKE = ["--preset", "smoke", "--progress", "false"]


def _profiled(tmp_path, name: str, *extra: str) -> tuple:
    status = run.main([*SMOKE, "--run_dir", str(tmp_path), "--name", name, "--report", "true", *extra])
    assert status == 0
    d = tmp_path / name
    return d, [e for e in read_events(d / "events.jsonl") if e["event"] == "profile"]


def test_profile_1_leaves_a_trace_and_a_table(tmp_path):
    d, events = _profiled(tmp_path, "p", "--updates", "2", "--profile", "1")
    assert len(events) == 1
    ev = events[0]
    assert ev["update"] == 1 and ev["updates"] == 1
    trace = json.loads(gzip.decompress((d / ev["trace"]).read_bytes()))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"esper.rollout", "esper.ppo_update"} <= names  # the update's two phases, as ranges
    table = (d / ev["table"]).read_text()
    assert "Self CPU" in table and "aten::" in table
    assert 0 < len(ev["top"]) <= TOP
    assert all(r["self_ms"] >= 0 and r["calls"] >= 1 for r in ev["top"])
    selfs = [r["self_ms"] for r in ev["top"]]
    assert selfs == sorted(selfs, reverse=True)
    report = (d / "report.md").read_text()
    assert "## Profile (1 update(s))" in report
    assert f"| `{ev['top'][0]['name']}` |" in report


def test_issue102_profile_2_profiles_the_first_two_updates(tmp_path):
    """``--profile 2`` records two updates, not the first alone (issue 102): the event comes after the
    second, and the trace holds two of each phase's ranges. The smoke preset made smaller still (the
    profiler's cost grows with the operators it records), no report (its plots cost more than the run)."""
    tiny = ["--lifecycle.max_epochs", "2", "--env.train_batches", "1", "--env.val_batches", "1",
            "--ppo.n_epochs", "1", "--ppo.n_minibatches", "1", "--threads", "1"]  # fmt: skip
    args = [*SMOKE, *tiny, "--run_dir", str(tmp_path), "--name", "two", "--updates", "2", "--profile", "2"]
    assert run.main(args) == 0
    d = tmp_path / "two"
    events = [e for e in read_events(d / "events.jsonl") if e["event"] == "profile"]
    assert [(e["update"], e["updates"]) for e in events] == [(2, 2)]
    trace = json.loads(gzip.decompress((d / events[0]["trace"]).read_bytes()))
    ranges = Counter(e.get("name") for e in trace["traceEvents"] if e.get("cat") == "user_annotation")
    assert ranges["esper.rollout"] == ranges["esper.ppo_update"] == 2  # both updates, whole


def test_a_run_shorter_than_its_profile_writes_it_at_the_end(tmp_path):
    d, events = _profiled(tmp_path, "q", "--updates", "1", "--profile", "3")
    assert [(e["update"], e["updates"]) for e in events] == [(1, 1)]
    assert (d / "profile" / "trace.json.gz").is_file() and (d / "profile" / "top_ops.txt").is_file()


def test_no_profile_by_default(tmp_path):
    status = run.main([*SMOKE, "--run_dir", str(tmp_path), "--name", "n", "--updates", "1"])
    assert status == 0
    assert not (tmp_path / "n" / "profile").exists()
