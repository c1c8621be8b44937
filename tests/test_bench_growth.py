"""bench.growth's placement table: which fixed placements meet the efficiency target, as the md says."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.growth import PLACEMENTS, _frontier, markdown
from esper.shell.suite import launch


def _row(name: str, gain: float, params: float) -> dict:
    return {"controller": name, "test_acc_mean": 44.0 + gain, "test_acc_ci95": [43.0 + gain, 45.0 + gain],
            "gain_mean": gain, "gain_ci95": [gain - 1, gain + 1], "params_added_mean": params,
            "fossilized_mean": 1.0}  # fmt: skip


def test_frontier_marks_the_placements_that_meet_the_efficiency_target():
    rows = [_row("static", 0, 0), _row("grow_all", 40, 1200), _row("grow:b0=conv_heavy", 34, 400),
            _row("grow:b0=conv_heavy+b2=depthwise", 37, 520),
            _row("grow:b0=conv_heavy+b2=conv_heavy", 38, 800)]  # fmt: skip
    lines = {line.split(" | ")[0].strip("| "): line for line in _frontier(rows) if line.startswith("| grow")}
    assert lines["grow:b0=conv_heavy"].endswith("| 0.85 | 0.33 | no |")  # too little of the gain
    assert lines["grow:b0=conv_heavy+b2=depthwise"].endswith("| 0.93 | 0.43 | yes |")
    assert lines["grow:b0=conv_heavy+b2=conv_heavy"].endswith("| 0.95 | 0.67 | no |")  # too many parameters
    assert _frontier(rows[2:]) == []  # no grow_all or static row: nothing to compare with


def test_markdown_has_the_placement_section_and_every_placement_is_a_plan_or_grow_all():
    placed = {"episodes": 3, "rows": [_row("static", 0, 0), _row("grow_all", 40, 1200)]}
    md = markdown({"date": "2026-11-24"}, None, None, [], "python -m bench.growth --stage placement", placed)
    assert "## Where growth pays: fixed placements (3 fresh hosts, paired)" in md
    assert "| grow_all | 84.0 [83.0, 85.0] | 40.0 [39.0, 41.0] | 1200 | 1.0 |" in md
    assert all(p == "grow_all" or p.startswith("grow:") for p in PLACEMENTS)


class _FailedRun:
    """What ``subprocess.run`` returns for a training run that fails at once: only its command matters."""

    returncode = 1


def test_learn_passes_train_args_to_every_training_run(tmp_path, monkeypatch):
    import bench.growth.training as bg  # the module whose _train learn calls (its subprocesses: launch)

    seen: list[list[str]] = []
    monkeypatch.setattr(launch.subprocess, "run", lambda cmd, **kw: seen.append(cmd) or _FailedRun())
    with pytest.raises(RuntimeError, match="training seed 0 failed"):  # a failed run stops the stage
        bg.learn(2, 1, 1, tmp_path, '--ppo.head_entropy_weights 1,1,3,1,1,1,1,1 --env.slots "b0,b1"')
    assert seen and seen[0][-4:] == ["--ppo.head_entropy_weights", "1,1,3,1,1,1,1,1", "--env.slots", "b0,b1"]
    assert seen[0][seen[0].index("--seed") + 1] == "0"


def test_a_training_run_makes_its_own_folder(tmp_path, monkeypatch):
    import bench.growth.training as bg

    # the fine-tuning arms train into folders nothing else made (runs/finetune-TASK/ARM): the log
    # beside the run must not need them to exist
    monkeypatch.setattr(launch.subprocess, "run", lambda cmd, **kw: _FailedRun())
    root = tmp_path / "finetune-mnist1d" / "tuned"
    with pytest.raises(RuntimeError, match="training seed 3 failed"):
        bg._train(3, root, [])
    assert (root / "seed3.log").is_file()


def test_markdown_names_the_variant_a_learn_stage_trained():
    ctl = {"test_acc_mean": 70.0, "test_acc_ci95": [65.0, 75.0], "params_added_mean": 500.0,
           "params_added_ci95": [400.0, 600.0], "per_seed_test_acc": [70.0]}  # fmt: skip
    learned = {"seeds": 1, "episodes_per_seed": 2, "jobs": 1, "controllers": {"ppo": ctl},
               "verdict": {}, "verdict_greedy": None, "train_seconds": [1.0], "eval_seconds": [1.0],
               "correlations": {"return_vs_test_acc": 0.5, "return_vs_test_objective": 0.5},
               "train_args": "--ppo.lr 1e-3"}  # fmt: skip
    md = markdown({"date": "2026-11-24"}, None, learned, [], "python -m bench.growth --stage learn", None)
    assert "Trained with `--ppo.lr 1e-3` on top of the default." in md
    assert "on top of the default" not in markdown(
        {"date": "2026-11-24"}, None, {**learned, "train_args": ""}, [], "python -m bench.growth", None
    )


def test_learn_refuses_a_runs_folder_trained_with_other_flags(tmp_path, monkeypatch):
    import bench.growth.training as bg  # the module whose _train learn calls (its subprocesses: launch)

    monkeypatch.setattr(launch.subprocess, "run", lambda cmd, **kw: _FailedRun())
    with pytest.raises(RuntimeError, match="training seed 0 failed"):
        bg.learn(1, 1, 1, tmp_path, "--ppo.lr 1e-3")
    with pytest.raises(ValueError, match="trained with --train-args '--ppo.lr 1e-3', not ''"):
        bg.learn(1, 1, 1, tmp_path)  # the default's runs would be mixed with the variant's
    with pytest.raises(RuntimeError, match="training seed 0 failed"):  # the same flags: it goes on
        bg.learn(1, 1, 1, tmp_path, "--ppo.lr 1e-3")


def _learn_file(path, per_run_acc: list[list[float]], train_args: str = "", cpu: str = "cpu A") -> str:
    """A results file whose learn stage holds one run per entry of ``per_run_acc`` (its episodes'
    accuracies, ppo and static), as ``bench.growth`` writes it: episodes concatenated in run order."""
    import json

    from bench.growth import summarize_runs

    runs = [
        {name: [{"final_test_acc": a + off, "params_added": 100.0 * off, "return": a, "test_objective": a}
                for a in accs] for name, off in (("ppo", 30.0), ("static", 0.0))}
        for accs in per_run_acc
    ]  # fmt: skip
    controllers, corr = summarize_runs(runs, [{"run": i} for i in range(len(runs))])
    learn = {"seeds": len(runs), "episodes_per_seed": len(per_run_acc[0]), "controllers": controllers,
             "correlations": corr, "train_args": train_args, "train_seconds": [60.0] * len(runs),
             "eval_seconds": [6.0] * len(runs), "seconds": 66.0 * len(runs), "run_root": str(path),
             "learning_curves": {str(k): {"update": [1], "test_acc": [50.0]}
                                 for k in range(len(runs))}}  # fmt: skip
    path.write_text(json.dumps({"machine": {"cpu": cpu, "cpu_count": 2, "torch": "2.13", "git": "abc"},
                                "learn": learn}))  # fmt: skip
    return str(path)


def test_pool_counts_each_files_runs_as_runs_of_their_own(tmp_path):
    from bench.growth import markdown, pool, verdict
    from esper.shell.eval.stats import grouped_mean_ci95

    a = _learn_file(tmp_path / "a.json", [[40.0, 42.0], [50.0, 52.0]])
    b = _learn_file(tmp_path / "b.json", [[60.0, 64.0]], cpu="cpu B")
    learned = pool([a, b])
    assert learned["seeds"] == 3
    ppo = learned["controllers"]["ppo"]
    # the runs split where each file's runs end, not two episodes from two files
    assert ppo["per_seed_test_acc"] == [71.0, 81.0, 92.0]
    m, ci = grouped_mean_ci95([[70.0, 72.0], [80.0, 82.0], [90.0, 94.0]])
    assert ppo["test_acc_mean"] == pytest.approx(m) and ppo["test_acc_ci95"] == pytest.approx(list(ci))
    assert learned["verdict"] == verdict(learned["controllers"]) and "beats_static" in learned["verdict"]
    assert learned["correlations"]["per_run"] == [{"run": 0}, {"run": 1}, {"run": 0}]
    assert set(learned["learning_curves"]) == {"0:0", "0:1", "1:0"}
    md = markdown({"date": "2026-11-25"}, None, learned, [], "python -m bench.growth --pool a.json b.json")
    assert "(3 training runs x 2 fresh hosts each; 95 % CI over training runs)" in md
    assert "`a.json`: 2 runs, training seeds 0-1 on cpu A" in md
    assert "`b.json`: 1 runs, training seed 0 on cpu B" in md


def test_pool_refuses_runs_of_another_variant_or_evaluation(tmp_path):
    from bench.growth import pool

    a = _learn_file(tmp_path / "a.json", [[40.0, 42.0]])
    b = _learn_file(tmp_path / "b.json", [[60.0, 64.0]], train_args="--ppo.blend_bias 3")
    c = _learn_file(tmp_path / "c.json", [[60.0, 64.0, 61.0]])
    with pytest.raises(ValueError, match="train_args"):
        pool([a, b])
    with pytest.raises(ValueError, match="episodes_per_seed"):
        pool([a, c])
    with pytest.raises(ValueError, match="it counts once"):
        pool([a, a])


def test_learn_trains_seeds_from_first_seed_and_evaluates_each_on_its_own_hosts(tmp_path, monkeypatch):
    import bench.growth.training as bg  # the module whose _train learn calls (its subprocesses: launch)

    seen: list[list[str]] = []
    monkeypatch.setattr(launch.subprocess, "run", lambda cmd, **kw: seen.append(cmd) or _FailedRun())
    with pytest.raises(RuntimeError, match="training seed 5 failed"):
        bg.learn(2, 1, 1, tmp_path, first_seed=5)
    assert seen[0][seen[0].index("--seed") + 1] == "5"
    with pytest.raises(ValueError, match="first_seed must be >= 0"):
        bg.learn(2, 1, 1, tmp_path, first_seed=-1)


def test_learn_evaluates_more_controllers_on_the_same_hosts_apart_and_adds_them_later(tmp_path, monkeypatch):
    """``--more-controllers ppo_mixed``: evaluated on the run's own hosts (seed 1000 + k) into
    ``eval-more``, merged into the stage with its own verdict; a finished stage given them later
    evaluates only them, and the default set's evaluation is kept as it was."""
    import bench.growth.training as bg  # the module whose _train learn calls (its subprocesses: launch)
    from bench.growth import verdict

    calls: list[dict] = []

    def fake_run(cmd, **kw):  # evaluate's CLI: write what it would, each controller scoring its index
        arg = lambda flag: cmd[cmd.index(flag) + 1]
        names, out = arg("--controllers").split(","), Path(arg("--out"))
        calls.append({"names": names, "out": out.name, "seed": arg("--seed")})
        eps = int(arg("--episodes"))
        score = lambda i: {"final_test_acc": 40.0 + 5 * i, "params_added": 100.0 * i, "return": i,
                           "test_objective": i}  # fmt: skip
        ctl = {n: {"per_episode": [score(i)] * eps} for i, n in enumerate(names)}
        out.mkdir(parents=True, exist_ok=True)
        meta = {"episodes": eps, "eval_seed": int(arg("--seed")), "seconds": 1.0}
        (out / "results.json").write_text(json.dumps({"controllers": ctl, "correlations": {}, "meta": meta}))
        return type("Done", (), {"returncode": 0})()

    def fake_train(k, run_root, extra):
        run_dir = run_root / f"seed{k}"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "events.jsonl").write_text("")
        return run_dir, 2.0

    monkeypatch.setattr(launch.subprocess, "run", fake_run)
    monkeypatch.setattr(bg, "_train", fake_train)
    plain = bg.learn(2, 2, 1, tmp_path, first_seed=3)
    assert [(c["out"], c["seed"]) for c in calls] == [("eval", "1003"), ("eval", "1004")]
    assert "ppo_mixed" not in plain["controllers"] and plain["verdict_mixed"] is None
    calls.clear()
    stage = bg.learn(2, 2, 1, tmp_path, first_seed=3, more_controllers=["ppo_mixed"])
    assert calls == [{"names": ["ppo_mixed"], "out": "eval-more", "seed": s} for s in ("1003", "1004")]
    assert stage["controllers"]["ppo"] == plain["controllers"]["ppo"]  # the default set's eval is kept
    assert stage["controllers"]["ppo_mixed"]["test_acc_mean"] == 40.0
    assert stage["verdict_mixed"] == verdict(stage["controllers"], "ppo_mixed")
    md = markdown({"date": "2026-11-27"}, None, stage, [], "python -m bench.growth")
    assert "Targets (ppo_mixed)" in md
    calls.clear()
    bg.learn(2, 2, 1, tmp_path, first_seed=3, more_controllers=["ppo_mixed"])
    assert calls == []  # both evaluations held alike already


