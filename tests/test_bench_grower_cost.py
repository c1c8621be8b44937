"""bench/grower_cost.py's pure parts: the split's arithmetic, the medians of rounds, the files."""

from __future__ import annotations

import json

import pytest

from bench.grower_cost import markdown, split, summarize, write

STATIC = {"total": 10.0, "train": 8.0, "validation": 1.0}
GROWER = {"total": 20.0, "train": 12.0, "after_backward": 3.0, "whatif": 2.0, "whatif_setup": 0.5,
          "on_epoch_end": 4.0, "val_plain": 2.5, "val_seed": 1.0}  # fmt: skip


def test_split_arithmetic():
    s = split(STATIC, GROWER)
    assert s["seeds_whatif"] == pytest.approx(1.5)  # the pass less its random stream and guards
    assert s["seeds_in_step"] == pytest.approx(4.0)  # 12 - 8
    assert s["seeds_in_val"] == pytest.approx(1.5)  # 2.5 - 1
    assert s["seeds"] == pytest.approx(1.5 + 1.0 + 4.0 + 1.5)
    assert s["validation"] == pytest.approx(1.0)  # the static loop's: what the user runs anyway
    assert s["after_backward_other"] == pytest.approx(1.5)  # 3 - 1.5 (the guards are overhead)
    assert s["on_epoch_end_other"] == pytest.approx(0.5)  # 4 - 2.5 - 1
    assert s["other"] == pytest.approx(2.0)
    # the Grower loop's extra time is the seeds' work, the overhead, and what neither explains
    assert s["grower"] - s["static"] == pytest.approx(s["seeds"] + s["other"] + s["unexplained"])
    assert s["unexplained"] == pytest.approx(10.0 - 8.0 - 2.0)


def test_split_without_setup_timer():
    g = {k: v for k, v in GROWER.items() if k != "whatif_setup"}
    s = split(STATIC, g)
    assert s["whatif_setup"] == 0.0 and s["seeds_whatif"] == pytest.approx(2.0)
    assert s["other"] == pytest.approx(1.0 + 0.5)


def test_summarize_medians_of_per_round_ratios():
    rounds = [{"static": 1.0, "grower": 2.0, "other": 0.1}, {"static": 2.0, "grower": 3.0, "other": 0.4},
              {"static": 4.0, "grower": 9.0, "other": 0.2}]  # fmt: skip
    s = summarize(rounds)
    assert s["rounds"] == 3
    assert s["seconds"]["static"] == 2.0 and s["seconds"]["other"] == 0.2
    assert s["shares"]["other"] == pytest.approx(0.1)  # ratios 0.1, 0.2, 0.05: median 0.1
    assert s["ratio"] == pytest.approx(2.0)  # 2, 1.5, 2.25
    with pytest.raises(ValueError):
        summarize([])


def test_write_md_and_json(tmp_path):
    rounds = [split(STATIC, GROWER)]
    report = {
        "command": "python -m bench.grower_cost", "torch_threads": 1, "controller": "grow:x", "events": [],
        "config": {"epochs": 2, "batches": 3, "batch_size": 4},
        "machine": {"date_utc": "2026-12-07 00:00:00", "load_average_start": "1.00 1.00 1.00"},
        "summary": summarize(rounds), "rounds": rounds, "flops": {"static/train": 2e9}, "notes": ["a note"],
    }  # fmt: skip
    md = write(report, tmp_path / "out", "2026-12-07-vm-grower-cost")
    assert md.name == "2026-12-07-vm-grower-cost.md"
    text = md.read_text()
    assert "| everything else (overhead) | 2.000 | 20.0 % |" in text
    assert "target: under 10 %: not met" in text
    assert "load_average_start | 1.00 1.00 1.00" in text and "- a note" in text
    assert "| static/train | 2.000 |" in text
    back = json.loads((tmp_path / "out" / "2026-12-07-vm-grower-cost.json").read_text())
    assert back["summary"]["shares"]["other"] == pytest.approx(0.2)
    assert markdown(report) == text
