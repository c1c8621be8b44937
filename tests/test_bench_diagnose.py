"""bench.diagnose on a hand-written events.jsonl: what the README's deadline-prune and b0 numbers read."""

from __future__ import annotations

import json

import pytest

from bench.diagnose import (
    b0_returns,
    credit_contrast,
    deadline_prunes,
    dips,
    exposure,
    holding_credit,
    summary,
)


def _write(path, events):
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def _epoch(update, epoch, accs):
    return {"event": "epoch", "update": update, "epoch": epoch, "val_acc": accs}


def _life(update, epoch, env, slot, kind, blueprint="conv_heavy"):
    return {"event": "lifecycle", "update": update, "epoch": epoch, "env": env, "slot": slot, "kind": kind,
            "blueprint": blueprint}  # fmt: skip


def _episode(update, ret, b0):
    germs = [{"slot": 1, "blueprint": "norm"}] + ([{"slot": 0, "blueprint": b0}] if b0 else [])
    return {"event": "episode", "update": update, "return": ret, "germinations": germs}


def test_deadline_prunes_pairs_each_with_a_recent_alpha_set_and_the_next_epochs_accuracy(tmp_path):
    events = [
        _epoch(1, 10, [70.0, 60.0]), _epoch(1, 11, [20.0, 61.0]), _epoch(1, 12, [21.0, 62.0]),
        _life(1, 7, 0, 0, "alpha_set"),  # within 5 epochs before env 0's deadline on slot 0
        _life(1, 3, 1, 0, "alpha_set"),  # 7 epochs before env 1's: too early
        _life(1, 10, 1, 2, "alpha_set"),  # another slot
        _life(1, 10, 0, 0, "timeout_pruned"), _life(1, 10, 1, 0, "timeout_pruned", "norm"),
        _life(1, 12, 1, 1, "timeout_pruned"),  # the last epoch: no next accuracy
        _life(2, 10, 0, 0, "timeout_pruned"),  # another update: update 1's alpha_set does not count
    ]  # fmt: skip
    path = _write(tmp_path / "events.jsonl", events)
    got = deadline_prunes(path)
    assert [(p["env"], p["slot"], p["after_alpha_set"], p["drop"]) for p in got] == [
        (0, 0, True, -50.0), (1, 0, False, 1.0), (1, 1, False, None), (0, 0, False, None)
    ]  # fmt: skip
    assert got[1]["blueprint"] == "norm"
    assert deadline_prunes(path, window=8)[1]["after_alpha_set"] is True
    text = summary([str(path)])
    assert "4 deadline prunes" in text and "after an alpha_set within 5 epochs: 1;" in text


def test_b0_returns_group_the_early_updates_by_slot_0s_first_blueprint(tmp_path):
    heavy, light = "conv_heavy", "conv_light"
    events = [_episode(1, 50.0, heavy), _episode(2, 40.0, light), _episode(3, 60.0, heavy),
              _episode(3, 10.0, None), _episode(9, 99.0, heavy)]  # fmt: skip
    path = _write(tmp_path / "events.jsonl", events)
    assert b0_returns(path) == {"conv_heavy": [50.0, 60.0], "conv_light": [40.0], "-": [10.0]}
    assert b0_returns(path, last_update=9)["conv_heavy"] == pytest.approx([50.0, 60.0, 99.0])


def test_dips_find_one_epoch_drops_that_recover_and_what_came_before(tmp_path):
    """Env 0 dips at epoch 3 after a re-style at epoch 2; env 1 drops at 3 and stays down (not a dip);
    env 0 dips again at 6 after no lifecycle event; an alpha_set keeping the style is no re-style."""
    style = lambda e, s: {**e, "style": s}
    events = [
        _epoch(1, 1, [50.0, 50.0]), _epoch(1, 2, [60.0, 60.0]), _epoch(1, 3, [40.0, 30.0]),
        _epoch(1, 4, [62.0, 31.0]), _epoch(1, 5, [64.0, 32.0]), _epoch(1, 6, [40.0, 30.0]),
        _epoch(1, 7, [66.0, 20.0]),
        style(_life(1, 1, 0, 0, "germinated"), "LINEAR_ADD"),
        style(_life(1, 2, 0, 0, "alpha_set"), "SIGMOID_ADD"),  # env 0, epoch 2: re-style
        style(_life(1, 1, 1, 0, "germinated"), "LINEAR_ADD"),
        style(_life(1, 2, 1, 0, "alpha_set"), "LINEAR_ADD"),  # env 1: same style
        _epoch(2, 1, [50.0, 50.0]), _epoch(2, 2, [34.0, 50.0]),  # the last epoch of update 2: no after
    ]  # fmt: skip
    path = _write(tmp_path / "events.jsonl", events)
    got = dips(path)
    assert [(d["env"], d["epoch"], d["depth"], d["kinds"], d["restyled"]) for d in got] == [
        (0, 3, 20.0, ["alpha_set"], True), (0, 6, 24.0, [], False)
    ]  # fmt: skip
    assert [d["epoch"] for d in dips(path, drop=21.0)] == [6]
    assert (
        "one-epoch dips (>= 15 points, back within 5): 2 (per run 2); after an alpha_set 1, "
        "after a re-style 1, after no lifecycle event 1" in summary([str(path)])
    )


