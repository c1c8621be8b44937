"""GAE and advantage normalization under torch.compile: fullgraph traces, compiled == eager; one
inductor-compiled numerical check (finding R1)."""

from __future__ import annotations

import pytest
import torch

from esper.core.advantage import gae, gae_tensors, group_relative, normalize_advantage
from tests.core.test_advantage import make_td, ref_gae, rollout


@pytest.mark.parametrize(
    ("batch", "T"), [((), 7), ((4,), 25), ((2, 3), 5), ((3,), 1), ((3,), 2), ((5,), 32), ((2,), 127)]
)
def test_R1_gae_tensors_compiles_fullgraph(compile_check, batch, T):
    """The traced (blocked) scan equals the eager (in-place) one, ragged T (127: padded) included."""
    r, v, nv, term, trunc = rollout(batch, T, seed=11)
    fn = lambda r, v, nv, d, term: gae_tensors(r, v, nv, d, term, gamma=0.99, lmbda=0.95)
    compile_check(fn, r, v, nv, term | trunc, term)


def test_gae_tensors_float64_compiles_fullgraph(compile_check):
    r, v, nv, term, trunc = rollout((3,), 9, seed=12, dtype=torch.float64)
    fn = lambda r, v, nv, d, term: gae_tensors(r, v, nv, d, term, gamma=0.9, lmbda=0.7)
    adv, _ = compile_check(fn, r, v, nv, term | trunc, term, rtol=1e-12, atol=1e-12)
    assert adv.dtype == torch.float64


@pytest.mark.parametrize("with_done", [True, False])
def test_gae_td_compiles_fullgraph(compile_check, with_done):
    td = make_td((3,), 12, seed=4)
    if not with_done:
        del td["next", "done"]
    compile_check(lambda td: gae(td, gamma=0.99, lmbda=0.95), td)


@pytest.mark.parametrize("masked", [True, False])
def test_normalize_advantage_compiles_fullgraph(compile_check, masked):
    adv = torch.randn(4, 10, 1)
    valid = torch.rand(4, 10) < 0.6 if masked else None
    compile_check(normalize_advantage, adv, valid)


@pytest.mark.inductor
def test_R1_gae_inductor_matches_reference():
    torch._dynamo.reset()
    r, v, nv, term, trunc = rollout((8,), 32, seed=21)
    fn = torch.compile(lambda *a: gae_tensors(*a, gamma=0.99, lmbda=0.95), fullgraph=True, backend="inductor")
    adv, tgt = fn(r, v, nv, term | trunc, term)
    ref_adv, ref_tgt = ref_gae(r, v, nv, term | trunc, term, 0.99, 0.95)
    torch.testing.assert_close(adv.double(), ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tgt.double(), ref_tgt, rtol=1e-5, atol=1e-5)
    eager = gae_tensors(r, v, nv, term | trunc, term, gamma=0.99, lmbda=0.95)
    torch.testing.assert_close(adv, eager[0], rtol=1e-5, atol=1e-5)


def _functional_graph_ops(fn, *args) -> list[str]:
    """The aten ops of ``fn``'s functionalized forward graph (what inductor receives)."""
    from torch._dynamo.backends.common import aot_autograd

    ops: list[str] = []

    def capture(gm, _inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=aot_autograd(fw_compiler=capture))(*args)
    return ops


def test_R1_compiled_gae_graph_has_no_whole_buffer_copy_per_step():
    """In-place row updates, functionalized, become one scatter of the whole [T, B] buffer per step
    (O(T^2) work); the traced path is a blocked scan: three stacks whatever T is, no transposes, and a
    graph that grows like sqrt(T) (16x the steps, about 4x the ops), not like T."""
    sizes = {}
    for T in (8, 32, 128):
        r, v, nv, term, trunc = rollout((4,), T, seed=5)
        ops = _functional_graph_ops(
            lambda *a: gae_tensors(*a, gamma=0.99, lmbda=0.95), r, v, nv, term | trunc, term
        )
        scatters = [op for op in ops if "scatter" in op or op.startswith("aten.copy")]
        assert scatters == [], scatters[:5]
        assert sum("stack" in op or "cat" in op for op in ops) == 3, ops
        assert not any("permute" in op or "transpose" in op for op in ops), ops
        sizes[T] = len(ops)
    assert sizes[128] < 5 * sizes[8], sizes


def test_normalize_advantage_with_a_reduction_compiles_fullgraph(compile_check):
    """``reduce=`` (a data-parallel sum in the shell; here doubling, as two equal parts would give)."""
    adv = torch.randn(4, 9)
    adv[1, 2] = float("nan")
    compile_check(lambda a: normalize_advantage(a, reduce=lambda t: 2 * t), adv)


@pytest.mark.parametrize("masked", [True, False])
def test_group_relative_compiles_fullgraph(compile_check, masked):
    adv = torch.randn(6, 10, 1)
    valid = torch.rand(6, 10) < 0.6 if masked else None
    compile_check(lambda a, v: group_relative(a, 3, v), adv, valid)
