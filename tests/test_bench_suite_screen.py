"""``python -m bench.suite.screen``: an arm paired seed by seed with the suite's kept seeds, decided by the
rule the screens wrote before their runs (pooled paired mean at least +0.5, no task's below -0.5)."""

import json

import pytest

from bench.suite.archive import save_seed
from bench.suite.run import final_data_seed
from bench.suite.screen import EVAL, decide, fossil_counts, main, markdown, read_screen

TASKS = ("mnist1d_deep", "longrange")
SEEDS = (200, 201)


def _results(k: int, task: str, greedy: float, episodes: int = 10, eval_seed: int | None = None) -> dict:
    meta = {"episodes": episodes, "eval_seed": 1000 + k if eval_seed is None else eval_seed,
            "data_seed": final_data_seed(task, k), "run_dir": "x"}  # fmt: skip
    return {"meta": meta, "controllers": {"ppo_greedy": {"test_acc_mean": greedy},
                                          "ppo": {"test_acc_mean": greedy - 1.0}}}  # fmt: skip


def _screen(tmp_path, deltas: dict[str, float], skip: tuple = (), eval_seed: int | None = None):
    """The suite at 80 on every seed; the arm at 80 + the task's delta (seed 201 one point further)."""
    archive, arm = tmp_path / "seeds", tmp_path / "runs" / "fb4"
    for task in TASKS:
        for k in SEEDS:
            save_seed(archive, task, k, _results(k, task, 80.0), 60.0)
            if (task, k) in skip:
                continue
            out = arm / task / f"seed{k}" / EVAL
            out.mkdir(parents=True)
            greedy = 80.0 + deltas[task] + (k - 200) * 1.0
            (out / "results.json").write_text(json.dumps(_results(k, task, greedy, eval_seed=eval_seed)))
    return arm, archive


@pytest.mark.parametrize(("deltas", "goes_on"), [
    ({"mnist1d_deep": 0.5, "longrange": 0.0}, True),   # pooled +0.75, both tasks above -0.5
    ({"mnist1d_deep": 2.0, "longrange": -1.5}, False),  # pooled +0.75, but one task at -1.0
    ({"mnist1d_deep": -0.5, "longrange": -0.5}, False),  # pooled 0: under +0.5
])  # fmt: skip
def test_the_screen_decides_by_its_rule(tmp_path, deltas, goes_on):
    arm, archive = _screen(tmp_path, deltas)
    screen = read_screen(arm, archive, TASKS, SEEDS)
    assert screen["pairs"] == screen["of"] == 4
    rows = screen["tasks"]["mnist1d_deep"]["seeds"]
    assert rows[201]["paired"] == pytest.approx(deltas["mnist1d_deep"] + 1.0)
    assert rows[200]["arm_ppo"] == pytest.approx(79.0 + deltas["mnist1d_deep"])
    d = decide(screen)
    assert d["decided"] and d["goes_on"] is goes_on
    assert screen["pooled"][0] == pytest.approx(sum(deltas.values()) / 2 + 0.5)
    verdict = "goes on to a rule of its own" if goes_on else "does not go on"
    assert f"**decision: {verdict}**" in markdown(screen, d, "fb4")


def test_nothing_is_decided_until_every_pair_is_in(tmp_path):
    arm, archive = _screen(tmp_path, {"mnist1d_deep": 3.0, "longrange": 3.0}, skip=(("longrange", 201),))
    screen = read_screen(arm, archive, TASKS, SEEDS)
    assert screen["pairs"] == 3 and screen["tasks"]["longrange"]["seeds"][201] == {"missing": "arm"}
    d = decide(screen)
    assert not d["decided"] and d["goes_on"] is None
    text = markdown(screen, d, "fb4")
    assert "not decided: 3 of 4 pairs in" in text and "| `longrange` | 201 | not in yet (arm) |" in text


def test_an_arm_evaluated_on_other_hosts_is_not_paired(tmp_path):
    arm, archive = _screen(tmp_path, {"mnist1d_deep": 0.0, "longrange": 0.0}, eval_seed=7)
    with pytest.raises(ValueError, match="would not be paired"):
        read_screen(arm, archive, TASKS, SEEDS)