def test_the_results_files_command_quotes_train_args_so_it_can_be_pasted():
    from bench.growth import command_line

    argv = ["--stage", "learn", "--train-args", "--ppo.replay 3 --ppo.blend_bias 3"]
    assert command_line(argv) == (
        "python -m bench.growth --stage learn --train-args '--ppo.replay 3 --ppo.blend_bias 3'"
    )


def _seeded(path, per_run_acc, first_seed, static_off=0.0, **kw) -> str:
    """``_learn_file`` with the learn stage's first training seed set and its static baseline scoring
    30 % on every host (30 + ``static_off``: as if evaluated on other hosts)."""
    import json

    _learn_file(path, per_run_acc, **kw)
    saved = json.loads(path.read_text())
    saved["learn"]["first_seed"] = first_seed
    for e in saved["learn"]["controllers"]["static"]["per_episode"]:
        e["final_test_acc"] = 30.0 + static_off
    path.write_text(json.dumps(saved))
    return str(path)


def test_compare_pairs_the_arms_by_training_seed_across_files(tmp_path):
    from bench.growth import compare, compare_markdown

    base = [_seeded(tmp_path / "b0.json", [[40.0, 42.0], [50.0, 50.0]], 0),
            _seeded(tmp_path / "b5.json", [[60.0, 60.0]], 5)]  # fmt: skip
    # the variant's files in another order: seed 5 first; it gains +2, -4 and +10 on seeds 0, 1, 5
    v = "--ppo.replay 3"
    var = [_seeded(tmp_path / "v5.json", [[70.0, 70.0]], 5, train_args=v),
           _seeded(tmp_path / "v0.json", [[43.0, 43.0], [46.0, 46.0]], 0, train_args=v)]  # fmt: skip
    cmp = compare(base, var)
    assert cmp["training_seeds"] == [0, 1, 5] and cmp["same_hosts"]
    assert set(cmp["controllers"]) == {"ppo"}  # baselines are the pairing check, not a result
    d = cmp["controllers"]["ppo"]["test_acc_diff"]
    assert d["per_seed"] == pytest.approx([2.0, -4.0, 10.0])
    assert d["mean"] == pytest.approx(8 / 3)
    sd = float(np.std([2.0, -4.0, 10.0], ddof=1))
    assert d["sd"] == pytest.approx(sd) and d["t"] == pytest.approx((8 / 3) / (sd / np.sqrt(3)))
    assert (d["variant_better"], d["variant_worse"]) == (2, 1)
    half = 4.303 * sd / np.sqrt(3)
    assert d["ci95"] == pytest.approx([8 / 3 - half, 8 / 3 + half])
    # params added are 100 x the offset in both arms: no difference
    assert cmp["controllers"]["ppo"]["params_added_diff"]["mean"] == pytest.approx(0.0)
    md = compare_markdown({"date": "2026-11-26"}, cmp, "python -m bench.growth --compare ...")
    assert "| 5 | 90.0 | 100.0 | +10.0 |" in md and "better on 2 of 3 seeds" in md
    assert "paired on evaluation hosts as well" in md and "`--ppo.replay 3`" in md


