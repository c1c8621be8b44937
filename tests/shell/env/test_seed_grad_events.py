"""Seed gradient health in the epoch events and the report (issue 92): per live seed its gradient norm,
the shares of vanishing and exploding parameter tensors and the health score, from what host training
measured (no host sync of its own), null where a slot held no seed."""

from __future__ import annotations

from esper.shell import run
from esper.shell.env.rollout import PER_ENV_FIELDS, SEED_GRAD_FIELDS
from esper.shell.telemetry.events import read_events


def test_a_smoke_runs_epoch_events_carry_per_seed_gradient_health(tmp_path):
    status = run.main(["--preset", "smoke", "--run_dir", str(tmp_path), "--name", "g", "--report", "true"])
    assert status == 0
    epochs = [e for e in read_events(tmp_path / "g" / "events.jsonl") if e["event"] == "epoch"]
    assert epochs
    seen = 0
    for ev in epochs:
        n_envs, n_slots = len(ev["val_acc"]), len(ev["slot_names"])
        for key in SEED_GRAD_FIELDS:
            assert len(ev[key]) == n_envs and all(len(row) == n_slots for row in ev[key]), key
        for e in range(n_envs):
            for s in range(n_slots):
                measured = ev["grad_ratio"][e][s] is not None  # the slot held a seed when measured
                values = {k: ev[k][e][s] for k in SEED_GRAD_FIELDS}
                assert all((v is not None) == measured for v in values.values()), (ev["epoch"], values)
                if measured:
                    seen += 1
                    assert values["seed_grad_norm"] >= 0.0
                    assert 0.0 <= values["seed_grad_vanishing"] <= 1.0
                    assert 0.0 <= values["seed_grad_exploding"] <= 1.0
                    v, x = values["seed_grad_vanishing"], values["seed_grad_exploding"]
                    assert abs(values["seed_grad_health"] - max(0.0, 1.0 - 0.5 * v - 0.8 * x)) < 1e-6
    assert seen > 0  # the smoke run grows seeds: some step measured one
    assert any(ev["seed_grad_norm"][e][s] for ev in epochs for e in range(2) for s in range(3)
               if ev["seed_grad_norm"][e][s] is not None)  # a trained seed has a gradient  # fmt: skip
    assert (tmp_path / "g" / "plots" / "seed_grad_health.png").is_file()
    assert "seed_grad_health.png" in (tmp_path / "g" / "report.md").read_text()


def test_the_seed_health_fields_are_merged_across_processes_per_env():
    assert set(SEED_GRAD_FIELDS) <= set(PER_ENV_FIELDS)
