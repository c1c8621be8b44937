"""The run-directory lock and the stop signals (issue 10, items 3 and 6)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from esper.shell.common.rundir import LOCK_FILE, RunDirBusy, RunDirLock, StopSignals, Terminated


def test_a_run_directory_has_one_holder_at_a_time(tmp_path):
    with RunDirLock(tmp_path):
        with pytest.raises(RunDirBusy, match=rf"in use by another esper process \(pid {os.getpid()}\)"):
            RunDirLock(tmp_path).acquire()
    with RunDirLock(tmp_path):  # released on exit
        pass
    assert (tmp_path / LOCK_FILE).is_file()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    """The lock is an flock: the operating system drops it when the holder dies, kill -9 included."""
    code = (
        "import sys, time; from esper.shell.common.rundir import RunDirLock; "
        f"RunDirLock({str(tmp_path)!r}).acquire(); print('locked', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirBusy, match=f"pid {holder.pid}"):
            RunDirLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with RunDirLock(tmp_path):
        pass


def test_sigterm_is_handled_like_ctrl_c():
    # whatever handlers were installed (a shell started in the background ignores SIGINT) come back
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with StopSignals():
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_signal_during_a_checkpoint_write_waits_for_the_write():
    done = []
    with StopSignals() as signals:
        with pytest.raises(Terminated):
            with signals.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
                done.append("written")  # not cut short
        with pytest.raises(ValueError):  # an error in the block wins; the signal is dropped
            with signals.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                raise ValueError("disk full")
    assert done == ["written"]


def test_a_stopping_run_can_drop_a_second_signal():
    with StopSignals() as signals:
        with signals.deferred(drop=True):
            with signals.deferred():  # the checkpoint write inside the stop
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
        time.sleep(0.05)  # nothing raised: the second Ctrl-C was dropped
