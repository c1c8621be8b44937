"""``python -m esper.shell.suite.confirm``: a confirmation's runs, each kept in the repository once evaluated
(with what its reading takes from the training events), so that the runs outlive the machine that made
them, and never trained with a library other than the one the rule pins."""

import gzip
import json
import shutil
import subprocess

import pytest

import esper.shell.suite.confirm as confirm
from esper.shell.eval.suite.archive import load_seed, save_seed
from esper.shell.eval.suite.readings import CREDIT_FROM
from esper.shell.eval.suite.tasks import final_data_seed
from esper.shell.suite import launch

TASKS = ("mnist1d_deep", "longrange")


FRESH = (300, 301)


def _results(k: int, task: str, greedy: float) -> dict:
    meta = {"episodes": 10, "eval_seed": 1000 + k, "data_seed": final_data_seed(task, k), "run_dir": "x"}
    return {"meta": meta, "controllers": {"ppo_greedy": {"test_acc_mean": greedy},
                                          "ppo": {"test_acc_mean": greedy - 1.0}}}  # fmt: skip


def _events(path, fossilized: int, kept: int) -> None:
    lines = [{"event": "lifecycle", "update": 15, "kind": "fossilized"}] * fossilized
    lines += [{"event": "lifecycle", "update": 20, "kind": "timeout_fossilized"}] * kept
    lines.append({"event": "lifecycle", "update": 3, "kind": "fossilized"})  # early: not counted
    lines.append({"event": "episode", "update": 22, "env": 1, "grown": "b0=conv_heavy", "final_val_acc": 80.0,
                  "return": 3.5, "host_seed": 7})  # fmt: skip
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))


@pytest.fixture
def fake_runs(monkeypatch):
    """Training and evaluation replaced by stand-ins that write a run's events and results: the calls made,
    by (task, seed), with the training flags."""
    calls: dict = {"train": [], "evaluate": []}

    def train(k, root, extra):
        calls["train"].append((root.parent.name, root.name, k, list(extra)))
        run = root / f"seed{k}"
        run.mkdir(parents=True, exist_ok=True)
        _events(run / "events.jsonl", fossilized=5 if "--ppo.fossilize_bias" in extra else 1, kept=2)
        (run / "config.json").write_text(json.dumps({"seed": k}))
        return run, 123.0

    def evaluate(run_dir, k, episodes, names, out, data_seed, extra, in_process=False):
        assert not in_process  # confirm runs its arms side by side in threads: each evaluates in a process
        calls["evaluate"].append((run_dir, k, tuple(names), out, data_seed, tuple(extra)))
        task = run_dir.parent.name
        greedy = 81.0 if run_dir.parent.parent.name == "fb4" else 80.0
        results = _results(k, task, greedy)
        results["controllers"].update({n: {"test_acc_mean": greedy + 0.5} for n in names})
        if "ppo_greedy" in names:
            results["controllers"]["ppo_greedy"]["grown_counts"] = {"b0=conv_heavy": 10}
        return results

    monkeypatch.setattr(launch, "train", train)
    monkeypatch.setattr(launch, "evaluate", evaluate)
    monkeypatch.setattr(confirm, "library_matches", lambda rev: True)
    return calls


