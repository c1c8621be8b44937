"""bench.ttq: a seed's curve (the run's controller kept every few updates, greedy on fresh hosts beside
grow_all and static), and the pooling of seeds into shares of grow_all's gain."""

from __future__ import annotations

import json
import math

from bench import ttq


def test_a_seed_keeps_its_controllers_and_evaluates_each_on_the_same_fresh_hosts(tmp_path):
    rec = ttq.train_and_measure(3, "smoke", "--preset smoke --updates 2", 1, 2, tmp_path)
    assert [p["update"] for p in rec["curve"]] == [1, 2]
    assert rec["curve"][0]["seconds"] < rec["curve"][1]["seconds"] <= rec["train_seconds"]
    assert rec["eval_seed"] == ttq.EVAL_SEED_BASE + 3
    again = ttq.train_and_measure(3, "smoke", "--preset smoke --updates 2", 1, 2, tmp_path)
    assert json.dumps(again) == json.dumps(rec)  # kept: read back, not run again (NaN shares compare as text)
    assert (tmp_path / "smoke" / "seed3.json").read_text() == json.dumps(rec, indent=1)


def _seed(k, static, grow_all, accs):
    curve = [{"update": u, "seconds": 10.0 * u + k, "cpu_seconds": 9.0 * u, "test_acc": a,
              "params_added": 0.0,
              "share": ttq._share(a, grow_all, static)} for u, a in enumerate(accs, 1)]  # fmt: skip
    return {"label": "x", "seed": k, "train_args": "", "episodes": 4, "eval_seed": 1000 + k,
            "updates": len(accs), "build_seconds": 1.0, "train_seconds": 10.0 * len(accs),
            "train_cpu_seconds": 9.0 * len(accs),
            "eval_seconds": 1.0,
            "grow_all": grow_all,
            "static": static, "grow_all_params": 1200.0, "curve": curve, "revision": "abc", "machine": "m",
            "date": "2026-12-06"}  # fmt: skip


def test_pooling_is_a_ratio_of_means_per_update_with_the_median_time(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "seed1.json").write_text(json.dumps(_seed(1, 40.0, 80.0, [60.0, 76.0])))
    (folder / "seed2.json").write_text(json.dumps(_seed(2, 50.0, 70.0, [50.0, 70.0])))
    lab = ttq.pool(tmp_path)["x"]
    first, last = lab["curve"]
    assert math.isclose(first["share"], (20.0 + 0.0) / (40.0 + 20.0))  # not the mean of 0.5 and 0
    assert math.isclose(last["share"], (36.0 + 20.0) / 60.0)
    assert first["seconds_median"] == 11.5 and first["per_seed_share"] == [0.5, 0.0]
    end = lab["last"]  # the last update, paired by seed: gains 36 and 20
    assert end["update"] == 2 and end["ppo_greedy"]["mean"] == 73.0
    assert end["gain_over_static"]["mean"] == 28.0
    assert end["gain_over_static"]["ci95"][0] < 28.0 < end["gain_over_static"]["ci95"][1]
    md = ttq.write_pooled(tmp_path).read_text()
    assert "| 2 | 22 | 18 | 0.933 |" in md and (tmp_path / "curve.png").is_file()
    assert "grow_all 75.0 %, static 45.0 %" in md and "{" not in md  # the figures, not the f-string
    assert "the controller's gain over static 28.0 [" in md


def test_issue102_a_seed_records_its_configuration_and_its_fresh_draw(tmp_path):
    from esper.shell.config.presets import config_hash, preset

    rec = ttq.train_and_measure(5, "smoke", "--preset smoke --updates 1", 1, 2, tmp_path, draw_base=70000)
    assert rec["config_hash"] == config_hash(preset("smoke", {"updates": 1}))
    draw = rec["fresh_draw"]
    assert draw["data_seed"] == 70005 and {"ppo_greedy", "random", "static"} <= set(draw)
    lab = ttq.pool(tmp_path)["smoke"]
    assert lab["config_hash"] == [rec["config_hash"]] and lab["worst_seed"]["seed"] == 5
    assert lab["fresh_draw"]["worst_seed"]["gap"] == draw["ppo_greedy"] - draw["random"]


def test_issue102_the_worst_seed_is_the_lowest_share_not_the_mean(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    for k, accs in ((1, [80.0]), (2, [50.0]), (3, [78.0])):
        (folder / f"seed{k}.json").write_text(json.dumps(_seed(k, 40.0, 80.0, accs)))
    lab = ttq.pool(tmp_path)["x"]
    assert lab["worst_seed"] == {"seed": 2, "share": 0.25}
    assert "Worst seed at the last update: 2, share 0.250" in ttq.write_pooled(tmp_path).read_text()
