"""GAE over [envs x T]: TorchRL's two functional GAEs against Esper's, eager, compiled and fused.

Data: float32 rewards/values, episodes ending mid-sequence (2% terminated + 2% truncated per step) so
TorchRL's vectorized path splits trajectories for real. Shapes [E, T] for Esper, [E, T, 1] for TorchRL
(its convention); the same memory.

Rows (per case): TorchRL ``vec_generalized_advantage_estimate`` and ``generalized_advantage_estimate``
(the loop), eager; TorchRL's loop compiled as its PPO script does (extra); Esper's core eager and
compiled with ``torch.compile(fullgraph=True)`` (inductor) on ``gae_tensors`` (the tensor function, like
TorchRL's) and on ``gae(td)``; the fused Triton kernel where a GPU is present; the floor of any compiled
call on the same inputs (two elementwise ops, extra). Ratio: faster of
TorchRL's two eager functions over the row (>1: the row is faster).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torchrl.objectives.value.functional import (
    generalized_advantage_estimate,
    vec_generalized_advantage_estimate,
)

import esper.core as core
import esper.kernels as kernels
from bench.harness import Context, Row, SuiteResult, Target, suite

GAMMA, LMBDA = 0.99, 0.95
FULL = [(4, 25), (256, 25), (1024, 128), (4096, 128)]
QUICK = [(4, 25), (256, 25)]
TARGET_CASES = ("256x25", "4096x128")
TORCHRL = ("torchrl vec_generalized_advantage_estimate", "torchrl generalized_advantage_estimate (loop)")


def rollout(E: int, T: int, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r, v, nv = (torch.randn(E, T, generator=g) for _ in range(3))
    term = torch.rand(E, T, generator=g) < 0.02
    trunc = (torch.rand(E, T, generator=g) < 0.02) & ~term
    return tuple(x.to(device) for x in (r, v, nv, term | trunc, term))


def rollout_td(r, v, nv, done, term) -> TensorDict:
    """The same rollout as a TorchRL-style TensorDict (what ``esper.core.gae`` reads)."""
    nxt = {"reward": r, "done": done, "terminated": term, "state_value": nv}
    return TensorDict({"state_value": v, "next": nxt}, list(r.shape), device=r.device)


@suite("gae", help="GAE: TorchRL vec/loop vs esper eager/compiled/kernel at [envs x T]", order=10)
def run(ctx: Context) -> SuiteResult:
    res = SuiteResult(ratio_label="x vs faster TorchRL")
    for E, T in QUICK if ctx.quick else FULL:
        torch._dynamo.reset()
        _case(ctx, res, E, T)
    res.notes.append(
        "compiled rows: torch.compile(fullgraph=True, dynamic=False), inductor; the note gives the first "
        "call's time (trace + compile, with the FX/inductor caches as found)."
    )
    return res


def _case(ctx: Context, res: SuiteResult, E: int, T: int) -> None:
    case = f"{E}x{T}"
    esper_args = rollout(E, T, ctx.device)
    r, v, nv, done, term = esper_args
    torchrl_args = tuple(x.unsqueeze(-1) for x in (v, nv, r, done, term))  # [E, T, 1], TorchRL's order
    td = rollout_td(*esper_args)
    fns = {
        TORCHRL[0]: lambda: vec_generalized_advantage_estimate(GAMMA, LMBDA, *torchrl_args),
        TORCHRL[1]: lambda: generalized_advantage_estimate(GAMMA, LMBDA, *torchrl_args),
        "esper eager core.gae_tensors": lambda: core.gae_tensors(*esper_args, gamma=GAMMA, lmbda=LMBDA),
    }
    compiled = {
        "esper compiled core.gae_tensors": (
            lambda *a: core.gae_tensors(*a, gamma=GAMMA, lmbda=LMBDA),
            esper_args,
        ),
        "esper compiled core.gae(td)": (lambda td: core.gae(td, gamma=GAMMA, lmbda=LMBDA), (td,)),
    }
    if not ctx.quick:
        compiled["torchrl loop compiled (extra)"] = (
            lambda *a: generalized_advantage_estimate(GAMMA, LMBDA, *a),
            torchrl_args,
        )
        # What any compiled call costs here: the same five inputs, two outputs, two elementwise ops.
        compiled["compiled call floor (extra)"] = (lambda r, v, nv, d, t: (r + v, nv * 2.0), esper_args)
    notes: dict[str, str] = {}
    for name, (fn, args) in compiled.items():
        cfn = torch.compile(fn, fullgraph=True, dynamic=False)
        call = lambda cfn=cfn, args=args: cfn(*args)
        try:
            notes[name] = f"first call (compile) {ctx.time_once(call):.1f} s"
        except Exception as exc:  # record, never hide
            res.rows.append(Row(case, name, note=f"compile failed: {type(exc).__name__}: {exc}"[:200]))
            continue
        fns[name] = call
    kernel = "esper kernel (Triton esper::gae)"
    on_gpu = ctx.device.type == "cuda" and kernels.HAS_TRITON
    if on_gpu:
        fns[kernel] = lambda: kernels.gae_tensors(*esper_args, gamma=GAMMA, lmbda=LMBDA)
    stats = ctx.compare(fns)
    base = min(stats[k].median_ms for k in TORCHRL)
    for name, s in stats.items():
        res.rows.append(Row(case, name, s, base / s.median_ms, notes.get(name, "")))
    if not on_gpu:
        res.rows.append(Row(case, kernel, note="no GPU"))
    if "compiled call floor (extra)" in stats and case in TARGET_CASES:
        floor = stats["compiled call floor (extra)"].median_ms
        res.notes.append(
            f"{case}: a compiled call costs at least {floor:.3f} ms here (the floor row), so the best a "
            f"compiled GAE can show against the faster TorchRL GAE is {base / floor:.1f}x"
        )
    if case in TARGET_CASES:
        for label, name in (("esper compiled", "esper compiled core.gae_tensors"),):
            if name in stats:
                ratio = base / stats[name].median_ms
                res.targets.append(Target(f"{case} faster TorchRL / {label}", ratio, ">= 5", ratio >= 5))
