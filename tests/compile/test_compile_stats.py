"""Running statistics and health stats under torch.compile: fullgraph traces, compiled == eager
(finding C6 for grad_health)."""

from __future__ import annotations

import operator
from collections import Counter

import pytest
import torch

from esper.core.health import GradHealthConfig, grad_health, lstm_health, seed_grad_health
from esper.core.normalize import normalize, running_stats, scale, update_running_stats
from tests.core.test_health import assert_matches_ref, random_grads, ref_grad_health


@pytest.mark.parametrize("momentum", [None, 0.9])
@pytest.mark.parametrize("masked", [True, False])
def test_update_running_stats_compiles_fullgraph(compile_check, momentum, masked):
    stats = update_running_stats(running_stats((3,)), torch.randn(10, 3))
    x = torch.randn(4, 5, 3)
    valid = torch.rand(4, 5) < 0.5 if masked else None
    fn = lambda stats, x, valid: update_running_stats(stats, x, valid=valid, momentum=momentum)
    compile_check(fn, stats, x, valid, rtol=1e-12, atol=1e-12)


def test_update_from_empty_stats_compiles_fullgraph(compile_check):
    compile_check(update_running_stats, running_stats((2, 2), dtype=torch.float32), torch.randn(6, 2, 2))


def test_normalize_and_scale_compile_fullgraph(compile_check):
    stats = update_running_stats(running_stats((4,)), torch.randn(30, 4) * 3 + 1)
    x = torch.randn(8, 4) * 3
    compile_check(lambda s, x: normalize(s, x, clip=2.0), stats, x)
    compile_check(lambda s, x: scale(s, x, clip=None), stats, x)


def test_C6_grad_health_compiles_fullgraph_with_nan_inf(compile_check):
    cfg = GradHealthConfig.for_clipped_ppo(0.5)
    grads = random_grads(3)
    groups = [0, 1, 1, 0, 2, 1]
    fn = lambda *g: grad_health(g, groups=groups, n_groups=3, cfg=cfg)
    out = compile_check(fn, *grads)
    assert out["nan_count"] == 2 and out["inf_count"] == 2 and not out["finite"]
    assert_matches_ref(out, ref_grad_health(grads, groups, 3, cfg))


def test_C6_grad_health_of_real_grads_compiles_fullgraph(compile_check):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    net(torch.randn(5, 6)).square().sum().backward()
    grads = [p.grad for p in net.parameters()]
    fn = lambda *g: grad_health(g, groups=[0, 0, 1, 1], n_groups=2, cfg=GradHealthConfig())
    out = compile_check(fn, *grads)
    assert out["finite"] and out["param_norms"].shape == (4,)
    torch.testing.assert_close(out["global_norm"], torch.nn.utils.get_total_norm(grads))


#: Ops that only view a tensor (no arithmetic, no copy): one per gradient is how the list is joined.
VIEWS = frozenset({"reshape", "view"})


def _captured_ops(n_tensors: int) -> Counter:
    """The calls in the graph dynamo captures for grad_health over ``n_tensors`` gradients (list
    element reads and views excluded), with scalar outputs captured as graph nodes rather than
    breaks."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    grads = [torch.randn(3, 2 + i % 3) for i in range(n_tensors)]
    grads[0][0, 0] = float("nan")
    groups = [i % 2 for i in range(n_tensors)]
    fn = lambda *g: grad_health(g, groups=groups, n_groups=2, cfg=GradHealthConfig())
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        torch.compile(fn, backend=backend, fullgraph=True)(*grads)
    assert len(graphs) == 1
    calls = [n for n in graphs[0].graph.nodes if n.op in ("call_function", "call_method")]
    return Counter(str(n.target) for n in calls if n.target is not operator.getitem and n.target not in VIEWS)


def test_C6_grad_health_graph_has_no_scalar_read_and_does_not_grow_with_the_tensors():
    """Vectorized means: no ``.item()`` (captured as ``item`` / ``_local_scalar_dense``) and the same
    ops for 3 gradients as for 24, apart from the one view per gradient that joins them. A per-tensor
    loop (issue 10: it survived the fullgraph test when it used no ``.item()``), or a norm per tensor
    (issue 47's first draft of public norms), unrolls into arithmetic per tensor."""
    small, large = _captured_ops(3), _captured_ops(24)
    scalar_reads = [k for k in large if "item" in k or "_local_scalar_dense" in k]
    assert not scalar_reads
    grown = {k: (small[k], large[k]) for k in small.keys() | large.keys() if small[k] != large[k]}
    assert not grown, grown


def test_lstm_health_compiles_fullgraph(compile_check):
    h, c = torch.randn(2, 4, 8), torch.randn(2, 4, 8) * 40
    c[0, 1, 2] = float("nan")
    out = compile_check(lambda h, c: lstm_health(h, c, low=0.5, high=100.0, saturation=0.9), h, c)
    assert out["c_saturated_frac"] > 0 and out["nonfinite"] == 1


def test_batch_stats_and_their_merge_compile_fullgraph(compile_check):
    from esper.core.normalize import batch_stats, merge_running_stats

    x = torch.randn(7, 3) * 2 + 1
    compile_check(lambda x: batch_stats(x, 1), x)
    prior = update_running_stats(running_stats((3,)), torch.randn(20, 3))
    compile_check(lambda p, x: merge_running_stats(p, batch_stats(x, 1)), prior, x)
    compile_check(lambda p, x: merge_running_stats(p, batch_stats(x, 1), momentum=0.9), prior, x)


def test_seed_grad_health_compiles_fullgraph(compile_check):
    g = torch.Generator().manual_seed(0)
    norm = torch.rand(4, 3, generator=g)
    norm[0, 1], norm[2, 2] = float("nan"), float("inf")
    vanishing, exploding = torch.rand(4, 3, generator=g), torch.rand(4, 3, generator=g)
    vanishing[1, 0] = float("nan")
    live = torch.rand(4, 3, generator=g) < 0.6
    compile_check(seed_grad_health, norm, vanishing, exploding, live)


def test_learner_rules_on_group_norms_compile_fullgraph(compile_check):
    """``group_clip_scale`` (``ppo.clip_per_group``) and ``adapt_value_coef`` (``ppo.value_coef_adapt``)."""
    from esper.core.health import adapt_value_coef, group_clip_scale

    norms = torch.tensor([0.1, 3.0, 0.0, 0.7, float("nan")])
    compile_check(lambda n: group_clip_scale(n, 0.5), norms)
    fn = lambda c, v, p: adapt_value_coef(c, v, p, target=0.3, rate=0.1, low=0.05, high=5.0)
    compile_check(fn, torch.tensor(0.5), torch.tensor(2.0), torch.tensor(0.4))
    compile_check(fn, torch.tensor(0.5), torch.tensor(0.0), torch.tensor(0.4))