def test_exposure_counts_training_episodes_whose_final_host_holds_the_whole_plan(tmp_path):
    heavy, attn = "b0=conv_heavy", "b2=self_attention"
    plan = f"{heavy}+{attn}"
    grown = [(1, plan), (1, heavy), (2, f"{heavy}+b1=norm+{attn}"), (3, ""), (3, attn), (4, plan),
             (4, f"b0=conv_light+{attn}")]  # fmt: skip
    events = [{"event": "episode", "update": u, "return": 0.0, "grown": g} for u, g in grown]
    (tmp_path / "seed7").mkdir()
    path = _write(tmp_path / "seed7" / "events.jsonl", events)
    got = exposure(path, plan, early=2)
    assert got == {"early": 2, "early_episodes": 3, "all": 3, "episodes": 7, "last": 1, "last_episodes": 2}
    assert exposure(path, heavy, early=1) == {
        "early": 2, "early_episodes": 2, "all": 4, "episodes": 7, "last": 1, "last_episodes": 2
    }  # fmt: skip
    assert "seed7: 2/3, 3/7, 1/2" in summary([str(path)], plans=[plan], early=2)
    for bad in ("", "b0", "b0=conv_heavy+b2"):
        with pytest.raises(ValueError, match="slot=blueprint"):
            exposure(path, bad)
    with pytest.raises(ValueError, match="no episode events"):
        exposure(_write(tmp_path / "empty.jsonl", [_epoch(1, 1, [1.0])]), plan)


def _step(update, epoch, stages, contributions, ops, slots, rewards):
    """An ``epoch`` event of two slots (b0, b1) over len(ops) envs: post-step ``stages`` and measured
    ``contributions`` per env and slot, the op and slot each env's controller chose, its reward."""
    return {"event": "epoch", "update": update, "epoch": epoch, "val_acc": [50.0] * len(ops), "op": ops,
            "slot": slots, "reward": rewards, "stage": stages, "contribution": contributions,
            "slot_names": ["b0", "b1"]}  # fmt: skip


def test_holding_credit_reads_each_choice_on_a_paying_holding_seed_with_the_return_after_it(tmp_path):
    H, B, D = "HOLDING", "BLENDING", "DORMANT"
    events = [
        # epoch 1: env 0's b0 HOLDING after the step; env 1's b0 BLENDING, b1 HOLDING
        _step(1, 1, [[H, D], [B, H]], [[None, None], [0.0, 3.0]], ["WAIT", "WAIT"], ["b0", "b0"], [1.0, 1.0]),
        # epoch 2: env 0 fossilizes its paying b0; env 1 acts on b0 while b1 (paying) holds
        _step(
            1,
            2,
            [["FOSSILIZED", D], [H, H]],
            [[2.0, None], [5.0, 3.0]],
            ["FOSSILIZE", "ADVANCE"],
            ["b0", "b0"],
            [4.0, -1.0],
        ),
        # epoch 3: env 1 waits with both seeds HOLDING; b0 does not pay (0.5 < 1)
        _step(
            1,
            3,
            [["FOSSILIZED", D], [H, H]],
            [[2.0, None], [0.5, 2.0]],
            ["WAIT", "WAIT"],
            ["b0", "b1"],
            [2.0, 0.5],
        ),
        _step(2, 2, [[H, D], [H, D]], [[9.0, None], [9.0, None]], ["WAIT", "WAIT"], ["b0", "b0"], [0.0, 0.0]),
    ]
    path = _write(tmp_path / "events.jsonl", events)
    rows = holding_credit(path, from_update=1)
    got = [(r["update"], r["epoch"], r["env"], r["slot"], r["choice"], r["return_to_go"]) for r in rows]
    assert got == [
        (1, 2, 0, "b0", "FOSSILIZE", 6.0),  # HOLDING before epoch 2's step, paying 2.0; 4 + 2 after it
        (1, 2, 1, "b1", "elsewhere", -0.5),  # env 1 acted on b0, not on its HOLDING b1
        (1, 3, 1, "b1", "WAIT", 0.5),  # b0 was HOLDING before too, but paid 0.5
    ]  # update 2 starts a new episode: its first step has no step before it
    assert [r["update"] for r in holding_credit(path, from_update=2)] == []
    assert holding_credit(path, min_contribution=0.0)[-1][("slot")] == "b1"
    assert len(holding_credit(path, min_contribution=0.0)) == 4  # env 1's b0 at epoch 3 now counts
    # FOSSILIZE against WAIT, matched by epoch: no epoch holds both here
    assert credit_contrast(rows, "FOSSILIZE")["difference"] is None
    both = rows + [{"epoch": 2, "choice": "WAIT", "return_to_go": 2.0}] * 2
    x = credit_contrast(both, "FOSSILIZE")
    assert x == {"difference": 4.0, "weight": 1, "epochs": 1, "spread": None}  # 6 - mean(2, 2)
    assert "FOSSILIZE 1, SET_ALPHA_TARGET 0, PRUNE 0, WAIT 1, elsewhere 1; n/a (0)" in summary(
        [str(path)], credit_from=1
    )
    assert "HOLDING seed" not in summary([str(path)])  # off unless asked
