"""The core's pieces of data-parallel training, checked by splitting one batch into parts as processes
would hold it: merged statistics, loss terms and gradients, and advantage statistics of the parts
equal the whole's."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from esper.core.advantage import normalize_advantage
from esper.core.loss import loss_counts, ppo_loss, total_loss
from esper.core.normalize import batch_stats, merge_running_stats, running_stats, update_running_stats
from esper.core.spec import HEADS
from tests.core.test_loss import factored_batch


@pytest.mark.parametrize("momentum", [None, 0.9])
def test_merged_statistics_of_the_parts_equal_the_whole_batch(momentum):
    g = torch.Generator().manual_seed(0)
    prior = update_running_stats(running_stats((3,)), 5 + 2 * torch.randn(40, 3, generator=g))
    x = torch.randn(6, 7, 3, generator=g) * 3 + 1
    whole = update_running_stats(prior, x, momentum=momentum)
    parts = [batch_stats(p, 1) for p in x.split([1, 3, 2])]
    merged = parts[0]
    for p in parts[1:]:
        merged = merge_running_stats(merged, p)
    got = merge_running_stats(prior, merged, momentum=momentum)
    for k in ("mean", "var", "count"):
        torch.testing.assert_close(got[k], whole[k], rtol=1e-12, atol=1e-12)
    empty = batch_stats(x[:0], 1)  # a part with no sample changes nothing
    assert empty["count"] == 0
    torch.testing.assert_close(merge_running_stats(prior, empty)["mean"], prior["mean"])


def _split_loss(td: TensorDict, parts: list[slice]) -> list[TensorDict]:
    """The loss of each part, each with the counts summed over all parts (as processes do)."""
    counts = [loss_counts(td[p], factored=True) for p in parts]
    summed = counts[0]
    for c in counts[1:]:
        summed = summed + c
    return [ppo_loss(td[p], factored=True, counts=summed) for p in parts]


def test_loss_terms_and_gradients_of_the_parts_sum_to_the_whole():
    td = factored_batch(E=5, T=4, seed=3)
    whole = ppo_loss(td, factored=True)
    params = [v for v in td["current"].values(True, True) if v.requires_grad]
    g_whole = torch.autograd.grad(total_loss(whole), params)
    own = ppo_loss(td, factored=True, counts=loss_counts(td, factored=True))
    for k in ("loss_objective", "loss_critic", "loss_entropy", "kl_approx", "explained_variance", "ESS"):
        torch.testing.assert_close(own[k], whole[k])  # a batch's own counts change nothing
    parts = _split_loss(td, [slice(0, 2), slice(2, 5)])
    total = sum(total_loss(p) for p in parts)
    g_parts = torch.autograd.grad(total, params)
    for a, b in zip(g_parts, g_whole):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for k in ("loss_objective", "loss_critic", "loss_entropy", "entropy", "kl_approx", "clip_fraction",
              "value_clip_fraction", "mean_ratio"):  # fmt: skip
        torch.testing.assert_close(sum(p[k] for p in parts), whole[k], rtol=1e-5, atol=1e-6, msg=k)
    for h in ("op", "blueprint"):
        torch.testing.assert_close(sum(p[h, "kl"] for p in parts), whole[h, "kl"], rtol=1e-5, atol=1e-6)


def test_advantage_statistics_over_the_parts_equal_the_whole():
    g = torch.Generator().manual_seed(1)
    adv = torch.randn(6, 5, 1, generator=g) * 4 + 2
    whole = normalize_advantage(adv)
    parts = adv.split([2, 4])
    # what a sum over processes returns to each: first [count, sum], then the squared deviations
    n_sum = sum(torch.stack([p.numel() * torch.ones(()), p.sum()]) for p in parts)
    mean = n_sum[1] / n_sum[0]
    ssd = sum(((p - mean) ** 2).sum() for p in parts)
    answers = iter([n_sum, ssd] * len(parts))
    out = [normalize_advantage(p, reduce=lambda t: next(answers).to(t.dtype)) for p in parts]
    torch.testing.assert_close(torch.cat(out), whole, rtol=1e-5, atol=1e-6)


def test_P4_entropy_floor_of_the_parts_sums_to_the_whole():
    """With an entropy floor, each process judges the hinge on the whole minibatch's entropy (summed
    by ``loss_counts(entropy=True)``): the parts' floor terms and gradients sum to the whole's, although
    each part alone may sit on the other side of the floor."""
    td = factored_batch(E=5, T=4, seed=4)
    plain = ppo_loss(td, factored=True)
    floors = {h: float(plain[h, "entropy"]) + (0.05 if i % 2 else -0.05) for i, h in enumerate(HEADS)}
    floors = {h: min(max(f, 0.0), 1.0) for h, f in floors.items()}
    whole = ppo_loss(td, factored=True, entropy_floor=floors, entropy_floor_coef=0.7)
    params = [v for v in td["current"].values(True, True) if v.requires_grad]
    g_whole = torch.autograd.grad(total_loss(whole), params)
    parts = [slice(0, 2), slice(2, 5)]
    counts = [loss_counts(td[p], factored=True, entropy=True) for p in parts]
    summed = counts[0] + counts[1]
    outs = [ppo_loss(td[p], factored=True, counts=summed, entropy_floor=floors, entropy_floor_coef=0.7)
            for p in parts]  # fmt: skip
    torch.testing.assert_close(sum(o["loss_entropy_floor"] for o in outs), whole["loss_entropy_floor"])
    assert float(whole["loss_entropy_floor"]) > 0
    g_parts = torch.autograd.grad(sum(total_loss(o) for o in outs), params)
    for a, b in zip(g_parts, g_whole):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(KeyError, match="loss_counts\\(entropy=True\\)"):
        ppo_loss(td[:2], factored=True, counts=loss_counts(td, factored=True), entropy_floor=0.5)
