"""Minibatches for recurrent PPO (finding C3): shuffle *environments*, keep whole sequences.

A recurrent policy must replay each env's sequence from its stored initial hidden state, so a
minibatch is a set of envs with all their ``T`` steps, never a random set of steps. Index a
``[n_envs, T]`` rollout TensorDict with one row of :func:`env_minibatches` to get a ``[n_envs / M, T]``
minibatch.
"""

from __future__ import annotations

import torch


def env_minibatches(
    n_envs: int,
    n_minibatches: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A fresh random permutation of ``range(n_envs)`` split evenly: int64 ``[n_minibatches, n_envs //
    n_minibatches]``. Call it once per epoch; every env lands in exactly one minibatch.

    ``generator`` makes the shuffle reproducible (it must live on ``device``). This function draws
    random numbers with ``torch.randperm`` and is meant to be called eagerly from the shell, outside
    compiled regions; it is not part of the fullgraph-compiled core.

    Raises:
        ValueError: ``n_minibatches < 1``, ``n_envs < 1``, or ``n_minibatches`` does not divide ``n_envs``
            (uneven minibatches would change the shapes the compiled update sees).
    """
    if n_envs < 1:
        raise ValueError(f"env_minibatches: n_envs must be >= 1, got {n_envs}")
    if n_minibatches < 1:
        raise ValueError(f"env_minibatches: n_minibatches must be >= 1, got {n_minibatches}")
    if n_envs % n_minibatches:
        raise ValueError(
            f"env_minibatches: n_minibatches ({n_minibatches}) must divide n_envs ({n_envs}) so every "
            f"minibatch has the same number of whole env sequences"
        )
    perm = torch.randperm(n_envs, generator=generator, device=device)
    return perm.view(n_minibatches, n_envs // n_minibatches)


__all__ = ["env_minibatches"]
