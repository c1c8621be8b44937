"""``python -m esper.shell.run`` under faults, called in-process (issue 10): one-line errors, a
``--resume`` validated before anything is written, the run-directory lock, checkpoints only at update
boundaries (Ctrl-C, SIGTERM), a non-finite run stopped with its last checkpoint intact, a full disk,
and a log that matches its checkpoint after a crash."""

from __future__ import annotations

import errno
import os
import signal

import pytest
import torch

import esper.shell.run as run_mod
import esper.shell.runtime.training as training_mod
from esper.shell.agent.trainer import PPOTrainer
from esper.shell.common import checkpoint as ckpt_mod
from esper.shell.common.checkpoint import load_checkpoint, save_checkpoint
from esper.shell.common.rundir import RunDirLock
from esper.shell.telemetry.events import discarded_path, read_events

pytestmark = pytest.mark.e2e

PROG = "python -m esper.shell.run"
TINY = ["--preset", "smoke", "--lifecycle.max_epochs", "2", "--env.train_batches", "1",
        "--env.val_batches", "1", "--threads", "1"]  # fmt: skip
RUN_FILES = ("config.json", "provenance.json", "events.jsonl", "checkpoint.pt")


@pytest.fixture(autouse=True)
def _keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def cli(capsys, *args: str) -> tuple[int, str]:
    """Exit status and stderr of ``main(args)`` (a usage error's SystemExit included)."""
    try:
        status = run_mod.main([str(a) for a in args])
    except SystemExit as e:
        status = e.code
    return status, capsys.readouterr().err


def error_line(err: str) -> str:
    """The one error line of ``err``; fails on a traceback or a second error line."""
    assert "Traceback" not in err, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith(f"{PROG}: error:")]
    assert len(errors) == 1, err[-2000:]
    return errors[0]


def snapshot(run_dir) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in RUN_FILES if (run_dir / name).exists()}


@pytest.fixture
def done_run(tmp_path, capsys):
    """A finished two-update run ``tmp_path/r``."""
    status, err = cli(capsys, *TINY, "--updates", "2", "--run_dir", tmp_path, "--name", "r")
    assert status == 0, err[-3000:]
    return tmp_path / "r"


# --------------------------------------------------------------------------- item 8: one line, no usage
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ppo.lrr", "1"], "unrecognized arguments: --ppo.lrr"),
        (["--ppo.lr", "inf"], "ppo.lr must be finite"),
        (["--env.device", "bogus"], "env.device: 'bogus' is not a device"),
        (["--config", "/nonexistent.json"], "--config /nonexistent.json: No such file or directory"),
        (["--name", "x" * 300], "name must be at most 100 characters"),
        (["--name", "../../x"], "no path separators or '..'"),
        (["--run_dir", "/dev/null/x"], "cannot create the run directory /dev/null/x"),
        (["--resume", "/nonexistent/run"], "not found"),
    ],
)
def test_every_refusal_is_one_line_with_a_hint_to_help(tmp_path, capsys, args, message):
    where = [] if "--run_dir" in args or "--resume" in args else ["--run_dir", tmp_path]
    status, err = cli(capsys, *TINY, *where, *args)
    assert status == 2
    line = error_line(err)
    assert message in line and line.endswith(f"(see {PROG} --help)")
    assert len(err.strip().splitlines()) == 1, "no usage text, no other output"
    assert not any(tmp_path.iterdir()), "nothing was written"
    assert not (tmp_path.parent / "x").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_cpu_only_machine_is_one_line(tmp_path, capsys):
    status, err = cli(capsys, *TINY, "--env.device", "cuda", "--run_dir", tmp_path)
    assert status == 2 and "CUDA is not available on this machine" in error_line(err)
    assert not any(tmp_path.iterdir())


