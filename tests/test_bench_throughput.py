"""``python -m bench.throughput`` (issue 44's GPU rows): its path syntax, its ratios, its deadline, and one
real cell on the CPU whose results file is written."""

from __future__ import annotations

import json

import pytest

from bench import throughput


def test_a_path_names_a_device_a_host_step_and_optional_workers():
    assert throughput.parse_path("cuda:batched") == {"key": "cuda:batched", "device": "cuda",
                                                     "host_step": "batched", "workers": 1}  # fmt: skip
    assert throughput.parse_path("cpu:per_env:4")["workers"] == 4
    for bad in ("cuda", "cuda:fast", ":batched", "cpu:batched:0", "cpu:batched:x", "a:batched:1:2"):
        with pytest.raises(ValueError, match="DEVICE:HOST_STEP|WORKERS"):
            throughput.parse_path(bad)


def test_ratios_are_medians_of_rounds_where_both_cells_ran():
    paths = [throughput.parse_path(k) for k in ("cuda:batched", "cpu:batched")]
    eps = {("cuda:batched", 8): [4.0, 6.0, 9.0], ("cpu:batched", 8): [2.0, 2.0, None]}

    def cell(x):
        return {"error": "timed out"} if x is None else {"episodes_per_s": x, "seconds_per_update": 8 / x}

    measured = {k: [cell(x) for x in v] for k, v in eps.items()}
    rows = {r["path"]: r for r in throughput.summarize(paths, [8], measured)}
    gpu, cpu = rows["cuda:batched"], rows["cpu:batched"]
    assert gpu["episodes_per_s"] == 6.0 and gpu["ok"] == 3
    assert gpu["vs cpu:batched"] == 2.5  # rounds 0 and 1 only: (2.0, 3.0)
    assert cpu["vs cuda:batched"] == pytest.approx((0.5 + 1 / 3) / 2)
    assert cpu["ok"] == 2 and cpu["errors"] == ["timed out"]


def test_a_spent_deadline_runs_nothing_and_says_so(tmp_path, capsys):
    assert throughput.main(["--envs", "1", "2", "--paths", "cpu:batched", "--deadline", "0.5",
                            "--out", str(tmp_path), "--tag", "t"]) == 0  # fmt: skip
    (body,) = [json.loads(p.read_text()) for p in tmp_path.glob("*-throughput-t.json")]
    assert [r["errors"] for r in body["rows"]] == [["not run (deadline)"]] * 2
    assert "0/1 | not run (deadline)" in capsys.readouterr().out


def test_one_cell_on_the_cpu_measures_its_updates_after_the_first(tmp_path):
    config = ["--preset", "smoke", "--lifecycle.max_epochs", "3"]
    args = ["--envs", "2", "--paths", "cpu:batched", "--updates", "2", "--out", str(tmp_path), "--", *config]
    assert throughput.main(args) == 0
    (body,) = [json.loads(p.read_text()) for p in tmp_path.glob("*-throughput.json")]
    (run,) = body["runs"]["cpu:batched@2"]
    assert run["updates_timed"] == 1 and run["n_envs"] == 2
    assert run["episodes_per_s"] == pytest.approx(2 / run["seconds"]) and run["seconds"] > 0
    assert body["rows"][0]["ok"] == 1 and body["config"] == config