def test_a_seed_is_trained_evaluated_and_kept_with_its_counts(tmp_path, fake_runs):
    path = confirm.confirm_seed("fb4", "longrange", 300, tmp_path / "runs", tmp_path / "kept", "abc")
    assert path == tmp_path / "kept" / "fb4" / "longrange" / "seed300.json.gz"
    ((arm, task, k, flags),) = fake_runs["train"]
    assert (arm, task, k) == ("fb4", "longrange", 300)
    assert flags == ["--preset", "longrange", "--threads", "1", "--ppo.fossilize_bias", "4"]
    (_, _, names, out, data_seed, extra), diagnosis = fake_runs["evaluate"]
    assert names == ("ppo", "ppo_greedy") and out == "eval-fresh" and extra == ("--threads", "1")
    assert data_seed == final_data_seed("longrange", 300)
    # the diagnosis rows, while the policy is here: its own most grown plan; fossilizing wherever legal
    assert (
        diagnosis[2] == ("grow:b0=conv_heavy", "ppo_greedy_fossilize")
        and diagnosis[3] == "eval-fresh-diagnosis"
    )
    with gzip.open(path, "rb") as f:
        kept = json.loads(f.read())
    assert kept["fossils"] == {"fossilized": 5, "timeout_fossilized": 2}
    assert kept["credit"]["from_update"] == 12 and kept["credit"]["contrast"]["difference"] is None
    assert kept["meta"]["train_seconds"] == 123.0
    assert list(kept["controllers"]) == ["ppo_greedy", "ppo_greedy_plan", "ppo_greedy_fossilize", "ppo"]
    assert kept["run_config"] == {"seed": 300}  # the baselines can be evaluated from it later
    (episode,) = kept["train_episodes"]  # what it grew on its training hosts, kept beyond its events
    assert episode["grown"] == "b0=conv_heavy" and episode["update"] == 22 and "host_seed" not in episode


def test_a_kept_seed_without_its_diagnosis_rows_gets_them_while_its_run_is_here(tmp_path, fake_runs):
    runs, archive = tmp_path / "runs", tmp_path / "kept"
    save_seed(archive / "fb4", "mnist1d", 302, _results(302, "mnist1d", 81.0), 99.0)  # kept before the rows
    confirm.confirm_seed("fb4", "mnist1d", 302, runs, archive, None)
    assert fake_runs["evaluate"] == []  # no run directory: kept as it is
    run = runs / "fb4" / "mnist1d" / "seed302"
    run.mkdir(parents=True)
    (run / "checkpoint.pt").write_bytes(b"x")
    (run / "events.jsonl").write_text(json.dumps({"event": "run_end", "t": 99.0}) + "\n")
    path = confirm.confirm_seed("fb4", "mnist1d", 302, runs, archive, None)
    assert fake_runs["train"] == [] and len(fake_runs["evaluate"]) == 1
    with gzip.open(path, "rb") as f:
        kept = json.loads(f.read())
    assert "ppo_greedy_fossilize" in kept["controllers"] and kept["meta"]["train_seconds"] == 99.0


def test_a_kept_seed_is_not_run_again(tmp_path, fake_runs):
    for _ in range(2):
        confirm.confirm_seed("default", "mnist1d_deep", 301, tmp_path / "runs", tmp_path / "kept", None)
    assert len(fake_runs["train"]) == 1 and len(fake_runs["evaluate"]) == 2  # the table's, the diagnosis


def test_a_library_other_than_the_pinned_one_trains_nothing(tmp_path, fake_runs, monkeypatch):
    monkeypatch.setattr(confirm, "library_matches", lambda rev: False)
    with pytest.raises(RuntimeError, match="differs from f608ea9"):
        confirm.confirm_seed("fb4", "mnist1d", 300, tmp_path / "runs", tmp_path / "kept", "f608ea9")
    assert fake_runs["train"] == []
    assert confirm.main(["default", "fb4", "--runs", str(tmp_path / "r"), "--archive", str(tmp_path / "k"),
                         "--rev", "f608ea9", "--tasks", "mnist1d", "--seeds", "1"]) == 1  # fmt: skip


def test_the_command_runs_the_arms_side_by_side_seed_by_seed(tmp_path, fake_runs):
    argv = ["default", "fb4", "--runs", str(tmp_path / "r"), "--archive", str(tmp_path / "k"),
            "--tasks", "mnist1d,longrange", "--first-seed", "300", "--seeds", "2"]  # fmt: skip
    assert confirm.main(argv) == 0
    for arm in ("default", "fb4"):
        order = [(task, k) for a, task, k, _ in fake_runs["train"] if a == arm]
        assert order == [("mnist1d", 300), ("longrange", 300), ("mnist1d", 301), ("longrange", 301)]
    assert len(list((tmp_path / "k").rglob("*.json.gz"))) == 8
    with pytest.raises(SystemExit):  # an arm named twice would race itself
        confirm.main(["fb4", "fb4", "--runs", str(tmp_path / "r"), "--archive", str(tmp_path / "k")])


