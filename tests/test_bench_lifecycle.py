"""bench/lifecycle.py (issue 103): the arms' configurations, the rule's verdict on made-up per-host
numbers, the pruned-seed files read apart, and the pruning controller on a tiny env."""

from __future__ import annotations

import dataclasses

import pytest

from bench import lifecycle as L
from esper.core.lifecycle import LifecycleConfig
from esper.core.spec import Stage
from esper.shell.env.config import EnvConfig
from esper.shell.env.governor import GovernorConfig
from esper.shell.env.rollout import EpisodeRunner
from esper.shell.env.vecenv import VecEnv


def _doc(task: str, grown: list[float], big: list[float], arm: str = "D") -> dict:
    return {
        "task": task,
        "meta": {"hosts": len(big)},
        "baselines": {"born_big": {"final_test_acc": big, "train_flops": [1.0] * len(big)}},
        "arms": {arm: {"grow_all": {"final_test_acc": grown, "train_flops": [0.9] * len(big)}}},
    }


def _level(n: int, shift: float, spread: float, base: float = 80.0) -> tuple[list[float], list[float]]:
    big = [base + (i % 5) for i in range(n)]
    grown = [b + shift + spread * ((-1) ** i) for i, b in enumerate(big)]
    return grown, big


def test_the_arms_change_the_lifecycle_alone():
    base = L.arm_config("mnist1d", "A")
    for arm in L.ARMS:
        cfg = L.arm_config("mnist1d", arm)
        assert dataclasses.replace(cfg, lifecycle=base.lifecycle) == base, arm
    assert L.arm_config("mnist1d", "D").lifecycle.incubate is False
    assert L.arm_config("mnist1d", "D").lifecycle.attach_at == "blending"
    with pytest.raises(ValueError, match="unknown arm"):
        L.arm_config("mnist1d", "Z")


def test_the_verdict_needs_all_four_tasks_equivalent_and_recall_within_three():
    four = [t for t in L.TASKS if t != "recall"]
    docs = [_doc(t, *_level(40, 0.1, 0.5)) for t in four]
    docs.append(_doc("recall", *_level(40, -2.0, 0.5)))
    v = L.judge(docs)
    assert v["arms"]["D"]["meets_equivalence"] and v["winner"] == "D"
    # one task a point and a half above born big is not equivalent at +-1: the rule fails it
    docs[0] = _doc(four[0], *_level(40, 1.5, 0.5))
    v = L.judge(docs)
    assert not v["arms"]["D"]["meets_equivalence"] and v["winner"] is None
    assert four[0] in v["arms"]["D"]["not_below_by_1"]  # though it is not below born big
    # recall 4 points under is outside its +-3
    docs[0] = _doc(four[0], *_level(40, 0.1, 0.5))
    docs[-1] = _doc("recall", *_level(40, -4.0, 0.5))
    assert L.judge(docs)["winner"] is None


def test_pruned_seed_files_are_paired_with_their_own_static():
    main = _doc("mnist1d", *_level(8, 0.0, 0.1))
    static = [50.0 + i for i in range(8)]
    pruned = [s - 3.0 for s in static]
    prune_doc = {"task": "mnist1d", "meta": {"hosts": 8}, "baselines": {"static": {"final_test_acc": static}},
                 "arms": {"D": {"prune@21": {"final_test_acc": pruned}}}}  # fmt: skip
    v = L.judge([main, prune_doc])
    assert v["arms"]["D"]["tasks"]["mnist1d"]["hosts"] == 8  # the main file judged, not the prune file
    cost = v["prune"]["mnist1d"]["D prune@21"]
    assert cost["cost"] == pytest.approx(3.0) and cost["hosts"] == 8


def test_the_pruning_controller_prunes_held_seeds_from_its_epoch_and_never_fossilizes():
    cfg = EnvConfig(task="mnist1d", n_envs=1, batch_size=64, train_batches=1, val_batches=1, workers=1)
    life = LifecycleConfig(max_epochs=9, incubate=False, attach_at="blending", g3_min_epochs=1,
                           holding_timeout=9, g5_min_contribution=-100.0)  # fmt: skip
    env = VecEnv(cfg, life, GovernorConfig(), seed=0)
    stages = []
    ctl = L.GrowPruneController(env.blueprint_names.index(env.task.grow_all), life, prune_at=5)
    EpisodeRunner(env, ctl, on_epoch=lambda ev: stages.append([int(s) for s in env.slots["stage"][0]])).run(0)
    flat = [s for epoch in stages for s in epoch]
    assert int(Stage.FOSSILIZED) not in flat  # G5 would pass everywhere: the controller never fossilizes
    assert int(Stage.HOLDING) in flat and int(Stage.PRUNED) in flat
    first_pruned = next(i for i, epoch in enumerate(stages) if int(Stage.PRUNED) in epoch)
    assert first_pruned >= 4  # not before its epoch (the measurement of epoch 5 is the 5th step)
    assert any(int(Stage.EMBARGOED) in epoch for epoch in stages[first_pruned:])  # ramped out, removed
