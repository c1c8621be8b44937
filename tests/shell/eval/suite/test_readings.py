"""What a confirmation keeps of a run's training events beside its evaluation: the late fossilization
counts (the credit reading, :func:`holding_credit`, is tested with ``bench.diagnose``'s summary, which
prints it: tests/test_bench_diagnose.py)."""

import json

from esper.shell.eval.suite.readings import fossil_counts


def test_fossil_counts_read_the_late_updates_only(tmp_path):
    events = tmp_path / "events.jsonl"
    lines = [{"event": "lifecycle", "update": u, "kind": kind}
             for u, kind in [(11, "fossilized"), (12, "fossilized"), (22, "timeout_fossilized"),
                             (23, "fossilized"), (15, "timeout_pruned"), (16, "fossilized")]]  # fmt: skip
    lines.append({"event": "ppo_update", "update": 12, "kind": "fossilized"})
    events.write_text("\n".join(map(json.dumps, lines)) + "\n")
    assert fossil_counts(events) == {"fossilized": 2, "timeout_fossilized": 1}
    assert fossil_counts(tmp_path / "none.jsonl") is None
