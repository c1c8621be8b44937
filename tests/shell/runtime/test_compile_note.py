"""A recompile is logged (review 001 M22, issue 92): every compile of a run is ``fullgraph=True`` (a graph
break or the recompile limit raises, nothing falls back to eager), and each update during which graphs
were compiled logs a ``compile`` event."""

from __future__ import annotations

import torch

from esper.shell import run
from esper.shell.runtime import training
from esper.shell.telemetry.events import read_events


def test_M22_each_update_that_compiled_graphs_logs_a_compile_event(tmp_path, monkeypatch):
    counts = iter([5, 7, 7, 8])  # at the start, then after updates 1, 2, 3
    monkeypatch.setattr(training, "compiled_graphs", lambda: next(counts))
    args = ["--preset", "smoke", "--updates", "3", "--run_dir", str(tmp_path), "--name", "c"]
    assert run.main(args) == 0
    events = [e for e in read_events(tmp_path / "c" / "events.jsonl") if e["event"] == "compile"]
    assert [(e["update"], e["graphs"], e["new"]) for e in events] == [(1, 2, 2), (3, 3, 1)]


def test_M22_compiled_graphs_counts_what_dynamo_compiles():
    before = training.compiled_graphs()
    f = torch.compile(lambda x: x * 3 - 1, fullgraph=True, dynamic=False, backend="eager")
    f(torch.ones(2))
    f(torch.ones(2))
    assert training.compiled_graphs() == before + 1
    f(torch.ones(5))  # a new shape: a recompile
    assert training.compiled_graphs() == before + 2
