"""bench.suite.induction_screen: the recall sequences and one screened host of each placement."""

import pytest
import torch

from bench.suite.induction_screen import main, recall_data, run
from esper.core.spec import Stage


def test_recall_sequences_repeat_distinct_tokens_and_y_is_the_next_token():
    x, y = recall_data(50, seed=3, vocab=20, length=30, k_range=(4, 9))
    assert x.shape == y.shape == (50, 30) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row in x:
        k = next(k for k in range(4, 10) if torch.equal(row[k:], row[:-k]))
        assert len(set(row[:k].tolist())) == k  # a prefix of distinct tokens, repeated
    assert torch.equal(recall_data(5, seed=3)[0], recall_data(5, seed=3)[0])
    with pytest.raises(ValueError, match="k_range"):
        recall_data(5, seed=0, vocab=8, k_range=(4, 9))


@pytest.mark.parametrize("place", ["after", "embed"])
def test_a_screened_host_trains_and_reports_what_it_added(place):
    acc, added = run("attention", seed=0, steps=2, place=place, stage=Stage.BLENDING)
    assert 0 <= acc <= 100 and added > 0
    assert run("static", seed=0, steps=1, place=place)[1] == 0


def test_unknown_blueprints_are_refused():
    with pytest.raises(SystemExit):
        main(["1", "--blueprints", "attention,conv_heavy"])