def test_library_matches_reads_the_working_tree_against_the_revision(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "esper").mkdir()
    (tmp_path / "esper" / "a.py").write_text("x = 1\n")
    (tmp_path / "notes.md").write_text("a\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    (tmp_path / "notes.md").write_text("b\n")  # outside esper/: still the same library
    assert confirm.library_matches("HEAD", tmp_path)
    (tmp_path / "esper" / "a.py").write_text("x = 2\n")
    assert not confirm.library_matches("HEAD", tmp_path)
    with pytest.raises(RuntimeError, match="git diff"):
        confirm.library_matches("no-such-rev", tmp_path)


def test_an_unknown_arm_is_refused():
    with pytest.raises(ValueError, match="unknown arm"):
        confirm.train_args("mnist1d", "fb9")


def test_the_kept_seeds_alone_hold_what_a_reading_takes(tmp_path, fake_runs):
    """Every pair run through the driver, then the run directories removed: what was kept holds each arm's
    readouts on the suite's hosts and draw, its late fossilization counts and its credit reading."""
    for k in FRESH:
        for task in TASKS:
            for arm in ("default", "fb4"):
                confirm.confirm_seed(arm, task, k, tmp_path / "runs", tmp_path / "kept", None)
    shutil.rmtree(tmp_path / "runs")
    kept = tmp_path / "kept"
    for k in FRESH:
        for task in TASKS:
            fb4, default = (load_seed(kept / arm, task, k, confirm.EPISODES, final_data_seed(task, k))
                            for arm in ("fb4", "default"))  # fmt: skip
            greedy = [seed["controllers"]["ppo_greedy"]["test_acc_mean"] for seed in (fb4, default)]
            assert greedy[0] - greedy[1] == pytest.approx(1.0)  # the pair a reading compares
            assert fb4["fossils"] == {"fossilized": 5, "timeout_fossilized": 2}
            assert default["fossils"] == {"fossilized": 1, "timeout_fossilized": 2}
            # no paying HOLDING seed in these events: nothing chosen
            assert fb4["credit"]["from_update"] == CREDIT_FROM
            assert set(fb4["credit"]["counts"].values()) == {0}


def test_status_says_where_each_run_stands_and_runs_nothing(tmp_path, fake_runs, capsys):
    runs, kept = tmp_path / "runs", tmp_path / "kept"
    confirm.confirm_seed("fb4", "mnist1d", 300, runs, kept, None)
    partial = runs / "default" / "mnist1d" / "seed300"
    partial.mkdir(parents=True)
    (partial / "events.jsonl").write_text(json.dumps({"event": "ppo_update", "update": 1}) + "\n")
    n = len(fake_runs["train"])
    argv = ["default", "fb4", "--runs", str(runs), "--archive", str(kept), "--tasks", "mnist1d",
            "--seeds", "1"]  # fmt: skip
    assert confirm.main([*argv, "--status"]) == 0
    printed = capsys.readouterr().out
    assert "| `mnist1d` | 300 | 1/22 updates | kept |" in printed and "1 of 2 runs kept." in printed
    assert len(fake_runs["train"]) == n


def test_nocap_arm_trains_without_cap_or_budget():
    """The ``nocap`` arm's flags, read by the task's preset as its training reads them, leave the learned
    controller no parameter cap and the reward no budget, where the default has both on every task."""
    from esper.shell.config.presets import preset

    for task in ("mnist1d", "recall"):
        args = confirm.train_args(task, "nocap")
        flags = dict(zip(args[::2], args[1::2], strict=True))
        name = flags.pop("--preset")
        flags.pop("--threads")
        overrides = {k.removeprefix("--"): float(v) for k, v in flags.items()}
        cfg, base = preset(name, overrides), preset(name)
        assert base.ppo.has_param_cap and base.reward.param_budget_share > 0
        assert not cfg.ppo.has_param_cap
        assert cfg.reward.param_budget == 0 and cfg.reward.param_budget_share == 0
