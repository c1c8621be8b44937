"""bench.anomaly_replay: a finished run's log re-judged by today's detector."""

import json

from bench.anomaly_replay import main, replay, shares_from_lifecycle
from esper.core.spec import HEADS


def _update(u: int, tempo_entropy: float, **over) -> dict:
    ent, weight = dict.fromkeys(HEADS, 0.6), dict.fromkeys(HEADS, 0.9)
    ent["tempo"], weight["tempo"] = tempo_entropy, 0.117
    return {"event": "ppo_update", "update": u, "head_entropy": ent, "head_weight": weight,
            "max_ratio": 1.3, "min_ratio": 0.7, "kl_approx": 0.01, "grad_norm": 1.0,
            "explained_variance": 0.5, **over}  # fmt: skip


def _germinated(u: int, tempo: str) -> dict:
    return {"event": "lifecycle", "update": u, "kind": "germinated", "style": "LINEAR_ADD", "tempo": tempo,
            "alpha_target": 1.0}  # fmt: skip


def _write(path, events) -> None:
    path.mkdir()
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_an_old_log_is_re_judged_with_choices_counted_from_its_lifecycle_events(tmp_path, capsys):
    start = {"event": "run_start", "config": {"updates": 4, "ppo": {"blend_bias": 3.0, "entropy_coef": 0.03},
                                              "anomaly": {"entropy_collapse": 0.1}}}  # fmt: skip
    logged = {"event": "anomaly", "update": 2, "kind": "entropy_collapse"}
    # a log from before head_choice_share: tempo collapsed at update 2 onto FAST, the prior's choice
    _write(tmp_path / "prior", [start, _update(1, 0.3), _germinated(2, "FAST"), _germinated(2, "FAST"),
                                _update(2, 0.002, entropy_coef=0.03), logged])  # fmt: skip
    # the same collapse onto SLOW, and a drop of the ESS with a large ratio: both alarms
    _write(tmp_path / "other", [start, _update(1, 0.3), _germinated(2, "SLOW"),
                                _update(2, 0.002, entropy_coef=0.03, max_ratio=9.0, ESS=0.2)])  # fmt: skip
    prior = replay(tmp_path / "prior")
    assert prior.logged == {"entropy_collapse": 1} and not prior.alarms
    assert prior.notes == {"prior_commitment": 1}
    other = replay(tmp_path / "other")
    assert other.alarms == {"entropy_collapse": 1, "ratio_explosion": 1} and not other.notes
    shares = shares_from_lifecycle([_germinated(3, "FAST"), _germinated(3, "SLOW")])
    assert shares[3]["tempo"] == [0.5, 0, 0.5]
    out = tmp_path / "t.md"
    assert main([str(tmp_path / "prior"), str(tmp_path / "other"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.read_text() == text and "| all 2 runs | 1 (1 runs) | 2 (1 runs) | 1 (1 runs) |" in text
