"""Every env's host, its optimizers, its data and its AMP scaler: the host side of :class:`VecEnv`.

:class:`PerEnvHosts` steps the envs one after the other (or on a few CPU threads), each through its own
:class:`~esper.shell.host.model.EnvModel` and, on CUDA, on its own stream (finding S1). It is the
reference path: another way of training the same hosts must give its numbers.

A bank answers in tensors already joined onto the policy device (:meth:`PerEnvHosts.measure`,
:meth:`PerEnvHosts.final`), so the environment never reads a result another stream may still write.
The slot state, the lifecycle and the governor's decisions belong to the environment; the bank only
builds, removes and re-weights seed modules when told (:meth:`germinate`, :meth:`prune`,
:meth:`set_slot`) and restores a host from a snapshot (:meth:`rollback`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from esper.core.spec import Stage, Style
from esper.shell.common.seeding import derive_seed
from esper.shell.data.batches import Loaders
from esper.shell.host.gradinit import GRAD_GAIN_KEYS
from esper.shell.host.hosts import Host
from esper.shell.host.model import SEED_GRAD_KEYS, EnvModel
from esper.shell.host.streams import EnvStreams

#: What :meth:`PerEnvHosts.measure` returns per env, in order: ``[E]`` each, ``[E, S]`` from the fifth
#: (each live seed's contribution, its validation loss at alpha 0 minus the real one, each incubating
#: seed's what-if gain (0 unless asked for), then the seeds' gradients:
#: :data:`~esper.shell.host.model.SEED_GRAD_KEYS`).
MEASURED = ("train_loss", "train_acc", "val_loss", "val_acc", "contribution", "loss_contribution",
            "whatif_gain", *SEED_GRAD_KEYS)  # fmt: skip
#: What :meth:`PerEnvHosts.revalidate` returns of the listed envs after a rollback.
REVALIDATED = ("val_loss", "val_acc", "contribution", "loss_contribution")


class HostSource(Protocol):
    """What host training reads of a task (:class:`esper.shell.env.tasks.Task` is one): a fresh host
    (``make_host_for(seed)`` too where the hosts differ by seed: :func:`build_host`), and one env's
    iterators over the three splits."""

    make_host: Callable[[], Host]
    make_loaders: Callable[..., Loaders]


def build_host(task: HostSource, seed: int) -> Host:
    """The host of host seed ``seed``: ``task.make_host_for(seed)`` where the task's hosts differ by seed
    (a family of hosts, :attr:`esper.shell.env.tasks.Task.make_host_for`), else ``task.make_host()``. Its
    weights come from the global generator: seed it first (:meth:`PerEnvHosts.reset` seeds it with the
    host seed)."""
    make_for = getattr(task, "make_host_for", None)
    return make_for(int(seed)) if make_for is not None else task.make_host()


class HostSettings(Protocol):
    """What host training reads of the env config (:class:`esper.shell.env.config.EnvConfig` is one)."""

    n_envs: int
    device: str
    devices: tuple[str, ...]
    host_lr: float
    seed_lr: float
    momentum: float
    weight_decay: float
    amp: bool
    workers: int

    @property
    def batched(self) -> bool: ...


def snapshot_state(host: Host) -> dict[str, torch.Tensor]:
    """The host and its fossilized seeds: what a governor rollback restores (tensors only: a user slot's
    extra state, the description of its seed, is not a weight)."""
    keep = {f"slots.{s}." for s in range(host.n_slots) if host.slot(s).stage == Stage.FOSSILIZED}
    return {
        k: v for k, v in host.state_dict().items()
        if isinstance(v, torch.Tensor) and (not k.startswith("slots.") or any(k.startswith(p) for p in keep))
    }  # fmt: skip


@contextmanager
def seeded(device: torch.device, seed: int) -> Iterator[None]:
    """The global generators (CPU, and ``device``'s on CUDA) seeded with ``seed`` inside the block and
    restored after: a module built there (a seed, a gate) does not depend on what was drawn before."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.default_generator.manual_seed(seed)
        if device.type == "cuda":
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        yield


def _uses_dropout(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules())


class PerEnvHosts:
    """The hosts of ``cfg.n_envs`` envs of ``task``; ``device`` is where results are joined (the
    policy's). Call :meth:`reset` before the first episode."""

    def __init__(self, cfg: HostSettings, task: HostSource, device: torch.device) -> None:
        self.cfg, self.task, self.device = cfg, task, device
        self.n = cfg.n_envs
        names = cfg.devices or (cfg.device,)
        self.env_devices = [torch.device(names[i % len(names)]) for i in range(self.n)]
        self.streams = EnvStreams(self.env_devices)
        self.models: list[EnvModel] = []
        self.loaders: list[Loaders] = []
        self.scalers: list[torch.amp.GradScaler | None] = []
        self.host_seeds: list[int] = []
        #: Seconds of the last :meth:`measure`: ``host_training`` and ``validation``.
        self.timings: dict[str, float] = {}
        # Worker threads for CPU envs: only where training draws no random numbers from the global
        # generator (dropout would make the result depend on thread timing), so runs stay reproducible.
        concurrent = cfg.workers > 1 and all(d.type == "cpu" for d in self.env_devices)
        self._pool = (
            ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="esper-env")
            if concurrent and not _uses_dropout(task.make_host())
            else None
        )

    # ----------------------------------------------------------------------------------------- episode
    def reset(self, host_seeds: Sequence[int]) -> None:
        """Fresh hosts (initialized from the global generator seeded with the env's host seed),
        optimizers, data order and scalers."""
        self.host_seeds = [int(s) for s in host_seeds]
        self.models, self.loaders, self.scalers = [], [], []
        for env_seed, dev in zip(self.host_seeds, self.env_devices):
            torch.manual_seed(env_seed)  # host init and seed builds draw from the global RNG
            host = build_host(self.task, env_seed).to(dev)
            cfg = self.cfg
            self.models.append(
                EnvModel(host, host_lr=cfg.host_lr, seed_lr=cfg.seed_lr, momentum=cfg.momentum,
                         weight_decay=cfg.weight_decay)
            )  # fmt: skip
            self.loaders.append(self.task.make_loaders(env_seed, device=dev))
            # H12: one scaler per env, only ever used inside that env's stream
            use_scaler = cfg.amp and dev.type == "cuda"
            self.scalers.append(torch.amp.GradScaler("cuda") if use_scaler else None)

    def host(self, i: int) -> Host:
        """Env ``i``'s host."""
        return self.models[i].host

    def loaders_of(self, i: int) -> Loaders:
        """Env ``i``'s iterators over the three splits (what its epochs' FLOPs are counted over)."""
        return self.loaders[i]

    def host_params(self, i: int) -> int:
        return sum(p.numel() for p in self.models[i].host.host_parameters())

    def alphas(self, i: int) -> list[float]:
        host = self.models[i].host
        return [host.slot(s).alpha for s in range(host.n_slots)]

    # ------------------------------------------------------------------------------------------- epochs
    def measure(
        self, lr_scale: float, *, whatif: bool = False, whatif_statistics: str = "running",
        grad_batches: int = 0,
    ) -> dict[str, torch.Tensor]:  # fmt: skip
        """Train every env one epoch at ``lr_scale`` times its learning rates, then validate it with
        every live seed's counterfactual (and, with ``whatif``, every incubating seed's what-if gain, read
        with ``whatif_statistics``): :data:`MEASURED`, stacked over envs on the policy device. With
        ``grad_batches`` (``lifecycle.grad_init``) the last that many training batches also leave each
        slot's statistics (:mod:`esper.shell.host.gradinit`), and the result adds
        :data:`~esper.shell.host.gradinit.GRAD_GAIN_KEYS` ``[E, S]``."""
        t0 = time.perf_counter()
        for model in self.models:
            model.set_lr_scale(lr_scale)
        kw = {"record": grad_batches} if grad_batches else {}  # off: the call as it was
        train = self._each(lambda i: self.models[i].train_epoch(self.loaders[i].train, **self._amp(i), **kw))
        t1 = time.perf_counter()
        val = self._each(
            lambda i: self.models[i].measure_validation(
                self.loaders[i].val, whatif=whatif, whatif_statistics=whatif_statistics
            )
        )
        t2 = time.perf_counter()
        self.timings = {"host_training": t1 - t0, "validation": t2 - t1}
        keys = (*MEASURED, *(GRAD_GAIN_KEYS if grad_batches else ()))
        rows = []
        for i in range(self.n):
            tr, v = train[i], val[i]
            parts = [tr["loss"], tr["acc"], v["val_loss"], v["val_acc"], v["contribution"],
                     v["loss_contribution"], v["whatif_gain"], *(tr[k] for k in SEED_GRAD_KEYS),
                     *(tr[k] for k in keys[len(MEASURED):])]  # fmt: skip
            # cast after the join: a cast is a read, and reads of env i's results wait on its event (S1)
            rows.append([p.float() for p in self.streams.join(i, parts, self.device)])
        return {k: torch.stack([r[j] for r in rows]) for j, k in enumerate(keys)}

    def revalidate(self, envs: Sequence[int]) -> dict[str, torch.Tensor]:
        """:data:`REVALIDATED` of the listed envs again (after a rollback): ``val_loss``, ``val_acc``
        ``[len(envs)]``, ``contribution`` and ``loss_contribution [len(envs), S]``."""
        val = []
        for i in envs:
            with self.streams.run(i):
                out = self.models[i].measure_validation(self.loaders[i].val)
                val.append([out[k] for k in REVALIDATED])
        rows = [[t.float() for t in self.streams.join(i, v, self.device)] for i, v in zip(envs, val)]
        return {k: torch.stack([r[j] for r in rows]) for j, k in enumerate(REVALIDATED)}

    def final(self) -> dict[str, torch.Tensor]:
        """The final hosts on validation and on the held-out test split (read here and nowhere else):
        ``val_loss``, ``val_acc``, ``test_loss``, ``test_acc`` ``[E]``."""
        val = self._each(lambda i: self.models[i].validate(self.loaders[i].val))
        test = self._each(lambda i: self.models[i].validate(self.loaders[i].test))
        rows = [
            [p.float() for p in self.streams.join(i, [*val[i], *test[i]], self.device)] for i in range(self.n)
        ]
        keys = ("val_loss", "val_acc", "test_loss", "test_acc")
        return {k: torch.stack([r[j] for r in rows]) for j, k in enumerate(keys)}

    # -------------------------------------------------------------------------------------------- seeds
    def germinate(
        self, i: int, slot: int, blueprint: int, style: Style | int, epoch: int, *,
        grad_init: float | None = None,
    ) -> int:  # fmt: skip
        """Build the seed into env ``i``'s slot (the global generator seeded from the env's host seed,
        the epoch and the slot, and restored after: what is built does not depend on what the other
        envs drew before, so an env's episode is the same in any process's slice); its parameters. With
        ``grad_init`` (a scale) its projection starts from the slot's statistics
        (:mod:`esper.shell.host.gradinit`)."""
        seed = derive_seed("build", self.host_seeds[i], epoch, slot)
        with self.streams.run(i), seeded(self.env_devices[i], seed):
            return self.models[i].germinate(slot, blueprint, style, grad_init=grad_init)

    def prune(self, i: int, slot: int) -> None:
        self.models[i].prune(slot)

    def set_slot(self, i: int, slot: int, *, alpha: float, stage: int) -> None:
        self.models[i].host.set_slot(slot, alpha=alpha, stage=stage)

    def snapshot_state(self, i: int) -> dict[str, torch.Tensor]:
        return snapshot_state(self.models[i].host)

    def rollback(self, i: int, snapshot: dict[str, torch.Tensor]) -> list[int]:
        """Remove every seed of env ``i`` that is not fossilized, load ``snapshot`` into the host, clear
        every optimizer's momentum and the slot statistics; returns the slots whose seed was removed."""
        model = self.models[i]
        model.slot_stats = None  # measured on the host before the rollback
        removed = []
        for s in range(model.host.n_slots):
            slot = model.host.slot(s)
            if slot.occupied and slot.stage != Stage.FOSSILIZED:
                model.prune(s)
                removed.append(s)
        current = model.host.state_dict()
        model.host.load_state_dict({k: v for k, v in snapshot.items() if k in current}, strict=False)
        for opt in model.optimizers():
            opt.state.clear()
        return removed

    def close(self) -> None:
        """Stop the worker threads (if any); the bank stays usable, one env after the other."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # ------------------------------------------------------------------------------------------ helpers
    def _each(self, work: Callable[[int], Any]) -> list[Any]:
        """``[work(i) for i in envs]``, each inside env i's stream; on CPU with ``env.workers > 1``
        the envs run concurrently on a thread pool (PyTorch releases the GIL inside its ops, and the
        envs share nothing: own model, optimizers, data generator). Results keep env order."""

        def run(i: int) -> Any:
            with self.streams.run(i):
                return work(i)

        if self._pool is None or self.n == 1:
            return [run(i) for i in range(self.n)]
        return list(self._pool.map(run, range(self.n)))

    def _amp(self, i: int) -> dict:
        if not self.cfg.amp:
            return {}
        dev = self.env_devices[i]
        return {
            "autocast_dtype": torch.float16 if dev.type == "cuda" else torch.bfloat16,
            "scaler": self.scalers[i],
        }


__all__ = ["MEASURED", "PerEnvHosts", "build_host", "seeded", "snapshot_state"]
