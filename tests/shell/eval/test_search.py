"""Baselines that search before they are judged (issue 45): ``heuristic_tuned`` chooses its thresholds on
training hosts only and reports them; ``plan_search`` stays within its budget of host epochs and reports
what it spent; both are cached in the run directory; evaluation's ``--data-seed`` draws fresh data and is
refused for a fixed dataset; every controller reports ``compute_host_epochs``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from types import SimpleNamespace

import pytest
import torch

from esper.shell.baselines.heuristic import HeuristicController, HeuristicThresholds
from esper.shell.baselines.simple import GrowAllController
from esper.shell.common.fields import to_dict
from esper.shell.common.seeding import eval_host_seeds, train_host_seeds
from esper.shell.config.presets import preset
from esper.shell.env.tasks import seed_params
from esper.shell.eval import search as S
from esper.shell.eval import store as ST
from esper.shell.eval.episodes import compare_on_config
from esper.shell.evaluate import main
from esper.shell.host.blueprints import BLUEPRINTS

#: A few seconds an episode: 4 epochs of one training batch.
TINY = {"lifecycle.max_epochs": 4, "env.train_batches": 1, "env.val_batches": 1, "updates": 2,
        "env.n_envs": 4, "ppo.n_minibatches": 1}  # fmt: skip


@pytest.fixture(scope="module")
def cfg():
    return preset("smoke", TINY)


@pytest.fixture(scope="module")
def task(cfg):
    return cfg.env.build_task()


def _recording(monkeypatch):
    """Record the host seeds every search episode runs on (the real episodes still run): the plan
    searches' (through the episode store) and the tuned heuristic's."""
    seen: list[int] = []
    for module in (S, ST):
        real = module.run_hosts

        def run_hosts(cfg, task, make, host_seeds, _real=real, **kw):
            seen.extend(host_seeds)
            return _real(cfg, task, make, host_seeds, **kw)

        monkeypatch.setattr(module, "run_hosts", run_hosts)
    return seen


def _training_hosts(cfg, updates: int = 50) -> set[int]:
    return {h for u in range(updates) for h in train_host_seeds(cfg.seed, u, range(cfg.env.n_envs))}


def test_heuristic_tuned_chooses_on_training_hosts_only_and_reports_its_thresholds(cfg, task, monkeypatch):
    seen = _recording(monkeypatch)
    grid = {"min_epoch": (5, 1), "stable_epochs": (3, 0)}
    res = S.tune_heuristic(cfg, task, grid, hosts=2)
    assert set(seen) <= _training_hosts(cfg) and len(set(seen)) == 2  # every candidate on the same 2 hosts
    assert not set(seen) & set(eval_host_seeds(0, range(100)))  # no evaluation host
    assert len(seen) == 4 * 2 and res["compute_host_epochs"] == 8 * cfg.lifecycle.max_epochs
    assert [c["thresholds"] for c in res["candidates"]] == [{}, {"stable_epochs": 0}, {"min_epoch": 1},
                                                            {"min_epoch": 1, "stable_epochs": 0}]  # fmt: skip
    best = max(res["candidates"], key=lambda c: c["val_acc_mean"])
    assert res["changed"] == best["thresholds"]  # the best validation accuracy on training hosts won
    assert HeuristicThresholds(**res["chosen"]).changed() == res["changed"]
    assert res["selection"]["split"] == "validation" and res["selection"]["data_seed"] == task.data_seed


def test_heuristic_thresholds_per_env_and_the_reference_unchanged():
    assert HeuristicThresholds().changed() == {}
    ctl = HeuristicController(("noop", "norm"), preset("smoke").lifecycle, per_env=[HeuristicThresholds(),
                              HeuristicThresholds(min_epoch=1)])  # fmt: skip
    assert ctl._t(1).min_epoch == 1 and ctl._t(0).min_epoch == 5
    with pytest.raises(ValueError, match="2 per-env thresholds for 3 envs"):
        ctl.begin(3)
    with pytest.raises(ValueError, match="not both"):
        HeuristicController(("noop",), preset("smoke").lifecycle, per_env=[HeuristicThresholds()],
                            min_epoch=1)  # fmt: skip


def _synthetic(monkeypatch, value, test=None) -> list[tuple[str, int]]:
    """Replace the search's episodes by ``value(plan, host)`` as the final validation accuracy (and
    ``test(plan, host)`` as the final test accuracy), so that no host trains; returns every (plan, host)
    pair run, in order."""
    ran: list[tuple[str, int]] = []

    def run_hosts(cfg, task, make, host_seeds, **kw):
        names, blueprints = task.make_host().slot_names, list(BLUEPRINTS[task.family])
        env = SimpleNamespace(n=len(host_seeds), blueprint_names=blueprints, slot_names=names)
        plans = ["+".join(f"{names[s]}={blueprints[b]}" for s, b in sorted(p.items()))
                 for p in make(env, list(range(len(host_seeds)))).plans]  # fmt: skip
        pairs = list(zip(plans, host_seeds, strict=True))
        ran.extend(pairs)
        return [{"final_val_acc": value(p, h), "final_test_acc": (test or value)(p, h),
                 "params_added": float(len(p))} for p, h in pairs]  # fmt: skip

    monkeypatch.setattr(ST, "run_hosts", run_hosts)
    return ran


#: A synthetic objective whose best plan is known: each slot adds its blueprint's worth (``b1`` counts
#: twice), plus a little of the host; the best is conv_light in b0, attention in b1, norm in b2.
WORTH = {"norm": 3.0, "attention": 1.0, "depthwise": 2.0, "conv_small": 0.5, "conv_light": 4.0,
         "self_attention": 0.0, "conv_heavy": 2.5}  # fmt: skip
BEST = {"b0": "conv_light", "b1": "attention", "b2": "norm"}


def _additive(plan: str, host: int) -> float:
    parts = dict(p.split("=") for p in plan.split("+"))
    score = sum(WORTH[b] if s != "b1" else 2 * (4.5 - WORTH[b]) for s, b in parts.items())
    score += sum(5.0 for s, b in parts.items() if BEST[s] == b)
    return score + (host % 7) * 0.01


def test_the_plan_search_spends_its_budget_counting_pruned_trials_and_repeats(cfg, task, monkeypatch):
    """Every episode a trial runs is counted, pruned or not: the compute is the budget (less than one
    episode short); a trial's i-th episode runs on training host i, so every trial is judged on the same
    hosts; the same run seed gives the same search, another seed another."""
    ran = _synthetic(monkeypatch, _fake_acc)
    T = cfg.lifecycle.max_epochs
    budget = 60 * T + T - 1  # 60 episodes and most of another: the last does not fit
    res = S.search_plans(cfg, task, budget)
    assert res["episodes"] == len(ran) == 60 and res["compute_host_epochs"] == 60 * T
    assert budget - T < res["compute_host_epochs"] <= budget
    assert sum(c["episodes"] for c in res["candidates"]) == len(ran)  # pruned trials' episodes included
    assert res["trials_pruned"] > 0 and res["pruner"]["rungs_episodes"] == [1, 3]
    assert sum(c["episodes"] for c in res["candidates"] if c["state"] == "pruned") > 0
    hosts = S.selection_host_seeds(cfg, 3)
    for c in res["candidates"]:
        assert [h for p, h in ran if p == c["plan"]] == hosts[: c["episodes"]]
    assert set(h for _, h in ran) <= _training_hosts(cfg)
    # the first trials are each blueprint everywhere, the task's grow_all blueprint first
    assert ran[0] == ("b0=conv_heavy+b1=conv_heavy+b2=conv_heavy", hosts[0])
    assert len({p for p, _ in ran}) == res["trials"]  # no plan tried twice
    assert S.search_plans(cfg, task, budget) == res
    other = S.search_plans(dataclasses.replace(cfg, seed=cfg.seed + 1), task, budget)
    assert [c["plan"] for c in other["candidates"]] != [c["plan"] for c in res["candidates"]]


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_the_plan_search_finds_the_best_plan_of_a_known_objective(task, monkeypatch, sampler):
    """On an additive objective over the 63 plans of two slots (each slot's blueprint adds its worth, the
    best blueprint of each slot a bonus), both samplers find the best plan at the suite's 1x budget (176
    episodes; the space runs out a little before it), and choose it among the trials that ran the most
    hosts (9)."""
    _synthetic(monkeypatch, _additive)
    cfg = preset("smoke", {**TINY, "env.slots": [0, 1]})
    best = "b0=conv_light+b1=attention"
    for seed in range(3):
        res = S.search_plans(dataclasses.replace(cfg, seed=seed), task, 176 * cfg.lifecycle.max_epochs,
                             sampler=sampler)  # fmt: skip
        assert res["sampler"] == sampler and res["episodes"] <= 176 and res["space"] == 63
        assert res["chosen"] == best, seed
        assert res["finalists"]["episodes"] == 9 and best in res["finalists"]["plans"]


def test_the_plan_search_never_reads_the_test_split(cfg, task, monkeypatch):
    """The choice reads validation accuracy only: episodes whose test accuracy is anything else (the
    opposite ranking, or noise) give the same choice, scores and compute."""
    T = cfg.lifecycle.max_epochs
    _synthetic(monkeypatch, _additive, test=lambda p, h: -_additive(p, h))
    first = S.search_plans(cfg, task, 60 * T)
    _synthetic(monkeypatch, _additive, test=lambda p, h: _fake_acc(p, h))
    second = S.search_plans(cfg, task, 60 * T)
    assert first == second and first["selection"]["split"] == "validation"


def test_the_searches_names_their_budgets_and_samplers(cfg):
    full = S.learned_compute(cfg)
    assert S.parse_search("plan_search@1x@random") == ("plan_search", "1x", "random")
    assert S.parse_search("plan_search@random") == ("plan_search", None, "random")
    assert S.parse_search("plan_search_timed@2x") == ("plan_search_timed", "2x", "tpe")
    assert S.parse_search("probe@random") == ("probe", None, "random")
    assert S.parse_search("heuristic_tuned_wide") == ("heuristic_tuned_wide", None, "tpe")
    assert S.plan_budget("plan_search@0.5x@random", cfg) == round(0.5 * full)
    assert S.plan_budget("plan_search@random", cfg) == full
    for bad in ("probe@1x", "heuristic_tuned@random", "plan_search@1x@2x", "plan_search@random@1x",
                "plan_search@1x@grid"):  # fmt: skip
        assert not S.is_searched(bad)
    with pytest.raises(ValueError, match="a sampler"):
        S.plan_budget("plan_search@1x@grid", cfg)


def test_the_searches_ask_for_optuna_in_one_line(cfg, task, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # not installed
    with pytest.raises(ModuleNotFoundError, match=r'pip install -e "\.\[cluster\]"') as err:
        S.search_plans(cfg, task, 4 * cfg.lifecycle.max_epochs)
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def capped():
    return preset("smoke", {**TINY, "ppo.param_cap_share": 0.6})  # 0.6 of grow_all's 1,200: 720


def test_plan_search_cap_searches_only_the_plans_within_the_learned_controllers_cap(capped, task,
                                                                                    monkeypatch):  # fmt: skip
    assert S.learner_cap(capped, task) == pytest.approx(720.0)
    host = task.make_host()
    space = S.plan_space(task, host.slot_names, [True] * 3, seed=0)
    within = S.plans_within(space, task, host, 720.0)
    assert within == [p for p in space if seed_params(task, host, p) <= 720]  # the same order, filtered
    assert "b0=conv_heavy+b1=conv_heavy+b2=conv_heavy" not in within  # grow_all's plan adds 1,200
    assert "b0=conv_heavy+b1=conv_light" in within and 0 < len(within) < len(space)
    seen = _recording(monkeypatch)
    T = capped.lifecycle.max_epochs
    res = S.search("plan_search_cap@" + str(9 * T), capped, task)
    assert res["cap_params"] == pytest.approx(720.0) and res["compute_host_epochs"] == len(seen) * T <= 9 * T
    tried = [c["plan"] for c in res["candidates"]]
    assert tried and all(seed_params(task, host, p) <= 720 for p in tried)
    uniform = [p for p in within if p.count("+") == 2 and len({b.split("=")[1] for b in p.split("+")}) == 1]
    assert tried and set(uniform) <= set(tried) and res["chosen"] in tried  # each blueprint everywhere first
    assert len(tried) == res["trials"] == len(seen)  # 9 episodes: 9 trials of one host each (no pruning)
    # plan_search on the same config: its first candidate is grow_all's plan, over the cap
    free = S.search_plans(capped, task, 4 * T)
    assert "cap_params" not in free
    assert "b0=conv_heavy+b1=conv_heavy+b2=conv_heavy" in [c["plan"] for c in free["candidates"]]


def test_plan_search_cap_refuses_a_learner_without_a_cap_in_one_line(cfg, task):
    with pytest.raises(ValueError, match="no parameter cap to search within") as err:
        S.search("plan_search_cap", cfg, task)
    assert "\n" not in str(err.value)
    tiny = preset("smoke", {**TINY, "ppo.param_cap": 10.0})  # below every blueprint (the smallest adds 17)
    with pytest.raises(ValueError, match="no plan adds at most 10"):
        S.search("plan_search_cap@0.5x", tiny, task)


def test_plan_budget_names(cfg):
    full = S.learned_compute(cfg)
    assert full == cfg.updates * cfg.env.n_envs * cfg.lifecycle.max_epochs
    assert S.plan_budget("plan_search", cfg) == full
    assert S.plan_budget("plan_search@0.5x", cfg) == round(0.5 * full)
    assert S.plan_budget("plan_search@100", cfg) == 100
    with pytest.raises(ValueError, match="host epochs"):
        S.plan_budget("plan_search@lots", cfg)
    assert S.plan_budget("plan_search_cap@0.5x", cfg) == round(0.5 * full)
    assert S.plan_budget("plan_search_cap", cfg) == full
    searched = ("plan_search", "plan_search@2x", "plan_search_cap", "plan_search_cap@9")
    assert all(S.is_searched(n) for n in searched)
    assert not any(
        S.is_searched(n) for n in ("plan_search_", "plan_searcher@1x", "grow_all", "plan_search_capx")
    )


def test_per_env_plans_grow_each_envs_own_plan(cfg, task):
    from esper.shell.eval.runner import run_hosts

    plans = [{0: 2}, {1: 3}, {0: 2, 2: 3}, {2: 2}]
    recs = run_hosts(cfg, task, lambda env, batch: GrowAllController(plans, cfg.lifecycle), [1, 2, 3, 4])
    names = task.make_host().slot_names
    for plan, rec in zip(plans, recs, strict=True):
        grown = {g.split("=")[0] for g in rec["grown"].split("+")} if rec["grown"] else set()
        assert grown <= {names[s] for s in plan}


def test_every_controller_reports_its_compute_and_searches_are_cached(cfg, task, tmp_path, monkeypatch):
    monkeypatch.setattr(S, "TUNE_GRID", {"min_epoch": (5, 1)})
    monkeypatch.setattr(S, "TUNE_HOSTS", 1)
    names = ["static", "grow_all", "heuristic_tuned", "plan_search@0.5x"]
    res = compare_on_config(cfg, names, episodes=2, seed=3, show_progress=False, task=task,
                            search_cache=tmp_path)  # fmt: skip
    ctl = res["controllers"]
    assert ctl["static"]["compute_host_epochs"] == 0 and ctl["grow_all"]["compute_host_epochs"] == 0
    assert ctl["heuristic_tuned"]["compute_host_epochs"] == 2 * cfg.lifecycle.max_epochs
    spent = ctl["plan_search@0.5x"]["compute_host_epochs"]
    assert 0 < spent <= S.plan_budget("plan_search@0.5x", cfg)
    assert "chosen" in ctl["plan_search@0.5x"]["search"]
    assert json.loads((tmp_path / "heuristic_tuned.json").read_text())["result"]["chosen"]
    meta = res["meta"]
    assert meta["host_seeds"] == eval_host_seeds(3, range(2)) and meta["data_seed"] == task.data_seed
    # a second evaluation reads the choice from the cache: no search episode runs
    seen = _recording(monkeypatch)
    again = compare_on_config(cfg, ["heuristic_tuned"], episodes=2, seed=3, show_progress=False, task=task,
                              search_cache=tmp_path)  # fmt: skip
    assert seen == []
    assert again["controllers"]["heuristic_tuned"]["search"] == ctl["heuristic_tuned"]["search"]


def _fake_episodes(monkeypatch, fail_on_call: int | None = None,
                   ran: list[int] | None = None) -> list[list[tuple[str, int]]]:  # fmt: skip
    """Replace the search's episodes by a fixed function of (plan, host) (plus the task's data seed where
    ``ran`` is given, which collects the data seed of every episode run), so that no host trains. Returns
    the (plan, host) pairs of each call of ``run_hosts``, as called; call ``fail_on_call`` (0-based) dies."""
    calls: list[list[tuple[str, int]]] = []

    def run_hosts(cfg, task, make, host_seeds, **kw):
        if len(calls) == fail_on_call:
            raise RuntimeError("killed")
        names, blueprints = task.make_host().slot_names, list(BLUEPRINTS[task.family])
        env = SimpleNamespace(n=len(host_seeds), blueprint_names=blueprints, slot_names=names)
        plans = ["+".join(f"{names[s]}={blueprints[b]}" for s, b in sorted(p.items()))
                 for p in make(env, list(range(len(host_seeds)))).plans]  # fmt: skip
        calls.append(list(zip(plans, host_seeds, strict=True)))
        draw = 0 if ran is None else task.data_seed
        if ran is not None:
            ran.extend(task.data_seed for _ in host_seeds)
        return [{"final_val_acc": _fake_acc(p, h) + draw, "params_added": float(len(p))}
                for p, h in calls[-1]]  # fmt: skip

    monkeypatch.setattr(ST, "run_hosts", run_hosts)
    return calls


def _fake_acc(plan: str, host: int) -> float:
    return int(hashlib.sha256(f"{plan}/{host}".encode()).hexdigest()[:6], 16) / 2**24 * 100


#: The searches of one suite seed, in the order an evaluation runs them.
SEARCHES = ("plan_search@0.25x", "plan_search@0.5x", "plan_search@1x", "plan_search@2x", "plan_search_cap@1x")


def test_plan_searches_share_their_batches_and_choose_as_they_would_alone(task, tmp_path, monkeypatch):
    """With a cache directory, the searches of a run keep their batches in the run's episode store
    (``search/episode-store.jsonl``), and a later search reads a batch it asks for again instead of
    running it (on the batched step a batch, not a pair, is what repeats number for number). Every
    search chooses, scores and counts exactly what it does without the store, and runs exactly the
    batches it runs without one, less those it reads: the store changes what runs, never the rule, the
    numbers or the compute a search reports."""
    cfg = preset("smoke", {**TINY, "updates": 40, "ppo.param_cap_share": 0.6})
    calls = _fake_episodes(monkeypatch)
    alone, first_alone, per_search, width = {}, [], {}, S.search_width(cfg)
    for n in SEARCHES:  # no cache: no store (run_hosts is handed a round's pairs: its batches of width)
        before = len(calls)
        alone[n] = S.search(n, cfg, task)
        per_search[n] = [tuple(c[i : i + width]) for c in calls[before:] for i in range(0, len(c), width)]
        first_alone = first_alone or [p for c in calls for p in c]
    assert all("episodes_reused" not in r for r in alone.values())
    run_alone = sum(len(c) for c in calls)
    assert run_alone == sum(r["episodes"] for r in alone.values())
    seen, repeats = set(), 0  # the batches a later search asks for again
    for n in SEARCHES:
        repeats += sum(len(c) for c in per_search[n] if c in seen)
        seen |= set(per_search[n])
    calls.clear()
    shared, first_shared = {}, []
    for n in SEARCHES:
        shared[n] = S.search(n, cfg, task, cache=tmp_path)
        first_shared = first_shared or list(calls)
    batches = [tuple(c) for c in calls]
    assert len(batches) == len(set(batches)) and set(batches) == seen  # each batch runs once
    for n in SEARCHES:
        got = {k: v for k, v in shared[n].items() if k not in ("episodes_reused", "seconds")}
        assert got == {k: v for k, v in alone[n].items() if k != "seconds"}, n
    reused = sum(r["episodes_reused"] for r in shared.values())
    assert shared[SEARCHES[0]]["episodes_reused"] == 0 and reused == repeats > 0
    assert sum(len(c) for c in batches) + reused == run_alone  # what ran plus what was read: all scored
    kept = [json.loads(line) for line in (tmp_path / ST.STORE_FILE).read_text().splitlines()]
    assert sum(len(r["pairs"]) for r in kept) == sum(len(c) for c in batches)
    # the first search, with nothing kept, runs its episodes in the same order and batches
    assert [p for c in first_shared for p in c] == first_alone
    assert all(len(c) <= width for c in first_shared)


def test_a_search_stopped_part_way_resumes_from_its_last_batch(cfg, task, tmp_path, monkeypatch):
    """Each batch is kept as it ends: a search killed in its third batch keeps the first two, and run
    again it runs only the rest. A last line cut short and lines of another run's settings are ignored."""
    monkeypatch.setattr(S, "SEARCH_WIDTH", cfg.env.n_envs)  # batches of 4
    name, T = f"plan_search@{18 * cfg.lifecycle.max_epochs}", cfg.lifecycle.max_epochs  # 18 episodes
    calls = _fake_episodes(monkeypatch, fail_on_call=2)  # batches of 4: the third dies
    with pytest.raises(RuntimeError, match="killed"):
        S.search(name, cfg, task, cache=tmp_path)
    path = tmp_path / ST.STORE_FILE
    done = [p for c in calls for p in c]
    assert [len(c) for c in calls] == [4, 4] and len(path.read_text().splitlines()) == 2
    elsewhere = dataclasses.replace(cfg, seed=cfg.seed + 1)
    assert S.plan_store(tmp_path, elsewhere, task).batches == {}  # another key
    with path.open("a") as f:
        f.write('{"key": "cut sho')
    again = _fake_episodes(monkeypatch)
    res = S.search(name, cfg, task, cache=tmp_path)
    rerun = [p for c in again for p in c]
    assert not set(rerun) & set(done) and res["episodes_reused"] == len(done) == 8
    assert res["episodes"] == len(done) + len(rerun) == 18 and res["compute_host_epochs"] == 18 * T
    kept = S.plan_store(tmp_path, cfg, task).batches
    assert sum(len(b) for b in kept) == 18  # the line after the cut one is whole


