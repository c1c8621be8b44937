"""Masked categorical: against a plain-Python reference, NaN-free in every dtype, never samples an
illegal choice."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from esper.core import distributions as D


def _ref_row(logits: list[float], mask: list[bool]) -> tuple[list[float], float]:
    """Reference: log-probs over legal choices, and entropy / log(#legal)."""
    legal = [i for i, m in enumerate(mask) if m]
    top = max(logits[i] for i in legal)
    z = sum(math.exp(logits[i] - top) for i in legal)
    lp = [logits[i] - top - math.log(z) if mask[i] else -math.inf for i in range(len(logits))]
    ent = -sum(math.exp(lp[i]) * lp[i] for i in legal)
    return lp, (ent / math.log(len(legal)) if len(legal) > 1 else 0.0)


@st.composite
def masked_rows(draw, max_n: int = 7):
    rows = draw(st.integers(1, 5))
    n = draw(st.integers(1, max_n))
    logits = draw(
        st.lists(
            st.lists(st.floats(-30, 30, allow_nan=False, width=32), min_size=n, max_size=n),
            min_size=rows,
            max_size=rows,
        )
    )
    mask = draw(st.lists(st.lists(st.booleans(), min_size=n, max_size=n), min_size=rows, max_size=rows))
    for row in mask:  # at least one legal choice per row
        if not any(row):
            row[draw(st.integers(0, n - 1))] = True
    return torch.tensor(logits), torch.tensor(mask)


@given(masked_rows())
def test_log_prob_and_entropy_match_reference(data):
    logits, mask = data
    lsm = D.log_softmax(logits, mask)
    ent = D.normalized_entropy(logits, mask)
    for r in range(logits.shape[0]):
        ref_lp, ref_ent = _ref_row(logits[r].tolist(), mask[r].tolist())
        for i, m in enumerate(mask[r].tolist()):
            if m:
                assert lsm[r, i].item() == pytest.approx(ref_lp[i], abs=1e-4)
        assert ent[r].item() == pytest.approx(ref_ent, abs=1e-4)
        assert 0.0 <= ent[r].item() <= 1.0 + 1e-6


@given(masked_rows())
def test_sample_never_picks_an_illegal_choice(data):
    logits, mask = data
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        a = D.sample(logits, mask, generator=g)
        assert mask.gather(-1, a.unsqueeze(-1)).all()
    a = D.sample(logits, mask, deterministic=True)
    assert mask.gather(-1, a.unsqueeze(-1)).all()
    masked = torch.where(mask, logits, -torch.inf)
    torch.testing.assert_close(masked.gather(-1, a.unsqueeze(-1)).squeeze(-1), masked.amax(-1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("extreme", ["min", "-max/2", "-1e4"])
def test_sample_never_picks_an_illegal_choice_when_legal_logits_are_extreme(dtype, extreme):
    """Legal logits at (or near) the dtype's most negative finite value tie with the masked ones
    after the log-softmax: only the final mask keeps the draw legal (issue 10: removing it survived)."""
    info = torch.finfo(dtype)
    value = {"min": info.min, "-max/2": -info.max / 2, "-1e4": -1e4}[extreme]
    logits = torch.full((500, 5), value, dtype=dtype)
    mask = torch.zeros(500, 5, dtype=torch.bool)
    mask[:, 3] = True
    mask[::2, 1] = True
    g = torch.Generator().manual_seed(0)
    for deterministic in (False, True):
        a = D.sample(logits, mask, generator=g, deterministic=deterministic)
        assert mask.gather(-1, a.unsqueeze(-1)).all(), deterministic


def test_sample_never_picks_an_illegal_choice_when_a_race_value_is_extreme(monkeypatch):
    """An exponential race value of exactly 0 (or one that underflows) gives ``-log race = +inf``;
    on a masked choice that must not win."""
    logits = torch.zeros(4, 3)
    mask = torch.tensor([[True, False, True]] * 4)

    def zero_race_on_the_masked_choice(self, *args, **kwargs):
        self.fill_(1.0)
        self[:, 1] = 0.0
        return self

    monkeypatch.setattr(torch.Tensor, "exponential_", zero_race_on_the_masked_choice)
    a = D.sample(logits, mask, generator=torch.Generator().manual_seed(0))
    assert mask.gather(-1, a.unsqueeze(-1)).all()


def test_sample_follows_the_masked_distribution():
    logits = torch.tensor([0.0, 1.0, 2.0, 5.0])
    mask = torch.tensor([True, True, True, False])
    g = torch.Generator().manual_seed(1)
    draws = D.sample(logits.expand(40_000, 4), mask.expand(40_000, 4), generator=g)
    freq = torch.bincount(draws, minlength=4).double() / draws.numel()
    expected = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), -1).double()
    assert freq[3] == 0
    torch.testing.assert_close(freq[:3], expected, atol=0.01, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_entropy_and_log_prob_finite_in_every_dtype(dtype):
    logits = (torch.randn(64, 6) * 20).to(dtype)
    mask = torch.rand(64, 6) > 0.5
    mask[:, 0] = True
    mask[:8] = False
    mask[:8, 2] = True  # rows with exactly one legal choice
    ent = D.normalized_entropy(logits, mask)
    lp = D.log_prob(logits, torch.zeros(64, dtype=torch.long), mask)
    assert torch.isfinite(ent).all() and torch.isfinite(lp).all()
    assert (ent[:8] == 0).all(), "a head with one legal choice has zero normalized entropy"
    assert ent.dtype == D.compute_dtype(dtype)


def test_entropy_gradient_is_finite_with_masked_choices():
    logits = torch.randn(5, 4, requires_grad=True)
    mask = torch.tensor([[True, False, False, False]] + [[True, True, False, True]] * 4)
    D.normalized_entropy(logits, mask).sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert (logits.grad[:, 2] == 0).all(), "illegal choices get no gradient"


def test_uniform_is_one_and_one_hot_is_zero():
    assert D.normalized_entropy(torch.zeros(3, 5)).allclose(torch.ones(3))
    peaked = torch.tensor([[100.0, 0.0, 0.0]])
    assert D.normalized_entropy(peaked).item() == pytest.approx(0.0, abs=1e-6)
    assert D.normalized_entropy(torch.zeros(2, 1)).eq(0).all()


def test_all_illegal_row_stays_finite():
    """An all-False row is a bug the shell reports before sampling; core math must not NaN on it."""
    logits = torch.randn(2, 4)
    mask = torch.zeros(2, 4, dtype=torch.bool)
    assert torch.isfinite(D.normalized_entropy(logits, mask)).all()
    assert torch.isfinite(D.log_softmax(logits, mask)).all()


@given(st.floats(-20, 5, allow_nan=False))
def test_k3_is_nonnegative_and_matches_formula(log_ratio):
    x = torch.tensor(log_ratio, dtype=torch.float64)
    k3 = D.k3_kl(x).item()
    assert k3 >= 0.0
    assert k3 == pytest.approx(math.exp(log_ratio) - 1 - log_ratio, rel=1e-9, abs=1e-12)


def test_masked_categorical_is_the_three_functions():
    logits = torch.randn(3, 7, 5)
    mask = torch.rand(3, 7, 5) > 0.3
    mask[..., 1] = True
    action = D.sample(logits, mask, generator=torch.Generator().manual_seed(3))
    old = torch.randn(3, 7)
    lp, ent, kl = D.masked_categorical(logits, action, mask, old)
    torch.testing.assert_close(lp, D.log_prob(logits, action, mask))
    torch.testing.assert_close(ent, D.normalized_entropy(logits, mask))
    torch.testing.assert_close(kl, D.k3_kl(lp - old))


@given(masked_rows())
def test_normalized_entropy_times_legal_log_count_is_the_entropy_in_nats(data):
    logits, mask = data
    for m in (mask, None):
        nats = D.normalized_entropy(logits, m) * D.legal_log_count(m, logits.shape[-1], logits)
        for row in range(logits.shape[0]):
            legal_mask = [True] * logits.shape[-1] if m is None else m[row].tolist()
            lp, _ = _ref_row(logits[row].tolist(), legal_mask)
            ref = -sum(math.exp(x) * x for x in lp if x > -math.inf)
            assert float(nats[row]) == pytest.approx(ref, abs=1e-4)


def test_sample_with_given_race_draws_equals_the_generator_path_and_compiles(compile_check):
    """``sample(race=)``: the Exp(1) draws passed in give the choice the generator would have drawn."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 6, generator=g)
    mask = torch.rand(5, 6, generator=g) > 0.3
    mask[:, 0] = True
    race = torch.empty(5, 6).exponential_(generator=torch.Generator().manual_seed(9))
    drawn = D.sample(logits, mask, generator=torch.Generator().manual_seed(9))
    assert torch.equal(D.sample(logits, mask, race=race), drawn)
    assert mask.gather(-1, drawn.unsqueeze(-1)).all()
    compile_check(lambda lg, m, r: D.sample(lg, m, race=r), logits, mask, race)
    with pytest.raises(ValueError, match="race must have the logits' shape"):
        D.sample(logits, mask, race=race[:, :3])
