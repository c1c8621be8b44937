"""Compile cost: the first inductor compile of ``ppo_loss`` (factored) and of ``gae``, cold (inductor's
and AOTAutograd's caches disabled), and the recompile count over minibatches of constant shape.

Compile times are one measurement each (a compile is not repeatable without resetting everything);
the recompile count reads ``torch._dynamo.utils.counters["stats"]["unique_graphs"]``: every compiled
graph after the first call is a recompile.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
from tensordict import TensorDict
from torch._dynamo.utils import counters

import esper.core as core
from bench.harness import Context, Row, Stats, SuiteResult, Target, suite
from bench.perf.gae import GAMMA, LMBDA, rollout, rollout_td
from bench.perf.loss import SPEC, Policy, factored_rollout, factored_step
from esper.core.spec import HEADS


@contextmanager
def cold():
    """No FX-graph / AOTAutograd / autotune caches: what a first-ever compile on this machine costs."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        yield
    torch._dynamo.reset()


def _seconds(ctx: Context, fn) -> float:
    ctx.sync()
    start = time.perf_counter()
    fn()
    ctx.sync()
    return time.perf_counter() - start


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def _row(case: str, impl: str, seconds: float, note: str = "") -> Row:
    ms = seconds * 1e3
    return Row(case, impl, Stats(ms, ms, ms, 1, 1), note=note)


def _loss_leaves(E: int, T: int, device: torch.device):
    """The factored loss input with current logits/value as leaves (the loss alone, no network)."""
    policy = Policy(SPEC.sizes).to(device)
    td = factored_rollout(policy, E, T, device)
    logits, value = policy(td["observation"])
    current = TensorDict(
        {h: TensorDict({"logits": logits[h].detach().requires_grad_()}, [E, T]) for h in HEADS}, [E, T]
    )
    current["state_value"] = value.detach().requires_grad_()
    td["current"] = current
    return td


@suite(
    "compile",
    help="first inductor compile of ppo_loss and gae (cold), recompiles across minibatches",
    order=30,
)
def run(ctx: Context) -> SuiteResult:
    res = SuiteResult(ratio_label="-")
    if ctx.quick:
        res.notes.append("--quick: cold compile times skipped (about a minute on 2 cores); recompiles only.")
    else:
        _loss_compile(ctx, res)
        for E, T in [(256, 25), (4096, 128)]:
            _gae_compile(ctx, res, E, T)
    _step_recompiles(ctx, res)
    _gae_recompiles(ctx, res)
    res.notes.append("rows here are single measurements (median = p10 = p90): a compile happens once.")
    return res


def _loss_compile(ctx: Context, res: SuiteResult) -> None:
    """ppo_loss, factored, logits leaves: the forward compiles at the first call, the backward at the
    first backward."""
    td = _loss_leaves(16, 25, ctx.device)
    with cold():
        compiled = torch.compile(lambda td: core.total_loss(core.ppo_loss(td, factored=True)), fullgraph=True)
        out = []
        t_fwd = _seconds(ctx, lambda: out.append(compiled(td)))
        t_bwd = _seconds(ctx, lambda: out[0].backward())
    case = "ppo_loss factored 16x25"
    res.rows.append(_row(case, "first compile: forward", t_fwd, "fullgraph=True, inductor, cold"))
    res.rows.append(_row(case, "first compile: backward", t_bwd, "compiled at the first backward"))
    total = t_fwd + t_bwd
    res.targets.append(Target("ppo_loss (factored) first compile fwd+bwd, s", total, "< 60", total < 60))


def _gae_compile(ctx: Context, res: SuiteResult, E: int, T: int) -> None:
    """gae(td): compile time grows with T (the static time loop is unrolled)."""
    args = rollout(E, T, ctx.device)
    impls = {"core.gae(td)": (lambda td: core.gae(td, gamma=GAMMA, lmbda=LMBDA), (rollout_td(*args),))}
    for name, (fn, fn_args) in impls.items():
        with cold():
            compiled = torch.compile(fn, fullgraph=True)
            t = _seconds(ctx, lambda compiled=compiled, fn_args=fn_args: compiled(*fn_args))
        res.rows.append(_row(f"gae {E}x{T}", f"first compile: {name}", t, "fullgraph=True, inductor, cold"))
        if name == "core.gae(td)":
            res.targets.append(Target(f"gae(td) {E}x{T} first compile, s", t, "< 60", t < 60))


def _step_recompiles(ctx: Context, res: SuiteResult) -> None:
    """One compiled trainer step (network + factored loss + backward) over env-minibatches of constant
    shape, two epochs: graphs compiled after the first call are recompiles."""
    torch._dynamo.reset()
    policy = Policy(SPEC.sizes).to(ctx.device)
    data = factored_rollout(policy, 16 if ctx.quick else 64, 25, ctx.device, seed=1)
    n_envs, n_mb = data.batch_size[0], 4
    step = torch.compile(lambda b: factored_step(policy, b), fullgraph=True)
    before, first, calls = _graphs(), None, 0
    g = torch.Generator().manual_seed(0)
    for _epoch in range(2):
        for idx in core.env_minibatches(n_envs, n_mb, generator=g):
            for p in policy.parameters():
                p.grad = None
            step(data[idx.to(ctx.device)]).backward()
            calls += 1
            first = _graphs() if first is None else first
    recompiles = _graphs() - first
    res.rows.append(
        Row(
            f"trainer step {n_envs // n_mb}x25",
            f"recompiles over {calls - 1} more minibatches",
            note=f"{first - before} graph(s) at the first call, {recompiles} after",
        )
    )
    res.targets.append(
        Target("recompiles after the first minibatch (ppo step)", recompiles, "== 0", recompiles == 0)
    )


def _gae_recompiles(ctx: Context, res: SuiteResult) -> None:
    torch._dynamo.reset()
    fn = torch.compile(lambda td: core.gae(td, gamma=GAMMA, lmbda=LMBDA), fullgraph=True)
    first = None
    for seed in range(4):
        fn(rollout_td(*rollout(64, 25, ctx.device, seed=seed)))
        first = _graphs() if first is None else first
    recompiles = _graphs() - first
    res.rows.append(Row("gae 64x25", "recompiles over 3 more rollouts", note=f"{recompiles} after the first"))
    res.targets.append(
        Target("recompiles after the first rollout (gae)", recompiles, "== 0", recompiles == 0)
    )