def test_kept_episodes_are_the_real_episodes_numbers(cfg, task, tmp_path, monkeypatch):
    """On real episodes: a search with a store keeps each episode as the search scored it, and another
    search that asks for the same batch (the timed search's first round is plan_search's: the same
    candidates on the same host) reads it instead of training again, number for number."""
    seen = _recording(monkeypatch)
    T = cfg.lifecycle.max_epochs
    first = S.search(f"plan_search@{2 * T}", cfg, task, cache=tmp_path)  # 2 candidates on 1 host
    kept = [json.loads(line) for line in (tmp_path / ST.STORE_FILE).read_text().splitlines()]
    assert len(kept) == 1 and len(kept[0]["records"]) == len(seen) == 2
    assert sorted(r["final_val_acc"] for r in kept[0]["records"]) == sorted(
        c["val_acc_mean"] for c in first["candidates"])  # fmt: skip
    seen.clear()
    timed = S.search(f"plan_search_timed@{2 * T}", cfg, task, cache=tmp_path)
    assert timed["episodes_reused"] == timed["episodes"] == 2 and seen == []
    assert timed["candidates"] == first["candidates"]


def test_plan_episode_store_keys_on_the_task_data_seed_not_the_configs(cfg, task, tmp_path, monkeypatch):
    """A search handed a task of another data draw than its config's ``env.data_seed`` (here the config
    names none: the task's default draw, or another) keeps its episodes under that task's draw: two
    searches of one config on two draws share no episode, each scores its own draw's, and a search on a
    rebuilt task of the first draw reads every episode the first ran instead of running it again."""
    ran: list[int] = []
    _fake_episodes(monkeypatch, ran=ran)  # an episode's numbers depend on the draw it ran on
    other = dataclasses.replace(cfg.env, data_seed=task.data_seed + 1).build_task()
    assert cfg.env.data_seed is None and other.name == task.name and other.data_seed != task.data_seed
    budget = 4 * cfg.lifecycle.max_epochs

    def searched(t):
        return S.search_plans(cfg, t, budget, store=S.plan_store(tmp_path, cfg, t))

    first = searched(task)
    assert first["episodes_reused"] == 0 and ran == [task.data_seed] * first["episodes"]
    ran.clear()
    second = searched(other)  # same config, same (plan, host) pairs, another draw: runs them all
    assert second["episodes_reused"] == 0 and ran == [other.data_seed] * second["episodes"]
    assert second["selection"]["data_seed"] == other.data_seed
    assert {c["plan"]: c["val_acc_mean"] - 1 for c in second["candidates"]} == {
        c["plan"]: c["val_acc_mean"] for c in first["candidates"]
    }  # each scored its own draw's episodes
    ran.clear()
    rebuilt = dataclasses.replace(cfg.env, data_seed=task.data_seed).build_task()
    again = searched(rebuilt)  # the first draw again, under the same config: all read, none run
    assert ran == [] and again["episodes_reused"] == again["episodes"] == first["episodes"]
    assert again["candidates"] == first["candidates"] and again["chosen"] == first["chosen"]
    assert S.plan_store(tmp_path, cfg, other).batches != S.plan_store(tmp_path, cfg, task).batches


