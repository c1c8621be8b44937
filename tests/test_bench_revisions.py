"""bench.revisions' event fingerprint: two runs of the same computation at two revisions compare equal
whatever their times; a changed number, a missing event or an extra one is found and named."""

from __future__ import annotations

from bench.revisions import fingerprint, first_difference


def _events(val_acc: float = 61.5, t0: float = 0.0) -> list[dict]:
    return [
        {"event": "run_start", "t": t0, "config": {}, "provenance": {"git_rev": str(t0)}},
        {"event": "epoch", "t": t0 + 1, "update": 0, "val_acc": [val_acc, 40.0], "timings": {"host": t0}},
        {"event": "timings", "t": t0 + 2, "update": 0, "host_training": 3.0 + t0},
        {"event": "checkpoint", "t": t0 + 3, "path": f"/tmp/{t0}", "update": 0},
        {"event": "ppo_update", "t": t0 + 4, "update": 0, "kl_approx": 0.01, "seconds": 9.0 + t0},
        {"event": "run_end", "t": t0 + 5, "interrupted": False},
    ]


def test_the_same_computation_at_other_times_has_the_same_fingerprint():
    a, b = fingerprint(_events()), fingerprint(_events(t0=100.0))
    assert [e["event"] for e in a] == ["epoch", "ppo_update"]
    assert all("t" not in e and "timings" not in e and "seconds" not in e for e in a)
    assert first_difference(a, b) is None


def test_a_changed_number_or_a_missing_event_is_named():
    a = fingerprint(_events())
    changed = fingerprint(_events(val_acc=61.50001))
    assert first_difference(a, changed) == "event 0 (epoch, update 0): val_acc differ"
    assert first_difference(a, a[:1]) == "2 events against 1"