def test_compare_says_when_the_baselines_differ_and_refuses_unpaired_arms(tmp_path):
    from bench.growth import compare, compare_markdown, pool

    a = _seeded(tmp_path / "a.json", [[40.0, 42.0]], 0)
    other_hosts = _seeded(tmp_path / "h.json", [[41.0, 42.0]], 0, static_off=0.5)
    cmp = compare([a], [other_hosts])
    assert not cmp["same_hosts"]
    assert "paired on training seed only" in compare_markdown({"date": "d"}, cmp, "c")
    with pytest.raises(ValueError, match="other training seeds"):
        compare([a], [_seeded(tmp_path / "s5.json", [[40.0, 42.0]], 5)])
    with pytest.raises(ValueError, match="appears twice"):
        compare([a, a], [a])
    with pytest.raises(ValueError, match="one arm is one variant"):
        compare([a, _seeded(tmp_path / "x.json", [[1.0, 2.0]], 1, train_args="--x 1")], [a])
    with pytest.raises(ValueError, match="other numbers of episodes"):
        compare([a], [_seeded(tmp_path / "e.json", [[40.0, 42.0, 43.0]], 0)])
    pooled = tmp_path / "pooled.json"
    pooled.write_text(json.dumps({"learn": pool([a, other_hosts])}))
    with pytest.raises(ValueError, match="is pooled"):
        compare([str(pooled)], [a])