def test_a_cached_search_is_read_back_only_for_the_data_draw_it_searched(cfg, task, tmp_path, monkeypatch):
    """The result cache (``cache/NAME.json``) is keyed by the controller and the config, which a task of
    another data draw shares: a search handed such a task runs on its own draw (its episodes, its
    choice) instead of returning the first draw's result, and a search on the draw the cache holds reads
    it, running nothing."""
    ran: list[int] = []
    _fake_episodes(monkeypatch, ran=ran)
    other = dataclasses.replace(cfg.env, data_seed=task.data_seed + 1).build_task()
    name = f"plan_search@{4 * cfg.lifecycle.max_epochs}"
    first = S.search(name, cfg, task, cache=tmp_path)
    assert first["selection"]["data_seed"] == task.data_seed and set(ran) == {task.data_seed}
    ran.clear()
    second = S.search(name, cfg, other, cache=tmp_path)  # the same key, another draw: its own search
    assert second["selection"]["data_seed"] == other.data_seed and set(ran) == {other.data_seed}
    assert second["candidates"] != first["candidates"]
    ran.clear()
    assert S.search(name, cfg, other, cache=tmp_path) == second and ran == []  # the draw it holds: read
    third = S.search(name, cfg, cache=tmp_path)  # no task: the config's draw (the first's), searched again
    assert third["selection"]["data_seed"] == task.data_seed and third["candidates"] == first["candidates"]
    assert ran == [] and third["episodes_reused"] == third["episodes"]  # its episodes kept: read, not run


