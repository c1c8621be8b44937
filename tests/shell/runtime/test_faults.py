"""The fault suite of :mod:`bench.faults`, once each (issue 10): ``kill -9`` at a random moment and in
the middle of a checkpoint write, SIGTERM followed by a torn log line, damaged and mismatched
checkpoints, two runs of the same name at once. Each must be survived with nothing lost against an
uninterrupted run of the same config (the same final policy bit for bit, every episode logged once,
a clean log and report); ``python -m bench.faults --trials N`` runs many random kill points. The
diverging-run scenario runs in-process in ``test_run_safety.py``.

A random kill point that fails is a real bug: the message names the seed; ``ESPER_FAULT_SEED=<seed>``
replays it."""

from __future__ import annotations

import os
import random

import pytest

from bench import faults

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return faults.reference(tmp_path_factory.mktemp("reference"))


def _check(outcome: faults.Outcome, note: str = "") -> None:
    assert outcome.survived, f"{outcome.fault}: {outcome.detail} {note}"
    assert not outcome.lost, f"{outcome.fault}: lost {outcome.lost} ({outcome.detail}) {note}"


def test_kill9_at_a_random_moment(ref, tmp_path):
    seed = int(os.environ.get("ESPER_FAULT_SEED", random.SystemRandom().randrange(2**32)))
    _check(faults.kill9_random(tmp_path, ref, random.Random(seed)), f"[ESPER_FAULT_SEED={seed}]")


def test_kill9_in_the_middle_of_a_checkpoint_write(ref, tmp_path):
    _check(faults.kill9_mid_save(tmp_path, ref))


def test_sigterm_then_a_torn_log_line(ref, tmp_path):
    _check(faults.sigterm_then_torn_log(tmp_path, ref))


def test_damaged_and_mismatched_checkpoints_are_refused_and_change_nothing(ref, tmp_path):
    outcomes = faults.damaged_checkpoints(tmp_path, ref, random.Random(0))
    assert len(outcomes) == 6
    for outcome in outcomes:
        _check(outcome)


def test_two_runs_of_the_same_name_at_once(ref, tmp_path):
    _check(faults.concurrent_runs(tmp_path, ref))