def test_compare_cli_wants_both_arms(tmp_path, capsys):
    from bench.growth import main

    a = _seeded(tmp_path / "a.json", [[40.0, 42.0]], 0)
    with pytest.raises(SystemExit):
        main(["--compare", a])
    assert "--compare and --against go together" in capsys.readouterr().err
    assert main(["--compare", a, "--against", a, "--out", str(tmp_path / "out")]) == 0
    (md,) = (tmp_path / "out").glob("*-compare-growth-learn.md")
    assert "--compare" in md.read_text() and "+0.0" in md.read_text()


def test_pooled_batches_of_seeds_say_which_seeds_and_a_tag_names_the_files(tmp_path):
    from bench.growth import main

    a = _seeded(tmp_path / "a.json", [[40.0, 42.0], [50.0, 50.0]], 0)
    b = _seeded(tmp_path / "b.json", [[60.0, 60.0]], 5)
    out = tmp_path / "out"
    assert main(["--pool", a, b, "--out", str(out), "--tag", "default-seeds0-9"]) == 0
    (md,) = out.glob("*-pooled-growth-learn-default-seeds0-9.md")
    text = md.read_text()
    assert "training seeds 0-1 on cpu A" in text and "training seed 5 on cpu A" in text
    for png in ("acc-vs-params", "learning"):  # the md links the plots under the tagged names
        (plot,) = out.glob(f"*-pooled-growth-learn-default-seeds0-9-{png}.png")
        assert f"]({plot.name})" in text
    with pytest.raises(SystemExit):
        main(["--pool", a, b, "--out", str(out), "--tag", "../x"])


