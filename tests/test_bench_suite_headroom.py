"""bench.suite.headroom: the same hosts for every controller, paired host by host, task sizes only."""

import json

import pytest

from bench.suite import headroom

TINY = {"lifecycle.max_epochs": 16, "env.train_batches": 2, "env.val_batches": 1}


def test_headroom_pairs_the_same_hosts_and_writes_its_record(tmp_path, capsys):
    out = tmp_path / "h.json"
    assert headroom.main(["retrieval", "--hosts", "2", "--controllers", "static,grow_all:conv_light",
                          "--paired", "grow_all:conv_light-static", "--eval-seed", "3", "--data-seed", "5",
                          *(f"--set={k}={v}" for k, v in TINY.items()), "--out", str(out)]) == 0  # fmt: skip
    rec = json.loads(out.read_text())
    assert rec["hosts"] == 2 and rec["data_seed"] == 5 and rec["max_epochs"] == 16 and rec["sets"] == TINY
    static, grown = rec["controllers"]["static"], rec["controllers"]["grow_all:conv_light"]
    assert static["params_added_mean"] == 0 and grown["params_added_mean"] > 0
    assert len(static["per_episode"]) == len(grown["per_episode"]) == 2
    p = rec["paired"]["grow_all:conv_light-static"]
    diffs = [g - s for g, s in zip(grown["per_episode"], static["per_episode"])]
    assert p["per_episode"] == pytest.approx(diffs)
    assert p["ahead"] + p["level"] + p["behind"] == 2
    assert "grow_all:conv_light-static, host by host" in capsys.readouterr().out


def test_headroom_takes_task_sizes_only():
    assert headroom.parse_sets(["lifecycle.max_epochs=60", "env.batch_size=64"]) == {
        "lifecycle.max_epochs": 60,
        "env.batch_size": 64,
    }
    with pytest.raises(SystemExit, match="task's own sizes"):
        headroom.parse_sets(["ppo.lr=0.1"])  # a controller setting is not a task's size
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        headroom.parse_sets(["lifecycle.max_epochs"])


def test_headroom_reads_a_fixed_dataset_on_its_test_split_and_refuses_another_draw():
    with pytest.raises(SystemExit, match="fixed dataset"):
        headroom.measure("digits_shallow", 2, ["static"], data_seed=5)


def test_paired_counts_ahead_level_behind():
    p = headroom.paired({"a": [1.0, 2.0, 3.0], "b": [0.0, 2.0, 4.0]}, "a", "b")
    assert (p["ahead"], p["level"], p["behind"]) == (1, 1, 1) and p["mean"] == pytest.approx(0.0)
    with pytest.raises(SystemExit, match="among --controllers"):
        headroom.paired({"a": [1.0]}, "a", "c")
