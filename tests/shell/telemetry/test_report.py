from __future__ import annotations

import pytest

from esper.core.spec import HEADS, Stage
from esper.shell.report import main
from esper.shell.telemetry.events import EventLog

PNG = b"\x89PNG\r\n\x1a\n"
SLOTS = ("b0", "b1")


def _write_run(
    run_dir, *, n_updates: int = 3, n_envs: int = 2, n_epochs: int = 6, ppo: bool = True, runpy: bool = False
) -> None:
    """A synthetic log. ``runpy``: the variant esper.shell.run writes (provenance dict, slot indices,
    past-tense lifecycle kinds, no slot_names)."""
    config = {"n_envs": n_envs, "env": {"max_epochs": n_epochs}, "ppo": {"lr": 3e-4}, "seed": 7}
    prov = {"versions": {"torch": "2.13.0"}, "git_rev": "abc1234", "device": "cpu"}
    if runpy:
        prov = {"provenance": {"torch": "2.13.0", "git_rev": "abc1234", "device": "cpu"}}
    slot = 0 if runpy else "b0"
    kinds = ("germinated", "fossilized") if runpy else ("germinate", "fossilize")
    with EventLog(run_dir / "events.jsonl") as log:
        log.write("run_start", config=config, **prov)
        for u in range(n_updates):
            for ep in range(n_epochs):
                stage = Stage.TRAINING if ep < 3 else Stage.FOSSILIZED
                log.write(
                    "epoch",
                    update=u,
                    epoch=ep,
                    val_acc=[0.5 + 0.01 * ep] * n_envs,
                    val_loss=[1.0] * n_envs,
                    train_loss=[1.1] * n_envs,
                    reward=[0.1] * n_envs,
                    op=["WAIT"] * n_envs,
                    slot=["b0"] * n_envs,
                    blueprint=["conv_light"] * n_envs,
                    stage=[[stage, Stage.DORMANT] for _ in range(n_envs)],
                    alpha=[[0.0 if ep < 3 else 1.0, 0.0] for _ in range(n_envs)],
                    **({} if runpy else {"slot_names": list(SLOTS)}),
                    timings={"train": 0.1},
                )
            for env in range(n_envs):
                log.write(
                    "lifecycle",
                    update=u,
                    epoch=0,
                    env=env,
                    slot=slot,
                    kind=kinds[0],
                    blueprint="conv_light",
                    stage=Stage.GERMINATED,
                )
                log.write(
                    "lifecycle",
                    update=u,
                    epoch=3,
                    env=env,
                    slot=slot,
                    kind=kinds[1],
                    blueprint="conv_light",
                    stage=Stage.FOSSILIZED,
                )
                log.write(
                    "episode",
                    update=u,
                    env=env,
                    **{"return": 1.0 + u + env},
                    final_val_acc=0.60 + 0.1 * u,
                    best_val_acc=0.65 + 0.1 * u,
                    final_test_acc=50.0 + 10 * u,
                    params_added=100 * (env + 1),
                    n_fossilized=1,
                    n_pruned=0,
                    reward_components={"accuracy": 1.0},
                    op_counts={"WAIT": 4, "GERMINATE": 1, "FOSSILIZE": 1},
                )
            if ppo:
                log.write(
                    "ppo_update",
                    update=u,
                    loss_objective=-0.01 * u,
                    loss_critic=0.5 / (u + 1),
                    loss_entropy=-0.05,
                    entropy=4.0,
                    kl_approx=0.01,
                    clip_fraction=0.1,
                    explained_variance=0.3,
                    max_ratio=1.2,
                    min_ratio=0.8,
                    head_entropy={h: 0.9 - 0.1 * u for h in HEADS},
                    head_weight=dict.fromkeys(HEADS, 0.5),
                    head_choice_share={
                        "op": [0.6 - 0.1 * u, 0.4 + 0.1 * u, 0, 0, 0, 0],
                        "slot": [0.5, 0.5],
                        "tempo": [0.9 + 0.05 * u, 0.1 - 0.05 * u, 0.0],
                    },
                )
        log.write(
            "anomaly", update=1, kind="kl_spike", value=0.08, threshold=0.03, detail="kl_approx > 3 x EMA"
        )
        log.write(
            "note", update=2, kind="prior_commitment", value=0.003, threshold=0.0116,
            detail="head tempo (weight 0.127) committed to FAST, the choice its start bias favours",
            severity="note",
        )  # fmt: skip
        log.write("governor", update=2, epoch=4, env=1, reason="spike")
        log.write(
            "heldout_check", episodes=4, controller="ppo", test_acc=71.5, static_test_acc=45.25,
            params_added=400.0, gain=26.25, gain_ci95=[20.0, 32.5], greedy_test_acc=73.5,
            greedy_params_added=520.0, greedy_gain=28.25, greedy_gain_ci95=[22.0, 34.5],
        )  # fmt: skip
        log.write("run_end", summary={"best_val_acc": 0.85})


