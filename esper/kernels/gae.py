"""Fused GAE: one Triton kernel for the reverse scan over time, parallel over envs.

Same contract and semantics as :func:`esper.core.advantage.gae_tensors` (time last, ``done`` cuts the
trace, ``terminated`` masks the bootstrap, math in float32 or float64), registered as the custom op
``esper::gae`` so ``torch.compile(fullgraph=True)`` traces through it (its fake impl gives shapes and
dtypes) and treats it as one opaque kernel.

Dispatch: CUDA tensors with Triton installed run the kernel; CPU tensors run the core reference
(``register_kernel("cpu")``). The op has no autograd: the wrappers send inputs that need a gradient to
the (differentiable) core, which is also what every non-CUDA tensor gets, so compiled CPU code keeps
inductor's fusion of the core.
"""

from __future__ import annotations

import importlib.util

import torch
from tensordict import TensorDictBase

from esper.core import advantage as core
from esper.core.spec import KEYS, Keys

HAS_TRITON = importlib.util.find_spec("triton") is not None
#: Test hook: run the Triton kernel on CPU tensors too (under ``TRITON_INTERPRET=1``).
TRITON_ON_CPU = False

_WHERE = "esper.kernels.gae"


@torch.library.custom_op("esper::gae", mutates_args=())
def gae_op(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    lmbda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantage, value_target)``; see :func:`gae_tensors`. Triton on GPU, core elsewhere."""
    if not HAS_TRITON or reward.device.type != "cuda":
        return core.gae_tensors(reward, value, next_value, done, terminated, gamma=gamma, lmbda=lmbda)
    return _gae_triton(reward, value, next_value, done, terminated, gamma, lmbda)


@gae_op.register_kernel("cpu")
def _gae_cpu(reward, value, next_value, done, terminated, gamma, lmbda):
    if TRITON_ON_CPU:
        return _gae_triton(reward, value, next_value, done, terminated, gamma, lmbda)
    return core.gae_tensors(reward, value, next_value, done, terminated, gamma=gamma, lmbda=lmbda)


@gae_op.register_fake
def _gae_fake(reward, value, next_value, done, terminated, gamma, lmbda):
    _check(reward, value, next_value, done, terminated, gamma, lmbda)
    dtype = core.gae_out_dtype(reward, value, next_value)  # contiguous, like both real impls
    return reward.new_empty(reward.shape, dtype=dtype), reward.new_empty(reward.shape, dtype=dtype)


def _gae_triton(reward, value, next_value, done, terminated, gamma, lmbda):
    from esper.kernels import _triton

    _check(reward, value, next_value, done, terminated, gamma, lmbda)
    dtype = core.gae_out_dtype(reward, value, next_value)
    advantage = torch.empty(reward.shape, dtype=dtype, device=reward.device)
    value_target = torch.empty_like(advantage)
    _triton.gae(reward, value, next_value, done, terminated, advantage, value_target, gamma, lmbda)
    return advantage, value_target


def _check(reward, value, next_value, done, terminated, gamma, lmbda) -> None:
    core.check_gae_tensors(
        reward, value, next_value, done, terminated, gamma=gamma, lmbda=lmbda, where=_WHERE
    )


def _use_op(*xs: torch.Tensor) -> bool:
    """The op (kernel) path: a Triton device, and no input needs a gradient (the kernel has none)."""
    on_kernel_device = HAS_TRITON and (xs[0].device.type == "cuda" or TRITON_ON_CPU)
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in xs)
    return on_kernel_device and not needs_grad


def gae_tensors(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    *,
    gamma: float,
    lmbda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for :func:`esper.core.gae_tensors` (same arguments, results and errors): the fused
    kernel on CUDA, the core elsewhere or when an input requires grad."""
    if not _use_op(reward, value, next_value):
        return core.gae_tensors(reward, value, next_value, done, terminated, gamma=gamma, lmbda=lmbda)
    _check(reward, value, next_value, done, terminated, gamma, lmbda)
    return gae_op(reward, value, next_value, done, terminated, float(gamma), float(lmbda))


def gae(td: TensorDictBase, *, gamma: float, lmbda: float, keys: Keys = KEYS) -> TensorDictBase:
    """Drop-in for :func:`esper.core.gae` (same keys, shapes and errors; writes ``keys.advantage`` and
    ``keys.value_target`` into ``td`` and returns it), computed by :func:`gae_tensors`.

    Keys are read and written by the core's own :func:`esper.core.advantage.gae_inputs` and
    :func:`~esper.core.advantage.write_gae_outputs`; off the kernel device the call is the core's.
    """
    reward = td.get(keys.reward, None) if td.batch_dims >= 1 else None
    on_kernel_device = (
        HAS_TRITON and isinstance(reward, torch.Tensor) and (reward.device.type == "cuda" or TRITON_ON_CPU)
    )
    if not on_kernel_device:
        return core.gae(td, gamma=gamma, lmbda=lmbda, keys=keys)  # the core's path and errors
    core.check_gae_coefs(gamma, lmbda)
    advantage, value_target = gae_tensors(*core.gae_inputs(td, keys=keys), gamma=gamma, lmbda=lmbda)
    return core.write_gae_outputs(td, advantage, value_target, keys=keys)


__all__ = ["HAS_TRITON", "gae", "gae_op", "gae_tensors"]