def test_controllers_that_grow_the_same_fixed_plan_run_their_episodes_once(cfg, task, monkeypatch):
    """Plan searches that chose one plan and a ``grow:`` placement of it are one controller: its episodes
    run once, and each later row is a copy naming the first in ``same_episodes_as``. A placement with
    blend settings, or of another plan, runs its own. The copy is what running it again gives: the
    same plan on the same hosts and draw repeats number for number, whatever ran before it."""
    import esper.shell.eval.episodes as E

    monkeypatch.setattr(E, "search", lambda name, *a, **kw: {"chosen": "b1=norm+b0=conv_heavy",
                                                             "compute_host_epochs": 8})  # fmt: skip
    ran = []
    real = E.run_episodes

    def run_episodes(cfg, task, name, *a, **kw):
        ran.append(name)
        return real(cfg, task, name, *a, **kw)

    monkeypatch.setattr(E, "run_episodes", run_episodes)
    names = ["plan_search@0.5x", "static", "plan_search@1x", "grow:b0=conv_heavy+b1=norm",
             "grow:b0=conv_heavy+b1=norm@STANDARD", "grow:b0=conv_heavy"]  # fmt: skip
    res = compare_on_config(cfg, names, episodes=2, seed=5, show_progress=False, task=task)
    ctl = res["controllers"]
    assert ran == ["plan_search@0.5x", "static", "grow:b0=conv_heavy+b1=norm@STANDARD", "grow:b0=conv_heavy"]
    for copy in ("plan_search@1x", "grow:b0=conv_heavy+b1=norm"):
        assert ctl[copy]["same_episodes_as"] == "plan_search@0.5x"
        assert ctl[copy]["per_episode"] == ctl["plan_search@0.5x"]["per_episode"]
    assert ctl["plan_search@1x"]["compute_host_epochs"] == 8 and "search" in ctl["plan_search@1x"]
    assert ctl["grow:b0=conv_heavy+b1=norm"]["compute_host_epochs"] == 0
    assert all("same_episodes_as" not in ctl[n] for n in (*ran,))
    alone = compare_on_config(cfg, ["grow:b0=conv_heavy+b1=norm"], episodes=2, seed=5, show_progress=False,
                              task=task)["controllers"]["grow:b0=conv_heavy+b1=norm"]  # fmt: skip
    assert alone["per_episode"] == ctl["plan_search@0.5x"]["per_episode"]