def test_bad_inputs_are_one_line(tmp_path, capsys):
    short = tmp_path / "stories.txt"
    short.write_text("Once upon a time.")
    status, err = cli(capsys, "--preset", "tinystories", "--env.device", "cpu", "--env.data_path", short,
                      "--run_dir", tmp_path / "runs")  # fmt: skip
    assert status == 2 and "tinystories: the text is too short for windows of ctx 256" in error_line(err)
    assert not (tmp_path / "runs").exists(), "refused before the run directory was made"
    bad_json = tmp_path / "c.json"
    bad_json.write_text("{nope")
    status, err = cli(capsys, *TINY, "--config", bad_json, "--run_dir", tmp_path / "runs")
    assert status == 2 and "is not JSON" in error_line(err)


def test_a_read_only_run_dir_is_one_line(tmp_path, capsys, monkeypatch):
    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(run_mod.Path, "mkdir", read_only)
    status, err = cli(capsys, *TINY, "--run_dir", tmp_path, "--name", "r")
    assert status == 2 and "cannot create the run directory" in error_line(err)
    assert "Read-only file system" in error_line(err)


# ------------------------------------------------------------------------ item 2: resume checks first
def test_a_refused_resume_touches_no_file(done_run, capsys):
    before = snapshot(done_run)
    for args, message in [
        (["--ppo.hidden", "32"], "ppo.hidden 16 -> 32"),
        (["--ppo.policy", "flat"], "ppo.policy 'set' -> 'flat'"),
        (["--env.task", "digits"], "env.task 'mnist1d' -> 'digits'"),
        (["--updates", "1"], "--updates 1 is fewer than the 2 update(s) this run has done"),
        (["--ppo.lr", "-1"], "ppo.lr must be > 0"),
    ]:
        status, err = cli(capsys, "--resume", done_run, *args)
        assert status == 2 and message in error_line(err), err
        assert snapshot(done_run) == before, args
    more = ["--updates", "3", "--ppo.lr", "1e-4", "--eval_episodes", "2"]
    status, err = cli(capsys, "--resume", done_run, *more)
    assert status == 0, err[-3000:]  # the optimizer's hyperparameters (and the end-of-run check) may change
    assert load_checkpoint(done_run / "checkpoint.pt")["progress"]["update"] == 3
    (check,) = read_events(done_run / "events.jsonl", "heldout_check")
    assert check["controller"] == "ppo" and "greedy_test_acc" in check  # both readouts of the controller
    lo, hi = check["greedy_gain_ci95"]
    paired = check["greedy_test_acc"] - check["static_test_acc"]  # paired over the same hosts
    assert lo <= check["greedy_gain"] <= hi and paired == pytest.approx(check["greedy_gain"], abs=1e-4)