def _learned_from(path, planned: dict, plan: str, offsets: list[float], *, grow_all_off: float = 0.0,
                  host_shift: int = 0) -> str:  # fmt: skip
    """A learn-stage file for the plans stage's seeds: its ``ppo`` scores the plan's episodes plus the
    seed's offset, its ``grow_all`` the plans stage's own (plus ``grow_all_off``, as if another CPU)."""
    n, ks = planned["episodes_per_seed"], planned["training_seeds"]
    eps = planned["per_episode"]
    ppo = [{**e, "final_test_acc": e["final_test_acc"] + offsets[i // n]} for i, e in enumerate(eps[plan])]
    grow_all = [{**e, "final_test_acc": e["final_test_acc"] + grow_all_off,
                 "host_seed": e["host_seed"] + host_shift} for e in eps["grow_all"]]  # fmt: skip
    stage = {"seeds": len(ks), "episodes_per_seed": n, "first_seed": ks[0], "train_args": "",
             "controllers": {"ppo": {"per_episode": ppo}, "grow_all": {"per_episode": grow_all}}}  # fmt: skip
    path.write_text(json.dumps({"learn": stage}))
    return str(path)


def test_plans_run_fixed_schedules_on_the_learn_stages_hosts_and_pair_the_learned_controllers(tmp_path):
    from bench.growth import _against_learned, plans, plans_markdown
    from esper.shell.config.presets import preset
    from esper.shell.eval.episodes import compare_on_config

    plan = "grow:b0=conv_heavy@STANDARD@0.7"
    short = {"lifecycle.max_epochs": 3, "env.train_batches": 1}
    out = plans([plan], seeds=2, episodes=2, first_seed=3, preset_name="smoke", overrides=short)
    assert out["training_seeds"] == [3, 4]
    rows = {r["controller"]: r for r in out["rows"]}
    assert list(rows) == ["static", "grow_all", plan]
    assert [(g["slot"], g["tempo"], g["alpha_target"]) for e in out["per_episode"][plan]
            for g in e["germinations"]] == [(0, "STANDARD", 0.7)] * 4  # fmt: skip
    # seed 4's hosts are evaluation seed 1004's, as the learn stage scores training seed 4 on
    cfg = preset("smoke", {**short, "seed": 4})
    ref = compare_on_config(cfg, ["static"], episodes=2, seed=1004, show_progress=False)
    assert [e["host_seed"] for e in out["per_episode"]["static"][2:]] == [
        e["host_seed"] for e in ref["controllers"]["static"]["per_episode"]
    ]

    episodes_by = {n: [eps[:2], eps[2:]] for n, eps in out["per_episode"].items()}
    acc = {r["controller"]: r["per_seed_test_acc"] for r in out["rows"]}
    learned = _learned_from(tmp_path / "a.json", out, plan, [1.5, -0.5])
    same = _against_learned([learned], [3, 4], episodes_by, acc)
    d = same["paired"]["ppo"][plan]
    assert d["per_seed"] == pytest.approx([1.5, -0.5]) and d["variant_better"] == 1
    assert same["hosts"]["identical"]
    cpu = _learned_from(tmp_path / "b.json", out, plan, [0.0, 0.0], grow_all_off=0.25)
    other = _against_learned([cpu], [3, 4], episodes_by, acc)
    assert not other["hosts"]["identical"]
    assert other["hosts"]["grow_all_seed_mean_max_abs_diff"] == pytest.approx(0.25)
    md = plans_markdown({"date": "2026-11-26"}, {**out, "learned": other}, "python -m bench.growth ...")
    assert f"| ppo | {plan} | +0.0 [" in md and "did not score identically" in md
    with pytest.raises(ValueError, match="other hosts"):
        _against_learned([_learned_from(tmp_path / "c.json", out, plan, [0, 0], host_shift=1)], [3, 4],
                         episodes_by, acc)  # fmt: skip
    with pytest.raises(ValueError, match=r"no runs of training seed\(s\) \[5\]"):
        _against_learned([learned], [3, 4, 5], episodes_by, acc)


def test_plan_rows_give_each_schedules_share_of_grow_alls_gain_and_parameters():
    from bench.growth import plan_rows

    acc = {"static": [40.0, 44.0], "grow_all": [80.0, 84.0], "grow:b0=conv_heavy": [76.0, 76.0]}
    params = {"static": [0.0, 0.0], "grow_all": [1200.0, 1200.0], "grow:b0=conv_heavy": [400.0, 400.0]}
    rows = {r["controller"]: r for r in plan_rows(acc, params)}
    assert rows["grow:b0=conv_heavy"]["gain_share_of_grow_all"] == pytest.approx(34 / 40)
    assert rows["grow:b0=conv_heavy"]["params_share_of_grow_all"] == pytest.approx(1 / 3)
    assert rows["grow_all"]["test_acc_ci95"] == pytest.approx([82 - 12.706 * 2, 82 + 12.706 * 2], abs=1e-3)
    no_gain = plan_rows({**acc, "grow_all": [40.0, 44.0]}, params)
    assert all(r["gain_share_of_grow_all"] is None for r in no_gain)


def test_split_by_placement_says_how_much_of_the_deficit_comes_from_missing_the_plans_seeds():
    from bench.growth import plans_markdown, split_by_placement

    ep = lambda host, acc, grown: {"host_seed": host, "final_test_acc": acc, "grown": grown}
    plan = [ep(h, 80.0, "b0=conv_heavy+b2=depthwise") for h in range(4)]
    learned = [
        ep(0, 79.0, "b0=conv_heavy+b1=conv_light+b2=depthwise"),  # holds it, with more: -1
        ep(1, 81.0, "b2=depthwise+b0=conv_heavy"),  # holds it, another order: +1
        ep(2, 60.0, "b0=conv_heavy"),  # half of it is a miss: -20
        ep(3, 44.0, ""),  # grew nothing: -36
    ]
    d = split_by_placement(learned, plan, "b0=conv_heavy+b2=depthwise")
    assert d["mean"] == pytest.approx(-14.0)
    assert (d["holds"]["episodes"], d["holds"]["mean"], d["holds"]["contribution"]) == (2, 0.0, 0.0)
    assert (d["misses"]["episodes"], d["misses"]["mean"]) == (2, pytest.approx(-28.0))
    assert d["misses"]["held"] == {"b0=conv_heavy+b2 empty": 1, "b0 empty+b2 empty": 1}
    assert d["holds"]["contribution"] + d["misses"]["contribution"] == pytest.approx(d["mean"])
    none_missed = split_by_placement(learned[:2], plan[:2], "b0=conv_heavy")
    assert none_missed["misses"] == {"episodes": 0, "mean": None, "contribution": 0.0, "held": {}}
    swapped = split_by_placement([ep(0, 70.0, "b0=conv_small+b1=conv_heavy")], plan[:1], "b0=conv_heavy")
    assert swapped["misses"]["held"] == {"b0=conv_small": 1}
    with pytest.raises(ValueError, match="other hosts"):
        split_by_placement(learned[::-1], plan, "b0=conv_heavy")
    planned = {"training_seeds": [0], "episodes_per_seed": 4, "rows": [], "seconds": 60.0, "preset": "x",
               "learned": {"files": ["a.json"], "hosts": {"identical": True}, "paired": {},
                           "by_placement": {"ppo": {"grow:b0=conv_heavy+b2=depthwise": d}}}}  # fmt: skip
    md = plans_markdown({"date": "2026-11-27"}, planned, "python -m bench.growth ...")
    assert "| ppo | grow:b0=conv_heavy+b2=depthwise | -14.00 | 2, +0.0, +0.00 | 2, -28.0, -14.00 |" in md
    assert (
        "- ppo against grow:b0=conv_heavy+b2=depthwise: `b0 empty+b2 empty` 1, `b0=conv_heavy+b2 empty` 1"
        in md
    )