def _run_dir(tmp_path, **over):
    """A run directory holding only a config (enough to evaluate the baselines)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(to_dict(preset("smoke", {**TINY, **over}))))
    return run


def test_evaluate_data_seed_draws_fresh_data_and_records_the_seeds(tmp_path, capsys):
    run = _run_dir(tmp_path)
    args = [str(run), "--episodes", "2", "--controllers", "static", "--no-progress", "--threads", "1"]
    assert main([*args, "--out", str(tmp_path / "own")]) == 0
    assert main([*args, "--data-seed", "5", "--out", str(tmp_path / "fresh")]) == 0
    own = json.loads((tmp_path / "own" / "results.json").read_text())
    fresh = json.loads((tmp_path / "fresh" / "results.json").read_text())
    assert own["meta"]["data_seed"] == 42 and fresh["meta"]["data_seed"] == 5
    assert fresh["meta"]["selection_data_seed"] == 42
    assert fresh["meta"]["host_seeds"] == own["meta"]["host_seeds"]
    acc = lambda r: [e["final_test_acc"] for e in r["controllers"]["static"]["per_episode"]]
    assert acc(own) != acc(fresh)  # the same hosts on other data
    assert "data: data seed 5 (the run's own draw: 42)" in capsys.readouterr().out


def test_evaluate_refuses_a_data_seed_for_a_fixed_dataset_in_one_line(tmp_path, capsys):
    run = _run_dir(tmp_path, **{"env.task": "digits", "env.image_size": 8, "env.channels": (4, 8, 8)})
    assert main([str(run), "--controllers", "static", "--data-seed", "5", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "fixed dataset; its test split is the only held-out draw" in err and "\n" not in err


def test_torch_threads_untouched_by_the_search_module():
    assert torch.get_num_threads() >= 1  # importing the module sets nothing