def test_damaged_or_foreign_checkpoints_are_refused_in_one_line(done_run, capsys):
    path = done_run / "checkpoint.pt"
    good = path.read_bytes()
    flipped = bytearray(good)
    for i in range(len(good) // 3, len(good), len(good) // 401):  # ~270 bytes flipped
        flipped[i] ^= 0x5A
    payload = load_checkpoint(path)
    no_agent = {k: v for k, v in payload.items() if k != "agent"}
    cases = [(bytes(flipped), "is damaged"), (good[: len(good) // 2], "is damaged"), (b"junk", "not a torch")]
    for data, message in cases:
        path.write_bytes(data)
        before = snapshot(done_run)
        status, err = cli(capsys, "--resume", done_run, "--updates", "3")
        assert status == 2 and message in error_line(err)
        assert snapshot(done_run) == before
    save_checkpoint(path, no_agent)
    status, err = cli(capsys, "--resume", done_run, "--updates", "3")
    assert status == 2 and "has no 'agent' entry" in error_line(err)
    from esper.shell.evaluate import main as evaluate_main

    assert evaluate_main([str(done_run), "--episodes", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "has no 'agent' entry" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------- item 3: lock
def test_a_second_process_on_the_same_run_directory_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    with RunDirLock(run_dir):  # what a running run holds
        status, err = cli(capsys, *TINY, "--run_dir", tmp_path, "--name", "r")
        assert status == 2 and "is in use by another esper process" in error_line(err)
        status, err = cli(capsys, "--resume", run_dir)
        assert status == 2 and "is in use by another esper process" in error_line(err)
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"], "neither wrote anything"


# -------------------------------------------------------------------------- item 1: non-finite runs
def test_a_run_that_cannot_continue_stops_in_one_line_and_resumes_with_saner_options(tmp_path, capsys):
    args = ["--updates", "5", "--ppo.lr", "1e20", "--run_dir", tmp_path, "--name", "r"]
    status, err = cli(capsys, *TINY, *args)
    assert status == 3
    line = error_line(err)
    assert "rolled back" in line and "is intact: resume with --resume" in line and "--ppo.lr" in line
    run_dir = tmp_path / "r"
    ckpt = load_checkpoint(run_dir / "checkpoint.pt")  # loads: finite by construction
    done = ckpt["progress"]["update"]
    assert done == 2  # ppo.max_bad_updates = 3: updates 1 and 2 rolled back, the 3rd stopped the run
    assert all(torch.isfinite(v).all() for v in ckpt["agent"]["policy"].values())
    updates = read_events(run_dir / "events.jsonl", "ppo_update")
    assert [u["rolled_back"] for u in updates] == [True] * 3
    assert len(read_events(run_dir / "events.jsonl", "anomaly")) >= 3
    status, err = cli(capsys, "--resume", run_dir, "--ppo.lr", "1e-3", "--updates", "4")
    assert status == 0, err[-3000:]
    updates = read_events(run_dir / "events.jsonl", "ppo_update")
    assert [u["rolled_back"] for u in updates] == [True, True, False, False]
    assert [u["update"] for u in updates] == [1, 2, 3, 4], "update 3's first try was moved aside"


def test_a_nonfinite_rollout_stops_the_run_with_the_last_checkpoint_intact(tmp_path, capsys, monkeypatch):
    real = PPOTrainer.update

    def poisoned(self, batch, **kw):
        if self.state.updates == 1:
            batch["next", "raw_reward"][0, 0] = float("nan")
        return real(self, batch, **kw)

    monkeypatch.setattr(PPOTrainer, "update", poisoned)
    status, err = cli(capsys, *TINY, "--updates", "3", "--run_dir", tmp_path, "--name", "r")
    assert status == 3
    assert "non-finite values in the rollout" in error_line(err) and "checkpoint of update 1" in err
    assert load_checkpoint(tmp_path / "r" / "checkpoint.pt")["progress"]["update"] == 1


# ---------------------------------------------------------------------------- item 8: a full disk
def test_a_full_disk_stops_in_one_line_and_the_previous_checkpoint_survives(tmp_path, capsys, monkeypatch):
    real, writes = ckpt_mod._write_all, []

    def fills_up(f, data):
        writes.append(len(data))
        if len(writes) > 2:  # the first checkpoint (header + body) fits, the second does not
            f.write(bytes(data)[:100])
            raise OSError(errno.ENOSPC, "No space left on device")
        real(f, data)

    monkeypatch.setattr(ckpt_mod, "_write_all", fills_up)
    status, err = cli(capsys, *TINY, "--updates", "3", "--run_dir", tmp_path, "--name", "r")
    assert status == 3
    line = error_line(err)
    assert "No space left on device" in line and "the checkpoint of update 1" in line
    assert load_checkpoint(tmp_path / "r" / "checkpoint.pt")["progress"]["update"] == 1
    assert [p.name for p in (tmp_path / "r").glob(".checkpoint.pt.*")] == []


# -------------------------------------------------- item 6: checkpoints at update boundaries, the log
def _final_policy(run_dir) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "checkpoint.pt")["agent"]["policy"]


def test_ctrl_c_mid_update_saves_the_last_boundary_and_resume_reproduces(tmp_path, capsys, monkeypatch):
    """Issue 10: Ctrl-C during the PPO update saved a half-done update (optimizer 121 steps,
    statistics of two updates, progress 1) and Ctrl-C + resume was not reproducible."""
    status, err = cli(capsys, *TINY, "--updates", "2", "--run_dir", tmp_path, "--name", "straight")
    assert status == 0, err[-3000:]
    real_step, calls = torch.optim.AdamW.step, []

    def interrupted_step(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # update 1 takes 4 steps (2 epochs x 2 minibatches); this is update 2's 2nd
            raise KeyboardInterrupt
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", interrupted_step)
    status, err = cli(capsys, *TINY, "--updates", "2", "--run_dir", tmp_path, "--name", "cut")
    assert status == 130 and "interrupted" in err and "checkpoint of update 1" in err
    monkeypatch.setattr(torch.optim.AdamW, "step", real_step)
    saved = load_checkpoint(tmp_path / "cut" / "checkpoint.pt")
    assert saved["progress"]["update"] == 1 and saved["learner"]["updates"] == 1
    assert {int(s["step"]) for s in saved["learner"]["optimizer"]["state"].values()} == {4}
    first = read_events(tmp_path / "straight" / "events.jsonl", "ppo_update")[0]
    assert first["minibatch_steps"] == 4
    status, err = cli(capsys, "--resume", tmp_path / "cut")
    assert status == 0, err[-3000:]
    for k, v in _final_policy(tmp_path / "straight").items():
        assert torch.equal(v, _final_policy(tmp_path / "cut")[k]), k


def test_sigterm_is_handled_like_ctrl_c(tmp_path, capsys, monkeypatch):
    real_run, calls = training_mod.EpisodeRunner.run, []

    def terminated_in_rollout(self, update, **kwargs):
        calls.append(update)
        if update == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler sends, mid-rollout
        return real_run(self, update, **kwargs)

    monkeypatch.setattr(training_mod.EpisodeRunner, "run", terminated_in_rollout)
    status, err = cli(capsys, *TINY, "--updates", "3", "--run_dir", tmp_path, "--name", "r")
    assert status == 143 and "SIGTERM" in err and calls == [0, 1]
    assert load_checkpoint(tmp_path / "r" / "checkpoint.pt")["progress"]["update"] == 1
    end = read_events(tmp_path / "r" / "events.jsonl", "run_end")[-1]
    assert end["interrupted"] is True and end["status"] == 143


def test_a_crash_between_logging_and_checkpoint_counts_no_episode_twice(tmp_path, capsys, monkeypatch):
    real_save = training_mod.TrainingRun.save

    def crash_at_update_2(self, payload):
        if payload["progress"]["update"] == 2:
            raise RuntimeError("the process died here")  # a hard crash: nothing of the run handles it
        return real_save(self, payload)

    monkeypatch.setattr(training_mod.TrainingRun, "save", crash_at_update_2)
    with pytest.raises(RuntimeError, match="died"):
        run_mod.main([*TINY, "--updates", "3", "--run_dir", str(tmp_path), "--name", "r"])
    monkeypatch.setattr(training_mod.TrainingRun, "save", real_save)
    log = tmp_path / "r" / "events.jsonl"
    with open(log, "a") as f:
        f.write('{"event":"epoch","update":2,"va')  # and the last line was torn
    with pytest.warns(UserWarning, match="torn"):
        assert {e["update"] for e in read_events(log, "episode")} == {1, 2}
    status, err = cli(capsys, "--resume", tmp_path / "r")
    assert status == 0, err[-3000:]
    assert "moved to" in err
    episodes = read_events(log, "episode")
    assert sorted((e["update"], e["env"]) for e in episodes) == [(u, i) for u in (1, 2, 3) for i in (0, 1)]
    assert [u["update"] for u in read_events(log, "ppo_update")] == [1, 2, 3]
    rewound = read_events(log, "log_rewound")
    assert len(rewound) == 1 and rewound[0]["discarded"] >= 3
    assert len(discarded_path(log).read_text().splitlines()) == rewound[0]["discarded"]
    from esper.shell.telemetry.report import write_report

    md = write_report(tmp_path / "r").read_text()
    assert "3 PPO updates, 6 episodes" in md


def test_ctrl_c_before_training_began_is_one_line_too(tmp_path, capsys, monkeypatch):
    def slow_data(self, *args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C while the data loads

    monkeypatch.setattr(training_mod.TrainingRun, "__init__", slow_data)
    status, err = cli(capsys, *TINY, "--run_dir", tmp_path, "--name", "r")
    assert status == 130 and "interrupted before training began" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()
