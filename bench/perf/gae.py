"""GAE over [envs x T]: TorchRL's two functional GAEs against Esper's, eager, compiled and fused.

Data: float32 rewards/values, episodes ending mid-sequence (2% terminated + 2% truncated per step) so
TorchRL's vectorized path splits trajectories for real, in TorchRL's layout: a ``[E, T]`` TensorDict
whose per-step scalars are ``[E, T, 1]`` (what a collector hands over), read by ``esper.core.gae(td)``;
TorchRL's functions get the same ``[E, T, 1]`` tensors, ``gae_tensors`` their ``[E, T]`` views.

Rows (per case): TorchRL ``vec_generalized_advantage_estimate`` and ``generalized_advantage_estimate``
(the loop), eager; Esper's ``gae(td)`` eager, and compiled with ``torch.compile(fullgraph=True,
dynamic=False)`` (inductor) on ``gae(td)`` (the target) and on ``gae_tensors``; extras: ``gae(td)``
compiled with inductor's ``cpp_wrapper`` option (the call's wrapper in C++), TorchRL's loop compiled as
its PPO script does, and the floor of a compiled call (the same inputs, two elementwise ops) on tensors
and through the TensorDict; the fused Triton kernel where a GPU is present.

Timing: 15 interleaved rounds, each one block of calls per row (so the rows take turns with the caches,
as the steps of a real update do); ratio: the median over rounds of (faster TorchRL GAE / row), both
measured in the same round (>1: the row is faster).
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
from bench.harness import Context, Row, SuiteResult, Target, round_ratio, suite

GAMMA, LMBDA = 0.99, 0.95
FULL = [(4, 25), (256, 25), (1024, 128), (4096, 128)]
QUICK = [(4, 25), (256, 25)]
TARGET_CASES = ("256x25", "4096x128")
TORCHRL = ("torchrl vec_generalized_advantage_estimate", "torchrl generalized_advantage_estimate (loop)")
TARGET_ROW = "esper compiled core.gae(td)"
ROUNDS = 15


def rollout(E: int, T: int, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r, v, nv = (torch.randn(E, T, generator=g) for _ in range(3))
    term = torch.rand(E, T, generator=g) < 0.02
    trunc = (torch.rand(E, T, generator=g) < 0.02) & ~term
    return tuple(x.to(device) for x in (r, v, nv, term | trunc, term))


def rollout_td(r, v, nv, done, term, *, trailing_one: bool = False) -> TensorDict:
    """The same rollout as a TorchRL-style TensorDict (what ``esper.core.gae`` reads); with
    ``trailing_one`` the per-step scalars are ``[E, T, 1]`` views, as a TorchRL collector stores them."""
    shape = list(r.shape)
    r, v, nv, done, term = (x.unsqueeze(-1) if trailing_one else x for x in (r, v, nv, done, term))
    nxt = {"reward": r, "done": done, "terminated": term, "state_value": nv}
    return TensorDict({"state_value": v, "next": nxt}, shape, device=r.device)


def _td_floor(td: TensorDict) -> TensorDict:
    """What any compiled call through the TensorDict costs: gae's reads and writes, two elementwise ops."""
    r, v, nv, _, _ = core.advantage.gae_inputs(td)
    return core.advantage.write_gae_outputs(td, r + v, nv * 2.0)


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
    td = rollout_td(*esper_args, trailing_one=True)
    nxt = [("next", k) for k in ("state_value", "reward", "done", "terminated")]
    torchrl_args = tuple(td[k] for k in ("state_value", *nxt))  # [E, T, 1], TorchRL's order
    gae_td = lambda td: core.gae(td, gamma=GAMMA, lmbda=LMBDA)
    fns = {
        TORCHRL[0]: lambda: vec_generalized_advantage_estimate(GAMMA, LMBDA, *torchrl_args),
        TORCHRL[1]: lambda: generalized_advantage_estimate(GAMMA, LMBDA, *torchrl_args),
        "esper eager core.gae(td)": lambda: gae_td(td),
    }
    compiled = {  # name: (function, its arguments, compile options)
        TARGET_ROW: (gae_td, (td,), {}),
        "esper compiled core.gae_tensors": (
            lambda *a: core.gae_tensors(*a, gamma=GAMMA, lmbda=LMBDA),
            esper_args,
            {},
        ),
    }
    if not ctx.quick and ctx.device.type == "cpu":  # the extras explain CPU results; a GPU run skips them
        compiled["esper compiled core.gae(td), cpp_wrapper (extra)"] = (gae_td, (td,), {"cpp_wrapper": True})
        compiled["torchrl loop compiled (extra)"] = (
            lambda *a: generalized_advantage_estimate(GAMMA, LMBDA, *a),
            torchrl_args,
            {},
        )
        compiled["compiled call floor (extra)"] = (lambda r, v, nv, d, t: (r + v, nv * 2.0), esper_args, {})
        compiled["compiled call floor through the td (extra)"] = (_td_floor, (td,), {})
    notes: dict[str, str] = {}
    for name, (fn, args, options) in compiled.items():
        cfn = torch.compile(fn, fullgraph=True, dynamic=False, options=options or None)
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
        fns[kernel] = lambda: kernels.gae(td, gamma=GAMMA, lmbda=LMBDA)
    stats = ctx.compare(fns, rounds=ROUNDS)
    faster = min(TORCHRL, key=lambda k: stats[k].median_ms)
    for name, s in stats.items():
        res.rows.append(Row(case, name, s, round_ratio(stats[faster], s), notes.get(name, "")))
    if not on_gpu:
        res.rows.append(Row(case, kernel, note="no GPU"))
    if case in TARGET_CASES and "compiled call floor through the td (extra)" in stats:
        floor = stats["compiled call floor through the td (extra)"]
        res.notes.append(
            f"{case}: a compiled call through the TensorDict costs at least {floor.median_ms:.3f} ms here "
            f"(the floor row), so the best a compiled gae(td) can show against the faster TorchRL GAE is "
            f"{round_ratio(stats[faster], floor):.1f}x"
        )
    if case in TARGET_CASES and TARGET_ROW in stats:
        ratio = round_ratio(stats[faster], stats[TARGET_ROW])
        name = f"{case} faster TorchRL / esper compiled gae(td)"
        res.targets.append(Target(name, ratio, ">= 5", ratio >= 5))
