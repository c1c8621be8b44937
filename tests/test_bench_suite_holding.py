"""bench.suite.holding: why a controller's seeds are not fossilized, read before every step."""

import json
from types import SimpleNamespace

import torch

from bench.suite import holding
from esper.core.lifecycle import LifecycleConfig, gate_readiness, init_slots
from esper.core.masks import legal_masks
from esper.core.spec import ActionSpec, Stage
from esper.shell.common.fields import to_dict
from esper.shell.config.presets import preset


def _slot(slots, s, stage, alpha, ramp_from, ramp_to, ramp_len, ramp_pos, contribution=2.0):
    for k, v in dict(stage=int(stage), alpha=alpha, ramp_from=ramp_from, ramp_to=ramp_to, ramp_len=ramp_len,
                     ramp_pos=ramp_pos, contribution=contribution).items():  # fmt: skip
        slots[k][0, s] = v


def test_each_waiting_seed_gets_the_reason_it_waits():
    slots = init_slots(1, [True] * 9)
    _slot(slots, 0, Stage.BLENDING, 0.5, 0.0, 1.0, 3, 1)  # its blend-in
    _slot(slots, 1, Stage.BLENDING, 1.0, 1.0, 1.0, 3, 1)  # a ramp to the alpha it holds
    _slot(slots, 2, Stage.BLENDING, 0.8, 1.0, 0.5, 3, 1)  # a ramp down
    _slot(slots, 3, Stage.BLENDING, 1.0, 1.0, 1.0, 0, 0)  # settled
    _slot(slots, 4, Stage.HOLDING, 1.0, 1.0, 1.0, 0, 0)  # settled and pays: FOSSILIZE is legal
    _slot(slots, 5, Stage.HOLDING, 1.0, 1.0, 1.0, 3, 0)  # a same-alpha ramp blocks it
    _slot(slots, 6, Stage.HOLDING, 0.9, 1.0, 0.7, 3, 1)
    _slot(slots, 7, Stage.HOLDING, 1.0, 1.0, 1.0, 0, 0, contribution=-1.0)  # does not pay
    _slot(slots, 8, Stage.TRAINING, 0.0, 0.0, 0.0, 0, 0)  # not waiting on a blend or a gate
    # the env's own masks, as a step's input carries them (G5 at a contribution of 0 points)
    gates = gate_readiness(slots, torch.tensor([50.0]), LifecycleConfig(g5_min_contribution=0.0))
    step = SimpleNamespace(slots=slots, legal=legal_masks(slots, ActionSpec(9, 2), gates=gates))
    assert holding.classify(step) == [[
        "blend_in", "blend_ramp_same", "blend_ramp_other", "blend_settled", "legal", "ramp_same",
        "ramp_other", "below_gate", None,
    ]]  # fmt: skip


def test_a_fixed_plan_fossilizes_where_it_is_legal_and_the_tally_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    # the tiny hosts barely learn: a G5 threshold every blended seed passes makes FOSSILIZE legal
    tiny = {"lifecycle.max_epochs": 16, "env.train_batches": 1, "env.val_batches": 1, "env.n_envs": 2,
            "lifecycle.g5_min_contribution": -100.0}  # fmt: skip
    (run / "config.json").write_text(json.dumps(to_dict(preset("smoke", tiny))))
    out = tmp_path / "tally.json"
    argv = [str(run), "--controller", "grow_all", "--episodes", "2", "--eval-seed", "3", "--out", str(out)]
    assert holding.main(argv) == 0
    rec = json.loads(out.read_text())
    mean = rec["mean_per_episode"]
    assert len(rec["per_episode"]) == len(rec["test_acc"]) == 2
    # grow_all blends each seed in, waits out G3, and fossilizes as soon as FOSSILIZE is offered
    assert mean["blend_in"] > 0 and mean.get("legal: fossilize", 0) > 0
    assert mean.get("legal: set_alpha_target", 0) == 0 and mean.get("ramp_same", 0) == 0
    assert sum(rec["n_fossilized"]) / 2 == mean["end:fossilized"]
    assert "test acc per episode" in capsys.readouterr().out


def test_the_table_sums_each_column_s_tallies_per_run(tmp_path, capsys):
    mean = {"blend_ramp_same": 34.0, "end:blend_ramp_same": 1.3, "end:ramp_same": 1.0, "end:legal": 0.2}
    rec = {"run_dir": "/x/mnist1d_deep/seed202", "mean_per_episode": mean}
    (tmp_path / "a.json").write_text(json.dumps(rec))
    assert holding.main(["--table", str(tmp_path / "a.json")]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    headers = [h for h, _ in holding.COLUMNS]
    assert cells[:2] == ["`mnist1d_deep`", "202"]
    assert cells[2 + headers.index("BLENDING, same-alpha ramp")] == "34.0"
    assert cells[2 + headers.index("at the end: in a same-alpha ramp")] == "2.3"
    assert cells[2 + headers.index("at the end: otherwise waiting")] == "0.2"
    assert cells[2 + headers.index("blend-in")] == "0.0"
