"""decouple: the re-based log-probs and the truncated behaviour weight of decoupled PPO, checked step by
step in plain Python against the stored behaviour log-probs and the proximal logits."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from esper.core import distributions as D
from esper.core.loss import decouple, ppo_loss
from esper.core.masks import head_relevance
from esper.core.spec import HEAD_INDEX, HEADS
from tests.core.test_loss import factored_batch


def test_decouple_rebases_each_head_on_the_proximal_policy_and_weights_by_the_joint_ratio():
    td = factored_batch(3, 6, seed=21, grad=False)
    out = decouple(td, factored=True, rho_max=10.0)
    rel = head_relevance(td["op", "action"].long())
    for e in range(3):
        for t in range(6):
            log_w = 0.0
            for h in HEADS:
                logits = td["current", h, "logits"][e, t]
                mask = td[h, "action_mask"][e, t]
                action = td[h, "action"][e, t]
                lp = torch.log_softmax(logits.masked_fill(~mask, -math.inf), -1)[action].item()
                assert out[h, "action_log_prob"][e, t].item() == pytest.approx(lp, abs=1e-6)
                if rel[e, t, HEAD_INDEX[h]] and mask.sum() > 1:
                    log_w += lp - td[h, "action_log_prob"][e, t].item()
            assert out["behaviour_weight"][e, t].item() == pytest.approx(min(10.0, math.exp(log_w)), rel=1e-5)


def test_decouple_truncates_the_weight_at_rho_max():
    td = factored_batch(4, 8, seed=22, grad=False)
    free = decouple(td, factored=True, rho_max=1e6)["behaviour_weight"]
    capped = decouple(td, factored=True)["behaviour_weight"]
    assert bool((free > 1).any()) and bool((free < 1).any())  # the fixture moves both ways
    torch.testing.assert_close(capped, free.clamp(max=1.0))


def test_decouple_on_data_the_proximal_policy_collected_is_the_identity():
    td = factored_batch(3, 5, seed=23, grad=False)
    for h in HEADS:  # the stored log-probs are the current logits' own
        logits = td["current", h, "logits"]
        td[h, "action_log_prob"] = D.log_prob(logits, td[h, "action"], td[h, "action_mask"])
    out = decouple(td, factored=True)
    torch.testing.assert_close(out["behaviour_weight"], torch.ones(3, 5))
    for h in HEADS:
        torch.testing.assert_close(out[h, "action_log_prob"], td[h, "action_log_prob"])


def test_decoupled_loss_is_the_weighted_clipped_surrogate_around_the_proximal_policy():
    """ppo_loss on decouple's output = w * min(r A, clip(r) A) with r = pi / pi_prox (one head)."""
    g = torch.Generator().manual_seed(5)
    n, B = 4, 64
    behaviour, prox = torch.randn(B, n, generator=g), torch.randn(B, n, generator=g)
    current = (prox + 0.5 * torch.randn(B, n, generator=g)).requires_grad_(True)
    action = torch.randint(0, n, (B,), generator=g)
    adv = torch.randn(B, generator=g)
    stored = {"action": action, "action_log_prob": D.log_prob(behaviour, action), "advantage": adv}
    td = TensorDict(stored, [B])
    td["current"] = TensorDict({"logits": prox}, [B])
    re = decouple(td)
    td.update(re)
    td["advantage"] = adv * re["behaviour_weight"]
    td["current"] = TensorDict({"logits": current}, [B])
    loss = ppo_loss(td, clip_epsilon=0.2, entropy_coef=0.0)["loss_objective"]
    lp, lp_prox, lp_b = D.log_prob(current, action), D.log_prob(prox, action), D.log_prob(behaviour, action)
    w = (lp_prox - lp_b).exp().clamp(max=1.0)
    r = (lp - lp_prox).exp()
    ref = -(w * torch.minimum(r * adv, r.clamp(0.8, 1.2) * adv)).mean()
    torch.testing.assert_close(loss, ref)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_decouple_refuses_a_bad_rho_max(bad):
    with pytest.raises(ValueError, match="rho_max"):
        decouple(factored_batch(2, 3, grad=False), factored=True, rho_max=bad)


def test_decouple_names_itself_and_the_missing_key():
    td = factored_batch(2, 3, grad=False)
    del td["blueprint", "action_log_prob"]
    with pytest.raises(KeyError, match=r"decouple: .*blueprint.*action_log_prob"):
        decouple(td, factored=True)
    td = factored_batch(2, 3, grad=False)
    td["current", "slot", "logits"] = td["current", "slot", "logits"][..., :1].expand(2, 3, 1).clone()
    with pytest.raises(ValueError, match="decouple: "):
        decouple(td, factored=True)
