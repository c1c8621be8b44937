"""Many processes, one controller: the ``torch.distributed`` plumbing of a run under ``torchrun``.

    torchrun --standalone --nproc_per_node=2 -m esper.shell.run --env.n_envs 8
    torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 \\
        -m esper.shell.run --env.n_envs 32

:func:`init` reads torchrun's ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``; without
them (a plain ``python -m esper.shell.run``) it returns :data:`SINGLE`, whose collectives do nothing, so
the single-process code path is the distributed one with a world of one. With them it joins the
process group (gloo on CPU, NCCL with one GPU per rank, ``cuda:LOCAL_RANK``) with a bounded timeout:
a collective that a dead peer never joins raises instead of hanging, and the run turns that into one
line (:class:`PeerLost`).

What each rank does (see :mod:`esper.shell.run`): runs the envs ``[rank * n, (rank + 1) * n)`` of the
global ``env.n_envs`` (host seeds, data order and action sampling derive from the global env index,
so a run's episodes do not depend on the world size), holds a replica of the policy and the PPO
state, and takes part in every update's collectives (:class:`~esper.shell.agent.trainer.PPOTrainer`):
normalizer statistics merged, advantage statistics, loss denominators, KL and finiteness flags and
gradients summed, so every rank takes the same optimizer steps. Rank 0 alone writes the run directory.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as td

#: Default seconds a collective waits for a peer before the run gives up (``--dist_timeout``).
DEFAULT_TIMEOUT = 300.0


class PeerLost(RuntimeError):
    """A collective failed: another rank died or stopped answering within the timeout."""


@dataclass(frozen=True, slots=True)
class Dist:
    """This process's place in the run: ``rank`` of ``world`` processes, ``local_rank`` of
    ``local_world`` on its machine, and the collectives (no-ops for a world of one)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes the run directory and talks to the user."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def shard(self, n_envs: int) -> tuple[int, int]:
        """``(first, count)``: the global env indices ``[first, first + count)`` this rank runs.

        Raises:
            ValueError: ``n_envs`` does not divide by the world size (one line).
        """
        if n_envs % self.world:
            raise ValueError(
                f"env.n_envs {n_envs} must be a multiple of the number of processes ({self.world}): "
                f"each runs the same number of envs"
            )
        per = n_envs // self.world
        return self.rank * per, per

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """``t`` reduced over every rank (``sum``, ``max`` or ``min``), in place and returned."""
        if self.active:
            ops = {"sum": td.ReduceOp.SUM, "max": td.ReduceOp.MAX, "min": td.ReduceOp.MIN}
            _collective(td.all_reduce, t, op=ops[op])
        return t

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return self.all_reduce(t, "sum")

    def gather_tensors(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``t`` (same shape everywhere), in rank order."""
        if not self.active:
            return [t]
        out = [torch.empty_like(t) for _ in range(self.world)]
        _collective(td.all_gather, out, t.contiguous())
        return out

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order (on every rank)."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        _collective(td.all_gather_object, out, obj)
        return out

    def barrier(self) -> None:
        if self.active:
            _collective(td.barrier)

    def close(self) -> None:
        if self.active and td.is_initialized():
            td.destroy_process_group()


SINGLE = Dist()


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(*, timeout: float = DEFAULT_TIMEOUT) -> Dist:
    """Join the process group torchrun set up (or :data:`SINGLE` outside torchrun): gloo for CPU
    tensors, and NCCL for CUDA ones where the machine has a GPU for each of its processes (each on
    ``cuda:LOCAL_RANK``).

    Raises:
        ValueError: a bad ``timeout`` or torchrun variables (one line).
        PeerLost: the rendezvous failed.
    """
    if not under_torchrun():
        return SINGLE
    if not timeout > 0:
        raise ValueError(f"--dist_timeout must be > 0 seconds, got {timeout}")
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    except ValueError:
        raise ValueError("RANK, WORLD_SIZE, LOCAL_RANK must be integers (set by torchrun)") from None
    if world == 1:
        return Dist(rank=0, world=1, local_rank=local_rank, local_world=local_world)
    # the same choice on every process of a machine: NCCL only where each process can have its own GPU
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(local_rank)
    try:
        td.init_process_group(backend=backend, timeout=dt.timedelta(seconds=timeout))
    except (RuntimeError, ValueError) as e:
        raise PeerLost(f"could not join the other processes: {_first_line(e)}") from None
    return Dist(rank=rank, world=world, local_rank=local_rank, local_world=local_world, backend=backend)


def rank_device(device: str, dist: Dist) -> str:
    """The device of this rank: ``cuda:LOCAL_RANK`` for a CUDA run under torchrun, else ``device``.

    Raises:
        ValueError: a CUDA run with fewer GPUs on this machine than processes (one line).
    """
    if not (dist.active and torch.device(device).type == "cuda"):
        return device
    if torch.cuda.device_count() <= dist.local_rank:
        raise ValueError(
            f"{dist.local_world} processes on this machine need {dist.local_world} CUDA devices, it has "
            f"{torch.cuda.device_count()}"
        )
    return f"cuda:{dist.local_rank}"


def _collective(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except (RuntimeError, ValueError, ConnectionError) as e:  # DistBackendError is a RuntimeError
        raise PeerLost(f"another process stopped answering ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    """The first line of ``e``'s message without the backend's source location, at most 160 characters."""
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", str(e).strip())
    line = text.splitlines()[0] if text else type(e).__name__
    return line if len(line) <= 160 else line[:157] + "..."


__all__ = ["DEFAULT_TIMEOUT", "SINGLE", "Dist", "PeerLost", "init", "rank_device", "under_torchrun"]
