"""A whole training step as one compiled graph: forward, loss, backward, gradient clipping and the Adam
step (LeanRL-style, ``fullgraph=True``, no recompiles between calls).

``torch.compile`` stops a graph at three places a training step passes through: ``loss.backward()``,
``nn.LSTM`` and ``Optimizer.step()`` (which graph-breaks on purpose). This module holds what removes
the three, for any step function the caller writes:

- :func:`compile_step` compiles ``fn`` with ``fullgraph=True, dynamic=False`` and calls it under the
  dynamo settings that trace ``backward`` and ``nn.LSTM`` into the graph (``trace_autograd_ops``,
  ``allow_rnn``; set for these calls only);
- :func:`adam_step` is the optimizer's own Adam/AdamW update (its param groups' hyperparameters, its
  state tensors, so ``state_dict``/``load_state_dict`` and checkpoints are unchanged) through
  ``torch.optim``'s functional ``adam``, which dynamo traces; ``skip`` (a bool tensor) leaves
  parameters and state untouched where it is True, so a KL early stop is data, not a host sync.

Inside a compiled step: call ``loss.backward()``, clip, :func:`adam_step`, then set every ``.grad`` to
None (the next call starts like the first; a ``.grad`` that is a tensor at one call and None at the
next would recompile). Pass values that change between calls (an annealed coefficient) as tensors:
Python floats are baked into the graph and a new value recompiles it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.optim.adam import adam as _functional_adam


def compile_step(fn: Callable, *, backend: str | Callable = "inductor") -> Callable:
    """``fn`` compiled as one graph (``fullgraph=True, dynamic=False``), called with ``backward`` and
    ``nn.LSTM`` traced into it. A graph break raises; changed input shapes recompile."""
    compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend)

    def call(*args, **kwargs):
        with torch._dynamo.config.patch(trace_autograd_ops=True, allow_rnn=True):
            return compiled(*args, **kwargs)

    call.compiled = compiled  # the raw handle (tests count its graphs)
    return call


def init_adam_state(optimizer: torch.optim.Adam) -> None:
    """Create the optimizer's per-parameter state now, as its first ``step()`` would (zero moments,
    step 0), so a compiled step reads tensors that exist. A no-op for state that exists (a resumed
    optimizer). Raises for other optimizers than ``torch.optim.Adam``/``AdamW``."""
    _check_adam(optimizer)
    for group in optimizer.param_groups:
        on_device = group["capturable"] or group["fused"]
        for p in group["params"]:
            state = optimizer.state[p]
            if state:
                continue
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu")
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def adam_step(
    optimizer: torch.optim.Adam, *, skip: torch.Tensor | None = None, scale: torch.Tensor | None = None
) -> None:
    """One Adam/AdamW step of ``optimizer`` over the parameters that have a ``.grad``, traceable into
    the caller's graph. Same update as ``optimizer.step()`` (foreach arithmetic; equal up to float
    rounding). ``skip``: bool ``[]``; where True, parameters, moments and step counts keep their values.
    ``scale``: float ``[]``; the parameters move ``scale`` times as far, which is the step at
    ``scale x lr`` (Adam's and AdamW's parameter change is linear in the learning rate, decoupled
    weight decay included): an annealed learning rate as a tensor, so a new value never recompiles.
    Call :func:`init_adam_state` once before the first compiled call."""
    with torch.no_grad():
        for group in optimizer.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [optimizer.state[p] for p in params]
            moments = {
                k: [s[k] for s in states]
                for k in ("exp_avg", "exp_avg_sq", "step", *(("max_exp_avg_sq",) if group["amsgrad"] else ()))
            }
            touched = [*params, *(t for ts in moments.values() for t in ts)]
            before = [t.clone() for t in touched] if skip is not None else None
            start = [p.clone() for p in params] if scale is not None else None
            beta1, beta2 = group["betas"]
            _functional_adam(
                params,
                [p.grad for p in params],
                moments["exp_avg"],
                moments["exp_avg_sq"],
                moments.get("max_exp_avg_sq", []),
                moments["step"],
                foreach=True,
                # traced: step counts stay tensors in the graph; eager: the optimizer's own setting
                capturable=torch.compiler.is_compiling() or group["capturable"],
                decoupled_weight_decay=group["decoupled_weight_decay"],
                amsgrad=group["amsgrad"],
                beta1=beta1,
                beta2=beta2,
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=group["maximize"],
            )
            if start is not None:
                for p, old in zip(params, start):
                    p.copy_(old + scale * (p - old))
            if before is not None:
                for t, old in zip(touched, before):
                    t.copy_(torch.where(skip, old, t))


def _check_adam(optimizer: torch.optim.Optimizer) -> None:
    if not isinstance(optimizer, torch.optim.Adam):
        raise TypeError(
            f"adam_step drives torch.optim.Adam or AdamW, got {type(optimizer).__name__}; "
            "step other optimizers outside the compiled graph"
        )
    for group in optimizer.param_groups:
        if group["differentiable"] or torch.is_tensor(group["lr"]):
            raise ValueError("adam_step: differentiable optimizers and tensor learning rates are unsupported")


__all__ = ["adam_step", "compile_step", "init_adam_state"]
