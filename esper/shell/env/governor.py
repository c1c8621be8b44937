"""Tolaria, the governor: catches a host whose training has blown up and rolls it back.

Once per epoch the shell calls :meth:`Governor.check` with each env's validation loss. It panics on

* ``"nonfinite"``: the loss is NaN or ±Inf (at once);
* ``"lobotomy"``: the host had learned (mean of the loss history below ``lobotomy_fraction`` × the
  random-guess loss, ln(classes) or ln(vocab)) and the loss is now back within ``lobotomy_tolerance``
  (relative) of the random-guess loss: its outputs have gone uniform (at once; needs a non-empty
  history);
* ``"spike"``: the loss is above ``panic_loss`` **and** above μ + ``sigma``·σ **and** above
  ``mean_factor``·μ of the history, on ``consecutive`` consecutive epochs (needs ``min_history``
  values). Only normal losses enter the history, so a spike cannot drag the statistics up.

**Snapshots (finding C7).** :meth:`Governor.snapshot` keeps exactly one CPU copy of the host's state
per env. The first snapshot allocates the CPU tensors (pinned when CUDA is available, so the
device-to-host copy is asynchronous); every later one ``copy_``s into the same storage. An entry is
reallocated only when its shape or dtype changed, and entries no longer present are dropped. Memory
is therefore flat over any number of epochs and episodes (the original kept growing copies).
:meth:`Governor.reset` starts a new episode: history and panic count are cleared and the snapshot is
marked stale, but its buffers are kept for reuse.

**Rollback and its penalty.** On a panic the shell calls :meth:`Governor.rollback`, loads the returned
state into the host, prunes the non-fossilized seeds and zeroes the host optimizer's momentum. The
rollback's ``reward_delta`` (``-penalty``) is added to that env's reward at this step **and the env's
transitions are kept**: the learner sees the penalty. (The original discarded the rolled-back env's
transitions, so the −10 it computed never reached PPO.)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch

from esper.shell.common.fields import check_fields, doc

#: Reasons :meth:`Governor.check` may return.
PANIC_REASONS = ("nonfinite", "lobotomy", "spike")


@dataclass(frozen=True, slots=True)
class GovernorConfig:
    enabled: bool = doc(True, "watch validation losses and roll back a host that blew up")
    history: int = doc(20, "validation losses kept per env for the spike statistics", ge=1)
    min_history: int = doc(10, "losses needed before a statistical spike can be declared", ge=1)
    lobotomy_fraction: float = doc(
        0.6, "'had learned' means history mean below this x the random-guess loss", gt=0, le=1
    )
    lobotomy_tolerance: float = doc(
        0.065, "'back to random guessing' means within this relative distance of the random-guess loss", ge=0
    )
    panic_loss: float = doc(12.0, "a spike must exceed this absolute loss")
    sigma: float = doc(6.0, "a spike must exceed mean + sigma x std of the history", ge=0)
    mean_factor: float = doc(3.0, "a spike must exceed this x the history mean", ge=1)
    consecutive: int = doc(3, "consecutive spiking epochs before a panic", ge=1)
    snapshot_every: int = doc(5, "snapshot the host every this many epochs (and at epoch 0)", ge=1)
    penalty: float = doc(10.0, "reward penalty (magnitude) for the env at the step of a rollback", ge=0)

    def __post_init__(self) -> None:
        check_fields(self, "governor")
        if self.min_history > self.history:
            raise ValueError(
                f"governor.min_history ({self.min_history}) must be <= governor.history ({self.history})"
            )


class _EnvWatch:
    """Per-env state: loss history, spike run length, the snapshot buffers."""

    __slots__ = ("history", "n_rollbacks", "ready", "snapshot", "spikes", "written")

    def __init__(self, size: int) -> None:
        self.history: deque[float] = deque(maxlen=size)
        self.spikes = 0
        self.n_rollbacks = 0
        self.snapshot: dict[str, torch.Tensor] = {}
        self.ready = False  # the buffers hold a snapshot of the current episode
        self.written: torch.cuda.Event | None = None  # marks the end of an async device-to-host copy


class Governor:
    """Watches ``n_envs`` hosts; see the module docstring.

    Args:
        cfg: thresholds.
        n_envs: number of hosts, indexed ``0 .. n_envs - 1``.
        random_guess_loss: cross-entropy of a uniform prediction, ``ln(n_classes)`` (> 0).
    """

    def __init__(self, cfg: GovernorConfig, n_envs: int, random_guess_loss: float) -> None:
        if n_envs < 1:
            raise ValueError(f"Governor needs n_envs >= 1, got {n_envs}")
        if not (math.isfinite(random_guess_loss) and random_guess_loss > 0):
            raise ValueError(f"random_guess_loss must be finite and > 0, got {random_guess_loss}")
        self.cfg = cfg
        self.n_envs = n_envs
        self.random_guess_loss = float(random_guess_loss)
        self._pin = torch.cuda.is_available()
        self._envs = [_EnvWatch(cfg.history) for _ in range(n_envs)]

    # ------------------------------------------------------------------------------------- watching
    def check(self, env: int, val_loss: float) -> str | None:
        """Record this epoch's validation loss of ``env``; the panic reason, or None if healthy."""
        if not self.cfg.enabled:
            return None
        w = self._env(env)
        cfg = self.cfg
        loss = float(val_loss)
        if not math.isfinite(loss):
            return self._panic(w, "nonfinite")
        hist = w.history
        rg = self.random_guess_loss
        if hist:
            mean = math.fsum(hist) / len(hist)
            if mean < cfg.lobotomy_fraction * rg and abs(loss - rg) <= cfg.lobotomy_tolerance * rg:
                return self._panic(w, "lobotomy")
        if len(hist) >= cfg.min_history:
            mean = math.fsum(hist) / len(hist)
            std = math.sqrt(math.fsum((x - mean) ** 2 for x in hist) / len(hist))
            if loss > cfg.panic_loss and loss > mean + cfg.sigma * std and loss > cfg.mean_factor * mean:
                w.spikes += 1
                if w.spikes >= cfg.consecutive:
                    return self._panic(w, "spike")
                return None  # anomalous: kept out of the history
        w.spikes = 0
        hist.append(loss)
        return None

    def reset(self, env: int) -> None:
        """New episode for ``env``: clear history and panic count; the snapshot becomes stale (its
        buffers are kept and reused by the next :meth:`snapshot`)."""
        w = self._env(env)
        w.history.clear()
        w.spikes = 0
        w.n_rollbacks = 0
        w.ready = False

    def should_snapshot(self, epoch: int) -> bool:
        """True at epoch 0 and every ``snapshot_every`` epochs (never when disabled)."""
        return self.cfg.enabled and epoch % self.cfg.snapshot_every == 0

    def n_rollbacks(self, env: int) -> int:
        """Rollbacks of ``env`` in the current episode."""
        return self._env(env).n_rollbacks

    # ------------------------------------------------------------------------------------ snapshots
    def snapshot(self, env: int, state: dict[str, torch.Tensor]) -> None:
        """Copy ``state`` (a ``state_dict`` of host + fossilized seeds) into ``env``'s CPU buffers.

        Buffers are reused across calls (``copy_``); an entry is reallocated only when its shape or
        dtype changed, and entries absent from ``state`` are dropped. With CUDA the copy is
        asynchronous on the current stream (call this under the env's stream, after the epoch's
        writes were enqueued there); :meth:`restore` waits for it.
        """
        w = self._env(env)
        buf = w.snapshot
        for name in [n for n in buf if n not in state]:
            del buf[name]
        non_blocking = False
        for name, src in state.items():
            if not isinstance(src, torch.Tensor):
                raise TypeError(f"Governor.snapshot: entry {name!r} is a {type(src).__name__}, not a tensor")
            src = src.detach()
            dst = buf.get(name)
            if dst is None or dst.shape != src.shape or dst.dtype != src.dtype:
                dst = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=self._pin)
                buf[name] = dst
            async_copy = self._pin and src.is_cuda
            dst.copy_(src, non_blocking=async_copy)
            non_blocking |= async_copy
        if non_blocking:
            w.written = torch.cuda.Event()
            w.written.record()
        else:
            w.written = None
        w.ready = True

    def restore(self, env: int) -> dict[str, torch.Tensor]:
        """The snapshot of ``env``: the CPU buffers themselves (load them into the host, e.g. with
        ``load_state_dict``; the next :meth:`snapshot` overwrites them)."""
        w = self._env(env)
        if not w.ready:
            raise RuntimeError(f"Governor.restore: env {env} has no snapshot in this episode")
        if w.written is not None:
            w.written.synchronize()  # sync point: the async device-to-host copy must have landed
            w.written = None
        return w.snapshot

    def rollback(self, env: int) -> tuple[dict[str, torch.Tensor], float]:
        """``(snapshot, reward_delta)`` for a panicked ``env``. ``reward_delta`` is ``-cfg.penalty``:
        add it to the env's reward at this step and keep the env's transitions (module docstring)."""
        state = self.restore(env)
        w = self._envs[env]
        w.spikes = 0
        w.n_rollbacks += 1
        return state, -self.cfg.penalty

    def snapshot_bytes(self, env: int) -> int:
        """Bytes held by ``env``'s snapshot buffers."""
        return sum(t.numel() * t.element_size() for t in self._env(env).snapshot.values())

    # -------------------------------------------------------------------------------------- helpers
    def _env(self, env: int) -> _EnvWatch:
        if not 0 <= env < self.n_envs:
            raise IndexError(f"env {env} out of range for {self.n_envs} envs")
        return self._envs[env]

    @staticmethod
    def _panic(w: _EnvWatch, reason: str) -> str:
        w.spikes = 0
        return reason


__all__ = ["PANIC_REASONS", "Governor", "GovernorConfig"]
