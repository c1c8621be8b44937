"""bench.front_door: the README's command against a base revision; the file that quotes today's default."""

from __future__ import annotations

import json

from bench import front_door


def _record():
    rounds = [
        {"round": 1, "order": ["base", "this"], "base_seconds": 200.0, "this_seconds": 70.0, "ratio": 0.35,
         "base_heldout": "b", "this_heldout": "held-out check ... 79.0 %"},
        {"round": 2, "order": ["this", "base"], "base_seconds": 180.0, "this_seconds": 72.0, "ratio": 0.40,
         "base_heldout": "b", "this_heldout": "held-out check ... 79.0 %"},
    ]  # fmt: skip
    return {"base": "9ba4421", "revision": "abc", "config_hash": "0123456789ab", "machine": "m",
            "date": "2026-12-07", "rounds": rounds, "ratio_median": 0.375, "this_seconds_median": 71.0,
            "base_seconds_median": 190.0}  # fmt: skip


def test_issue102_the_file_records_the_configuration_hash_the_rounds_and_the_median_ratio(tmp_path):
    md = front_door.write(_record(), tmp_path / "d").read_text()
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["config_hash"] == "0123456789ab" and "configuration hash 0123456789ab" in md
    assert "| 2 | this, base | 180.0 | 72.0 | 0.400 |" in md
    assert "ratio 0.375 (median of the per-round ratios)" in md
    assert "held-out check ... 79.0 %" in md


def test_issue102_quality_names_a_missing_label(tmp_path):
    (tmp_path / "pooled.json").write_text(json.dumps({"C8": {}}))
    try:
        front_door.quality(tmp_path, "C10")
    except SystemExit as e:
        assert "C10" in str(e) and "C8" in str(e)
    else:
        raise AssertionError("a missing label must be refused")


def test_issue102_measure_builds_its_record_without_running_the_rounds(monkeypatch, tmp_path):
    calls = []

    def fake_run(cwd, run_dir):
        calls.append(cwd)
        return {"seconds": 100.0 if cwd == front_door.ROOT else 250.0, "status": 0, "heldout": "held-out x",
                "tail": ""}  # fmt: skip

    monkeypatch.setattr(front_door, "run_once", fake_run)
    real = front_door.subprocess.run

    def no_worktree(cmd, *a, **k):
        return None if cmd[:2] == ["git", "worktree"] else real(cmd, *a, **k)

    monkeypatch.setattr(front_door.subprocess, "run", no_worktree)
    rec = front_door.measure("9ba4421", 2)
    assert [r["order"] for r in rec["rounds"]] == [["base", "this"], ["this", "base"]]
    assert rec["ratio_median"] == 0.4 and rec["machine"] and len(rec["config_hash"]) == 12
    assert "ratio 0.400" in front_door.write(rec, tmp_path / "d").read_text()