def _is_png(path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG


def test_report_writes_plots_and_summary(tmp_path):
    _write_run(tmp_path)
    assert main([str(tmp_path)]) == 0
    plots = tmp_path / "plots"
    for name in ("returns", "accuracy", "entropy", "choices", "seed_timeline", "losses"):
        assert _is_png(plots / f"{name}.png"), name
    md = (tmp_path / "report.md").read_text()
    assert "updates: 3 (3 PPO updates, 6 episodes)" in md
    assert "final val accuracy (update 2, mean over 2 envs): 0.8" in md
    assert "best val accuracy (any episode): 0.85" in md
    assert "final test accuracy (update 2, mean over 2 envs): 70, 150 parameters added" in md
    assert "held-out check (4 fresh hosts): ppo 71.5 % test accuracy with 400 parameters added vs the " \
        "static host 45.25 %; gain 26.25 points (95 % CI 20 to 32.5); its most likely actions " \
        "(ppo_greedy) 73.5 % with 520 parameters, gain 28.25 points (95 % CI 22 to 34.5)" in md  # fmt: skip
    assert "mean return: 1.5 (update 0) → 3.5 (update 2); slope 1 per update" in md
    assert "fossilize 6" in md and "germinate 6" in md
    assert "governor rollbacks: 1 (spike 1)" in md
    assert "kl_spike" in md and "Anomalies (1)" in md
    # a note (issue 47) is listed apart from the alarms: no fault, what the run asked for
    assert "## Notes (1)" in md and "committed to FAST" in md and md.index("Anomalies") < md.index("Notes")
    assert "`n_envs` | 2" in md and "`ppo.lr` | 0.0003" in md and "abc1234" in md
    assert "![seed_timeline](plots/seed_timeline.png)" in md


def test_report_on_a_heuristic_run_skips_ppo_plots(tmp_path):
    _write_run(tmp_path, n_updates=1, n_envs=1, n_epochs=2, ppo=False, runpy=True)
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('{"event": "epoch", "upd')  # a crash mid-line
    assert main([str(tmp_path)]) == 0
    plots = tmp_path / "plots"
    assert _is_png(plots / "returns.png") and _is_png(plots / "seed_timeline.png")
    assert not (plots / "entropy.png").exists() and not (plots / "losses.png").exists()
    assert not (plots / "choices.png").exists()
    md = (tmp_path / "report.md").read_text()
    assert "updates: 1 (0 PPO updates, 1 episodes)" in md and "entropy.png" not in md
    assert "git: `abc1234`" in md and "torch 2.13.0" in md and "germinated 1" in md


def test_report_counts_each_episode_once_and_notes_a_torn_line(tmp_path):
    """A log written before resumes rewound it (or by hand) may hold an update twice: the report
    counts the last copy once; a torn last line is skipped and noted."""
    _write_run(tmp_path, n_updates=2)
    lines = (tmp_path / "events.jsonl").read_text().splitlines(keepends=True)
    again = [ln for ln in lines if '"update":1' in ln and ('"episode"' in ln or '"ppo_update"' in ln)]
    with open(tmp_path / "events.jsonl", "a") as f:
        f.writelines(again)
        f.write('{"event":"episode","update":2,"en')
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "updates: 2 (2 PPO updates, 4 episodes)" in md
    assert f"{len(again)} duplicate episode / PPO-update event(s) counted once" in md
    assert "torn line" in md


def test_report_errors_clearly_on_missing_inputs(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        main([str(tmp_path / "nope")])
    assert err.value.code == 2 and "nope does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    err = capsys.readouterr().err
    assert "events.jsonl does not exist" in err and err.count("\n") == 1 and "--help" in err
    (tmp_path / "events.jsonl").write_text('{"event":"run_start"}\n{"event":\n{"event":"run_end"}\n')
    with pytest.raises(SystemExit) as err:
        main([str(tmp_path)])
    out = capsys.readouterr().err
    assert err.value.code == 2 and ":2: malformed event line" in out and out.count("\n") == 1


def test_report_plots_the_blueprints_germinated_per_slot_and_update(tmp_path):
    """Episode events that list their germinations give ``blueprints.png`` (one panel per slot); a log
    without them (older runs, the heuristic's) has no such plot and the report still renders."""
    _write_run(tmp_path, n_updates=2)
    assert main([str(tmp_path)]) == 0
    assert not (tmp_path / "plots" / "blueprints.png").exists()
    assert "blueprints.png" not in (tmp_path / "report.md").read_text()

    run_dir = tmp_path / "with"
    run_dir.mkdir()
    _write_run(run_dir, n_updates=2)
    with EventLog(run_dir / "events.jsonl") as log:
        for env, bps in enumerate((("conv_heavy", "depthwise"), ("conv_light", "depthwise"))):
            log.write("episode", update=1, env=env, **{"return": 2.0}, final_test_acc=70.0, params_added=520,
                      germinations=[{"epoch": 1, "slot": 0, "blueprint": bps[0]},
                                    {"epoch": 2, "slot": 1, "blueprint": bps[1]}])  # fmt: skip
    assert main([str(run_dir)]) == 0
    assert _is_png(run_dir / "plots" / "blueprints.png")
    assert "![blueprints](plots/blueprints.png)" in (run_dir / "report.md").read_text()


def test_plot_blueprints_counts_each_slots_germinations(tmp_path):
    """The bars are the counts per (slot, blueprint, update): two episodes of update 1 germinating
    conv_heavy and conv_light in b0 and depthwise in b1 give b0 {conv_heavy: 1, conv_light: 1} and b1
    {depthwise: 2}."""
    from esper.shell.telemetry.events import RunEvents
    from esper.shell.telemetry.plots import germination_counts, plot_blueprints

    episodes = [
        {"update": 1, "env": env,
         "germinations": [{"slot": 0, "blueprint": bp}, {"slot": 1, "blueprint": "depthwise"}]}
        for env, bp in enumerate(("conv_heavy", "conv_light"))
    ]  # fmt: skip
    run = RunEvents([{"event": "episode", **e} for e in episodes])
    counts = {key: dict(per_update) for key, per_update in germination_counts(run).items()}
    assert counts == {(0, "conv_heavy"): {1: 1}, (0, "conv_light"): {1: 1}, (1, "depthwise"): {1: 2}}
    assert plot_blueprints(run, tmp_path / "b.png") is not None


def test_report_shows_the_update_and_lstm_health_each_slots_contribution_and_the_reward_flags(tmp_path):
    """Issue 47: ``update_health.png`` (gradient norm, explained variance, advantages), ``lstm_health.png``
    (the ``lstm_*`` keys), ``contribution.png`` (each slot's measured contribution over the epochs and the
    updates) and ``reward_flags.png`` with a line counting the flagged env-steps; the anomalies are
    counted by kind. A log without these keys (an older run) draws none of them."""
    _write_run(tmp_path, n_updates=2)
    assert main([str(tmp_path)]) == 0
    for name in ("lstm_health", "contribution", "reward_flags"):
        assert not (tmp_path / "plots" / f"{name}.png").exists(), name

    run_dir = tmp_path / "new"
    run_dir.mkdir()
    _write_run(run_dir, n_updates=2)
    with EventLog(run_dir / "events.jsonl", append=True) as log:
        for u in (1, 2):
            log.write("ppo_update", update=u, grad_norm=0.5, explained_variance=0.2, adv_mean=-0.1,
                      adv_std=1.5, adv_max_abs=4.0, adv_pos_frac=0.4, lstm_h_norm_mean=0.6,
                      lstm_h_norm_max=0.9, lstm_c_norm_mean=1.2, lstm_c_norm_max=2.0,
                      lstm_h_saturated_frac=0.01, lstm_c_saturated_frac=0.02, lstm_too_small_frac=0.0,
                      lstm_too_large_frac=0.0)  # fmt: skip
            for ep in range(1, 4):
                log.write("epoch", update=u, epoch=ep, val_acc=[50.0, 51.0], slot_names=["b0", "b1"],
                          contribution=[[None, None], [2.0 * ep, None]] if ep > 1 else [[None, None]] * 2,
                          hacking=[False, ep == 3], ransomware=[False, False])  # fmt: skip
            for env in range(2):
                log.write("episode", update=u, env=env, **{"return": 1.0}, final_test_acc=60.0,
                          reward_flags={"hacking": env, "ransomware": 0})  # fmt: skip
        log.write("anomaly", update=2, kind="reward_hacking", value=0.5, threshold=0.25, detail="x")
    assert main([str(run_dir)]) == 0
    for name in ("update_health", "lstm_health", "contribution", "reward_flags"):
        assert _is_png(run_dir / "plots" / f"{name}.png"), name
    md = (run_dir / "report.md").read_text()
    assert "reward flags (env-steps whose reward raised them): hacking 2 of" in md
    assert "(most in update 1: 1)" in md and "ransomware 0 of" in md
    assert "by kind: kl_spike 1, reward_hacking 1" in md

    from esper.shell.telemetry.events import RunEvents, read_events
    from esper.shell.telemetry.plots import contributions

    names, per_slot = contributions(RunEvents(read_events(run_dir / "events.jsonl")))
    assert names == ["b0", "b1"] and set(per_slot) == {0}  # b1 never held a seed
    assert per_slot[0][(2, 3)] == [6.0]
