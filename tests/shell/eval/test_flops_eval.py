"""An episode's FLOPs in the evaluation (issue 103): every episode records what it spent (training,
validation, what-if), a plan born big costs more training FLOPs than the same plan grown, the batched host
step counts each env as the per-env one does, counting leaves every episode's numbers as they were, and the
tables carry the FLOPs beside host epochs (— where a results file predates them; a store's record kept
before them is run again)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from esper.core.spec import DEFAULT_BLEND, Stage
from esper.shell.config.presets import preset
from esper.shell.env.vecenv import VecEnv
from esper.shell.eval.episodes import FLOP_FIELDS, compare_on_config
from esper.shell.eval.output import FLOP_COLUMNS, format_flops, report_markdown
from esper.shell.eval.store import RECORD_VERSION, STORE_VERSION, EpisodeStore, config_digest
from esper.shell.eval.suite.pooling import pooled_flops
from esper.shell.eval.suite.report import _section
from esper.shell.host.flops import FlopCounter

#: ``grow_all`` and the same plan born big (its seeds fossilized at alpha 1 from epoch 0).
GROWN, BORN = "grow_all", "born_big"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cfg():
    return preset("smoke")


@pytest.fixture(scope="module")
def results(cfg):
    return compare_on_config(cfg, ["static", GROWN, BORN], episodes=2, seed=3, show_progress=False)


def test_every_episode_records_its_flops_by_kind(results):
    for name, s in results["controllers"].items():
        for ep in s["per_episode"]:
            assert all(isinstance(ep[k], int) and ep[k] >= 0 for k in FLOP_FIELDS), name
            assert ep["train_flops"] > 0 and ep["validation_flops"] > 0
        for k in FLOP_FIELDS:
            assert s[f"{k}_mean"] == sum(ep[k] for ep in s["per_episode"]) / len(s["per_episode"])


def test_a_plan_born_big_costs_more_training_flops_than_the_same_plan_grown(cfg, results):
    ctl = results["controllers"]
    born, grown, static = ctl[BORN], ctl[GROWN], ctl["static"]
    assert born["train_flops_mean"] > grown["train_flops_mean"] >= static["train_flops_mean"]
    assert born["whatif_flops_mean"] == static["whatif_flops_mean"] == 0  # nothing ever incubates
    assert grown["whatif_flops_mean"] > 0  # grown seeds incubate first
    # born big trains one architecture throughout: max_epochs epochs of its batches times one batch's count
    task = cfg.env.build_task()
    host = task.make_host()
    blueprint = host.blueprint_names.index(task.grow_all)
    for s in range(host.n_slots):
        host.germinate(s, blueprint, DEFAULT_BLEND["style"])
        host.set_slot(s, alpha=1.0, stage=Stage.FOSSILIZED)
    counter = FlopCounter()
    shapes = task.make_loaders(0).train.epoch_shapes()
    per_epoch = sum(n * counter.train(host, shape).host for shape, n in shapes.items())
    assert born["train_flops_mean"] == cfg.lifecycle.max_epochs * per_epoch


def test_the_batched_host_step_counts_each_env_as_the_per_env_step(cfg, results):
    per_env = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, host_step="per_env"))
    ref = compare_on_config(per_env, ["static", BORN, GROWN], episodes=2, seed=3, show_progress=False)
    assert cfg.env.batched and not per_env.env.batched
    for name, s in results["controllers"].items():
        for a, b in zip(s["per_episode"], ref["controllers"][name]["per_episode"], strict=True):
            assert {k: a[k] for k in FLOP_FIELDS} == {k: b[k] for k in FLOP_FIELDS}, name


def test_counting_flops_leaves_every_episode_as_it_was(cfg, results, monkeypatch):
    names = ["random", GROWN, BORN]
    counted = compare_on_config(cfg, names, episodes=2, seed=5, show_progress=False)
    monkeypatch.setattr(VecEnv, "_count_flops", lambda self, *a, **k: None)
    uncounted = compare_on_config(cfg, names, episodes=2, seed=5, show_progress=False)
    for name in names:
        a, b = counted["controllers"][name], uncounted["controllers"][name]
        drop = lambda ep: {k: v for k, v in ep.items() if k not in FLOP_FIELDS}
        assert [drop(e) for e in a["per_episode"]] == [drop(e) for e in b["per_episode"]], name
        assert a["val_acc_curve_mean"] == b["val_acc_curve_mean"]
    assert any(e["whatif_flops"] > 0 for e in counted["controllers"]["random"]["per_episode"])


def test_the_tables_carry_the_flops_beside_host_epochs_and_read_old_files(results):
    md = report_markdown(results, [])
    head = next(line for line in md.splitlines() if line.startswith("| controller |"))
    assert "| host epochs spent | train FLOPs | validation FLOPs | what-if FLOPs |" in head
    born = next(line for line in md.splitlines() if line.startswith(f"| {BORN} |"))
    assert born.endswith(
        " | ".join(format_flops(results["controllers"][BORN][k]) for _, k in FLOP_COLUMNS) + " |"
    )
    # a results file written before the FLOPs were counted: every cell —
    old = json.loads(json.dumps(results))
    for s in old["controllers"].values():
        for _, k in FLOP_COLUMNS:
            del s[k]
    born = next(line for line in report_markdown(old, []).splitlines() if line.startswith(f"| {BORN} |"))
    assert born.endswith("| — | — | — |")
    # the suite's pooling: the mean over seeds, None where a seed's evaluation predates them
    entries = [results["controllers"][BORN], old["controllers"][BORN]]
    assert pooled_flops(entries[:1]) == {k: results["controllers"][BORN][k] for _, k in FLOP_COLUMNS}
    assert set(pooled_flops(entries).values()) == {None}


def _task_entry(controllers: dict) -> dict:
    row = {"test_acc_mean": 80.0, "test_acc_ci95": [79.0, 81.0], "params_added_mean": 100.0,
           "compute_host_epochs": 0, "training_seeds": [0]}  # fmt: skip
    return {"controllers": {n: {**row, **c} for n, c in controllers.items()},
            "data": {"final_data_seeds": [1], "eval_seeds": [0], "selection_data_seed": 42,
                     "episodes_per_seed": 2}}  # fmt: skip


def test_the_suite_table_shows_the_flops_where_the_file_records_them():
    flops = {"train_flops_mean": 7.67e9, "validation_flops_mean": 1.21e9, "whatif_flops_mean": 0.0}
    new = "\n".join(_section("## t", _task_entry({"static": flops, "grow_all": {}}), [], []))
    assert "| host epochs spent | FLOPs an episode: train · validation · what-if |" in new
    assert "| 7.67 G · 1.21 G · 0 |" in new and "| — · — · — |" in new
    old = "\n".join(_section("## t", _task_entry({"static": {}}), [], []))
    assert "FLOPs" not in old  # a file pooled before them renders as it did


def test_an_evaluations_store_reads_no_record_kept_before_the_flops_were_counted(cfg, tmp_path):
    task = cfg.env.build_task()
    store = EpisodeStore(tmp_path / "store.jsonl", cfg, task)
    before = (
        f"v{STORE_VERSION}:{config_digest(cfg)}:{task.name}:{task.data_seed}:threads{torch.get_num_threads()}"
    )
    assert store.key == f"{before}:records{RECORD_VERSION}" and RECORD_VERSION >= 2
    record = {"final_test_acc": 50.0, "env": 0}
    counted = {**record, "train_flops": 5}
    kept = [{"key": before, "pairs": [["static", 1]], "records": [record]},  # kept before issue 103
            {"key": store.key, "pairs": [["static", 2]], "records": [counted]}]  # fmt: skip
    store.path.write_text("".join(json.dumps(line) + "\n" for line in kept))
    store = EpisodeStore(store.path, cfg, task)
    assert store.get([("static", 1)]) is None  # run again
    assert store.get([("static", 2)]) == [counted]
    # a search's store keeps only what it reads (never FLOPs): its key is as it was
    search = EpisodeStore(store.path, cfg, task, fields=("final_test_acc",))
    assert search.key == f"{before}:final_test_acc"