def test_fossil_counts_read_the_late_updates_only(tmp_path):
    events = tmp_path / "events.jsonl"
    lines = [{"event": "lifecycle", "update": u, "kind": kind}
             for u, kind in [(11, "fossilized"), (12, "fossilized"), (22, "timeout_fossilized"),
                             (23, "fossilized"), (15, "timeout_pruned"), (16, "fossilized")]]  # fmt: skip
    lines.append({"event": "ppo_update", "update": 12, "kind": "fossilized"})
    events.write_text("\n".join(map(json.dumps, lines)) + "\n")
    assert fossil_counts(events) == {"fossilized": 2, "timeout_fossilized": 1}
    assert fossil_counts(tmp_path / "none.jsonl") is None


def test_the_command_prints_and_writes_the_table(tmp_path, capsys):
    arm, archive = _screen(tmp_path, {"mnist1d_deep": 1.0, "longrange": 1.0})
    out = tmp_path / "screen.md"
    assert main([str(arm), "--archive", str(archive), "--seeds", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == out.read_text() and "| `mnist1d_deep` | 200 | 81.0 | 80.0 | 80.0 | +1.00 |" in printed
    with pytest.raises(SystemExit):
        main([str(arm), "--archive", str(archive), "--tasks", "nope"])


FRESH = (300, 301)


def _two_arms(tmp_path, deltas: dict[tuple[str, int], float], base_eval_seed: int | None = None):
    """A base arm at 80 on every fresh seed and an arm at 80 + delta, both evaluated into eval-fresh."""
    base, arm = tmp_path / "fresh" / "default", tmp_path / "fresh" / "fb4"
    for task in TASKS:
        for k in FRESH:
            for root, greedy, seed in ((base, 80.0, base_eval_seed), (arm, 80.0 + deltas[task, k], None)):
                out = root / task / f"seed{k}" / "eval-fresh"
                out.mkdir(parents=True)
                (out / "results.json").write_text(json.dumps(_results(k, task, greedy, eval_seed=seed)))
    return arm, base


STEADY = {("mnist1d_deep", 300): 1.0, ("mnist1d_deep", 301): 1.2, ("longrange", 300): 0.8,
          ("longrange", 301): 1.1}  # fmt: skip
SPREAD = {("mnist1d_deep", 300): 3.0, ("mnist1d_deep", 301): -1.8, ("longrange", 300): 3.0,
          ("longrange", 301): -1.8}  # fmt: skip


@pytest.mark.parametrize(("deltas", "adopted"), [(STEADY, True), (SPREAD, False)])
def test_a_confirmation_pairs_two_arms_and_asks_its_interval_above_zero(tmp_path, deltas, adopted):
    """Both pass the screen's rule (pooled +1.03 and +0.60); the spread one's interval spans zero, so the
    confirmation's stricter rule adopts only the steady one."""
    arm, base = _two_arms(tmp_path, deltas)
    screen = read_screen(arm, tmp_path / "no-archive", TASKS, FRESH, base_dir=base, eval_dir="eval-fresh")
    assert screen["pairs"] == 4
    assert screen["tasks"]["longrange"]["seeds"][301]["paired"] == pytest.approx(deltas["longrange", 301])
    assert screen["pooled"][0] == pytest.approx(sum(deltas.values()) / 4)
    assert decide(screen)["goes_on"]  # the screen's rule would let both through
    d = decide(screen, confirm=True)
    assert d["decided"] and d["goes_on"] is adopted
    assert d["checks"]["pooled interval above zero"] is adopted
    text = markdown(screen, d, "fb4", "`default`")
    assert f"**decision: {'adopted' if adopted else 'not adopted'}**" in text
    assert "| task | seed | `fb4` `ppo_greedy` | `fb4` `ppo` | `default` `ppo_greedy` |" in text


def test_a_base_evaluated_on_other_hosts_is_not_paired(tmp_path):
    arm, base = _two_arms(tmp_path, STEADY, base_eval_seed=7)
    with pytest.raises(ValueError, match="would not be paired"):
        read_screen(arm, tmp_path, TASKS, FRESH, base_dir=base, eval_dir="eval-fresh")


def test_the_command_confirms_against_a_base(tmp_path, capsys):
    arm, base = _two_arms(tmp_path, SPREAD)
    args = [str(arm), "--base", str(base), "--eval", "eval-fresh", "--first-seed", "300", "--seeds", "2"]
    assert main([*args, "--confirm"]) == 0
    printed = capsys.readouterr().out
    assert "**decision: not adopted**" in printed and "pooled interval above zero fails" in printed
    assert main(args) == 0 and "**decision: goes on to a rule of its own**" in capsys.readouterr().out
