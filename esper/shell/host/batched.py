"""Every env's host trained as one batch: the fast host side of :class:`~esper.shell.env.vecenv.VecEnv`.

:class:`BatchedHosts` answers as :class:`~esper.shell.host.bank.PerEnvHosts` does (the reference path,
which a test holds it to), but one training step runs every env's host and seeds at once
(:class:`~esper.shell.host.stacked.StackedHosts`): each env draws its own batch from its own loader, the
batches are stacked, one forward and one backward run them all, and one SGD optimizer (``foreach``)
updates every env's parameters — the hosts' in one group, the seeds' in another, each parameter with its
own momentum, exactly as the per-env optimizers would. A parameter that took no part in a step (a seed
at alpha 0) has no gradient and is not updated, as on the per-env path. Validation and every live
seed's counterfactual run as one batch too, the counterfactual passes from the slot they change onwards.

It serves the CNN families (``cnn``, ``cnn1d``) with every env on one device; mixed precision is bf16
autocast (CUDA's fp16 needs a GradScaler per env: that runs on the per-env path, ``env.host_step``).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from esper.core.lifecycle import WHATIF_STATISTICS
from esper.core.spec import Stage, Style
from esper.shell.common.seeding import derive_seed
from esper.shell.data.batches import Loaders
from esper.shell.host.bank import (
    MEASURED,
    REVALIDATED,
    HostSettings,
    HostSource,
    PerEnvHosts,
    build_host,
    seeded,
    snapshot_state,
)  # fmt: skip
from esper.shell.host.gradinit import GRAD_GAIN_KEYS, SlotStats, init_projection
from esper.shell.host.hosts import Host
from esper.shell.host.model import SEED_GRAD_KEYS, seed_grad_stats
from esper.shell.host.stacked import StackedHosts, plan, stack_inputs, supports


class BatchedHosts:
    """The hosts of ``cfg.n_envs`` envs of ``task`` on ``cfg.device``, trained as one batch; results
    are returned on ``device`` (the policy's). Call :meth:`reset` before the first episode."""

    def __init__(self, cfg: HostSettings, task: HostSource, device: torch.device) -> None:
        self.cfg, self.task, self.device = cfg, task, device
        self.n = cfg.n_envs
        self.host_device = torch.device(cfg.devices[0] if cfg.devices else cfg.device)
        self.hosts: list[Host] = []
        self.loaders: list[Loaders] = []
        self.host_seeds: list[int] = []
        self.stack: StackedHosts | None = None
        self.optimizer: torch.optim.SGD | None = None
        #: Seconds of the last :meth:`measure`: ``host_training`` and ``validation``.
        self.timings: dict[str, float] = {}
        #: Per env, the slot statistics of the last epoch trained with ``grad_batches`` (else None).
        self.slot_stats: list[SlotStats | None] = []

    # ----------------------------------------------------------------------------------------- episode
    def reset(self, host_seeds: Sequence[int]) -> None:
        """Fresh hosts (each initialized from the global generator seeded with its env's host seed, as
        on the per-env path), one optimizer over all of them, data order per env."""
        self.host_seeds = [int(s) for s in host_seeds]
        self.hosts, self.loaders = [], []
        self.slot_stats = [None] * len(self.host_seeds)
        for env_seed in self.host_seeds:
            torch.manual_seed(env_seed)  # host init and seed builds draw from the global RNG
            self.hosts.append(build_host(self.task, env_seed).to(self.host_device))
            self.loaders.append(self.task.make_loaders(env_seed, device=self.host_device))
        cfg = self.cfg
        if not supports(self.hosts[0]):
            kind = type(self.hosts[0]).__name__
            raise ValueError(
                f"env.host_step batched: a {kind} host trains env by env; use --env.host_step per_env"
            )
        self.stack = StackedHosts(self.hosts)
        # the hosts' own parameters as one leaf per parameter over the envs; the seeds' join group 1 as
        # they are germinated, per env (their envs, slots and blueprints differ)
        self.optimizer = torch.optim.SGD(
            [
                {"params": self.stack.bind_parameters(), "lr": cfg.host_lr, "weight_decay": cfg.weight_decay},
                {"params": [], "lr": cfg.seed_lr, "weight_decay": 0.0},
            ],
            lr=cfg.host_lr, momentum=cfg.momentum, foreach=True,
        )  # fmt: skip

    def host(self, i: int) -> Host:
        """Env ``i``'s host."""
        return self.hosts[i]

    def loaders_of(self, i: int) -> Loaders:
        """Env ``i``'s iterators over the three splits."""
        return self.loaders[i]

    def host_params(self, i: int) -> int:
        return sum(p.numel() for p in self.hosts[i].host_parameters())

    def alphas(self, i: int) -> list[float]:
        return [self.hosts[i].slot(s).alpha for s in range(self.hosts[i].n_slots)]

    # ------------------------------------------------------------------------------------------- epochs
    def measure(
        self, lr_scale: float, *, whatif: bool = False, whatif_statistics: str = "running",
        grad_batches: int = 0,
    ) -> dict[str, torch.Tensor]:  # fmt: skip
        """Train every env one epoch at ``lr_scale`` times its learning rates, then validate it with
        every live seed's counterfactual (and, with ``whatif``, every incubating seed's what-if gain, read
        with ``whatif_statistics``): :data:`~esper.shell.host.bank.MEASURED`, stacked over envs; with
        ``grad_batches``, also each slot's statistics and
        :data:`~esper.shell.host.gradinit.GRAD_GAIN_KEYS`, as on the per-env path."""
        t0 = time.perf_counter()
        train = self._train_epoch(lr_scale, grad_batches)
        t1 = time.perf_counter()
        val = self._validate(counterfactual=True, whatif=whatif, whatif_statistics=whatif_statistics)
        self.timings = {"host_training": t1 - t0, "validation": time.perf_counter() - t1}
        out = {**train, **val}
        keys = (*MEASURED, *(GRAD_GAIN_KEYS if grad_batches else ()))
        return {k: out[k].float().to(self.device) for k in keys}

    def revalidate(self, envs: Sequence[int]) -> dict[str, torch.Tensor]:
        """:data:`~esper.shell.host.bank.REVALIDATED` of the listed envs again (after a rollback; every env
        is measured, the listed ones returned)."""
        val = self._validate(counterfactual=True)
        rows = torch.tensor(list(envs), device=val["val_loss"].device)
        return {k: val[k][rows].float().to(self.device) for k in REVALIDATED}

    def final(self) -> dict[str, torch.Tensor]:
        """The final hosts on validation and on the held-out test split (read here and nowhere else)."""
        val = self._validate(counterfactual=False)
        test = self._validate(counterfactual=False, split="test")
        out = {"val_loss": val["val_loss"], "val_acc": val["val_acc"], "test_loss": test["val_loss"],
               "test_acc": test["val_acc"]}  # fmt: skip
        return {k: v.float().to(self.device) for k, v in out.items()}

    def _train_epoch(self, lr_scale: float, grad_batches: int = 0) -> dict[str, torch.Tensor]:
        cfg, stack, opt = self.cfg, self.stack, self.optimizer
        for group, base in zip(opt.param_groups, (cfg.host_lr, cfg.seed_lr)):
            group["lr"] = base * lr_scale
        for host in self.hosts:
            host.train()
        train_plan = plan(self.hosts)
        incubating = [(e, s) for e, h in enumerate(self.hosts) for s in h.incubating_slots()]
        # the what-if pass, for the envs with an incubating seed that has parameters to train
        whatif_envs = sorted({e for e, s in incubating if self.hosts[e].seed_parameters(s)})
        incubating = [(e, s) for e, s in incubating if e in whatif_envs]
        position = {e: k for k, e in enumerate(whatif_envs)}
        whatif = (whatif_envs, plan(
            [self.hosts[e] for e in whatif_envs], forced={(position[e], s): 1.0 for e, s in incubating},
            incubating_only=True,
        ), min((s for _, s in incubating), default=0))  # fmt: skip
        loss_sum = torch.zeros(self.n, device=self.host_device)
        correct = torch.zeros(self.n, dtype=torch.int64, device=self.host_device)
        n_items = 0
        stats = [SlotStats(h.n_slots, h.family, grad_batches) for h in self.hosts] if grad_batches else None
        kw = {"record": self._recorder(stats)} if stats is not None else {}  # off: the call as it was
        for batches in zip(*(ld.train for ld in self.loaders)):
            x, y = stack_inputs(batches)
            opt.zero_grad(set_to_none=True)
            with self._autocast():
                total, loss, n_correct = stack.loss(x, y, train_plan, whatif, **kw)
            total.backward()
            opt.step()
            loss_sum += loss.float() * y.shape[1]
            correct += n_correct
            n_items += y.shape[1]
        if n_items == 0:
            raise ValueError("BatchedHosts: no training batches")
        grads = [self._seed_grad_stats(e) for e in range(self.n)]
        gains = {}
        if stats is not None:
            self.slot_stats = stats
            per_env = [st.gain(self.host_device) for st in stats]
            gains = {k: torch.stack([g[k] for g in per_env]) for k in GRAD_GAIN_KEYS}
        return {"train_loss": loss_sum / n_items, "train_acc": correct.float() * (100.0 / n_items),
                **{k: torch.stack([g[k] for g in grads]) for k in SEED_GRAD_KEYS}, **gains}  # fmt: skip

    @staticmethod
    def _recorder(stats: list[SlotStats]):
        """The ``record`` of :meth:`~esper.shell.host.stacked.StackedHosts.loss`: each env's rows of a slot's
        input and of the gradient at its output, in that env's own layout ``[N, C, *spatial]``, into its
        :class:`~esper.shell.host.gradinit.SlotStats`."""

        def record(s: int, h: torch.Tensor, out: torch.Tensor) -> None:
            if not out.requires_grad:
                return
            h = h.detach().clone()

            def grad_hook(g: torch.Tensor) -> None:
                g = g.detach().clone()
                for e, st in enumerate(stats):
                    st.push(s, h[e].movedim(-1, 0), g[e].movedim(-1, 0))

            out.register_hook(grad_hook)

        return record

    def _seed_grad_stats(self, e: int) -> dict[str, torch.Tensor]:
        """:func:`seed_grad_stats` of env ``e`` after a step: its host parameters lend their ``.grad`` the
        env's rows of the stacked gradients for the call (they hold none of their own)."""
        params = self.hosts[e].host_parameters()
        for p, g in zip(params, self.stack.host_grads(e)):
            p.grad = g
        try:
            return seed_grad_stats(self.hosts[e], params)
        finally:
            for p in params:
                p.grad = None

    def _validate(
        self, *, counterfactual: bool, split: str = "val", whatif: bool = False,
        whatif_statistics: str = "running",
    ) -> dict[str, torch.Tensor]:  # fmt: skip
        """``val_loss``, ``val_acc``, with ``counterfactual`` ``contribution`` and ``loss_contribution``
        ``[E, S]`` (each live seed's loss at alpha 0 minus the real one) and with ``whatif``
        ``whatif_gain [E, S]`` (each incubating seed's accuracy blended in at alpha 1, minus the host's,
        both with the batch-norm statistics ``whatif_statistics`` names; 0 elsewhere) on ``split``."""
        if whatif_statistics not in WHATIF_STATISTICS:
            raise ValueError(
                f"whatif_statistics must be one of {WHATIF_STATISTICS}, got {whatif_statistics!r}"
            )
        for host in self.hosts:
            host.eval()
        S = self.hosts[0].n_slots
        live = [[e for e, h in enumerate(self.hosts) if counterfactual and h.slot(s).contributes]
                for s in range(S)]  # fmt: skip
        incubating = [[e for e, h in enumerate(self.hosts) if whatif and h.slot(s).incubating]
                      for s in range(S)]  # fmt: skip
        eval_plan = plan(self.hosts, trainable=False)
        loss_sum = torch.zeros(self.n, device=self.host_device)
        correct = torch.zeros(self.n, dtype=torch.int64, device=self.host_device)
        cf = torch.zeros(self.n, S, dtype=torch.int64, device=self.host_device)
        cf_loss_sum = torch.zeros(self.n, S, device=self.host_device)
        wi = torch.zeros(self.n, S, dtype=torch.int64, device=self.host_device)
        wi_base = torch.zeros(self.n, dtype=torch.int64, device=self.host_device)
        by_batch = whatif_statistics == "batch"
        n_items = 0
        with self._autocast():
            for batches in zip(*(getattr(ld, split) for ld in self.loaders)):
                x, y = stack_inputs(batches)
                loss, n_correct, n_cf, n_wi, n_base, cf_loss = self.stack.evaluate(
                    x, y, eval_plan, live, incubating, batch_statistics=by_batch
                )
                loss_sum += loss.float() * y.shape[1]
                cf_loss_sum += cf_loss.float() * y.shape[1]
                correct += n_correct
                cf += n_cf
                wi += n_wi
                wi_base += n_base
                n_items += y.shape[1]
        for host in self.hosts:
            host.train()
        if n_items == 0:
            raise ValueError(f"BatchedHosts: no {split} batches")
        acc = correct.float() * (100.0 / n_items)
        out = {"val_loss": loss_sum / n_items, "val_acc": acc}
        if counterfactual:
            measured = torch.tensor([[e in live[s] for s in range(S)] for e in range(self.n)],
                                    dtype=torch.bool, device=acc.device)  # fmt: skip
            cf_acc = cf.float() * (100.0 / n_items)
            out["contribution"] = torch.where(measured, acc.unsqueeze(1) - cf_acc, 0.0)
            left_out_loss = cf_loss_sum / n_items - out["val_loss"].unsqueeze(1)
            out["loss_contribution"] = torch.where(measured, left_out_loss, 0.0)
        if whatif or counterfactual:
            asked = torch.tensor([[e in incubating[s] for s in range(S)] for e in range(self.n)],
                                 dtype=torch.bool, device=acc.device)  # fmt: skip
            base = wi_base.float() * (100.0 / n_items)
            out["whatif_gain"] = torch.where(asked, wi.float() * (100.0 / n_items) - base.unsqueeze(1), 0.0)
        return out

    def _autocast(self):
        on = self.cfg.amp
        return torch.autocast(self.host_device.type, dtype=torch.bfloat16, enabled=on)

    # -------------------------------------------------------------------------------------------- seeds
    def germinate(
        self, i: int, slot: int, blueprint: int, style: Style | int, epoch: int, *,
        grad_init: float | None = None,
    ) -> int:  # fmt: skip
        """Build the seed into env ``i``'s slot (seeded as on the per-env path; with ``grad_init`` its
        projection from the slot's statistics, as there) and give its parameters to the optimizer's seed
        group (fresh momentum); returns their count."""
        with seeded(self.host_device, derive_seed("build", self.host_seeds[i], epoch, slot)):
            params = self.hosts[i].germinate(slot, blueprint, style)
        stats = self.slot_stats[i] if self.slot_stats else None
        if grad_init is not None and stats is not None:
            init_projection(self.hosts[i].slot(slot), stats.slot_pairs(slot), grad_init)
        self.optimizer.param_groups[1]["params"].extend(params)
        return sum(p.numel() for p in params)

    def prune(self, i: int, slot: int) -> None:
        """Remove the seed from env ``i``'s slot, and its parameters and momentum from the optimizer."""
        self._forget(self.hosts[i].seed_parameters(slot))
        self.hosts[i].remove_seed(slot)

    def set_slot(self, i: int, slot: int, *, alpha: float, stage: int) -> None:
        self.hosts[i].set_slot(slot, alpha=alpha, stage=stage)

    def snapshot_state(self, i: int) -> dict[str, torch.Tensor]:
        return snapshot_state(self.hosts[i])

    def rollback(self, i: int, snapshot: dict[str, torch.Tensor]) -> list[int]:
        """As :meth:`esper.shell.host.bank.PerEnvHosts.rollback`: every seed of env ``i`` that is not
        fossilized removed, the snapshot loaded (into the shared batch-norm statistics too), every one
        of the env's parameters' momentum cleared, its slot statistics dropped."""
        host = self.hosts[i]
        if self.slot_stats:
            self.slot_stats[i] = None
        removed = [
            s for s in range(host.n_slots) if host.slot(s).occupied and host.slot(s).stage != Stage.FOSSILIZED
        ]
        for s in removed:
            self.prune(i, s)
        current = host.state_dict()
        host.load_state_dict({k: v for k, v in snapshot.items() if k in current}, strict=False)
        for p in host.parameters():  # the fossilized seeds' (group 1)
            self.optimizer.state.pop(p, None)
        with torch.no_grad():  # the host's rows of the stacked momentum: zero steps as a fresh buffer would
            for leaf in self.stack.leaves.values():
                buf = self.optimizer.state.get(leaf, {}).get("momentum_buffer")
                if buf is not None:
                    buf[i].zero_()
        return removed

    def close(self) -> None:
        return None

    def _forget(self, params: Sequence[torch.nn.Parameter]) -> None:
        gone = {id(p) for p in params}
        group = self.optimizer.param_groups[1]
        group["params"] = [p for p in group["params"] if id(p) not in gone]
        for p in params:
            self.optimizer.state.pop(p, None)


class ShardedHosts:
    """:class:`BatchedHosts` split into ``shards`` batches of consecutive envs, each trained by its own
    thread (CPU; ``env.workers``). An env's numbers do not depend on which envs share its batch, so the
    shards answer exactly as one batch would, to float tolerance (a test holds them to it). The point is
    the second core: the batched step runs on one thread (its kernels are too small to gain from a
    thread pool), and the shards' kernels release the GIL, so two shards run on two cores at once."""

    def __init__(self, cfg: HostSettings, task: HostSource, device: torch.device, shards: int) -> None:
        if not 1 <= shards <= cfg.n_envs:
            raise ValueError(f"ShardedHosts: {shards} shards for {cfg.n_envs} envs")
        self.cfg, self.task, self.device, self.n = cfg, task, device, cfg.n_envs
        bounds = [round(k * self.n / shards) for k in range(shards + 1)]
        #: Per shard, its first env and its bank.
        self.shards = [
            (lo, BatchedHosts(dataclasses.replace(cfg, n_envs=hi - lo), task, device))
            for lo, hi in itertools.pairwise(bounds)
        ]
        #: Env -> (its shard, its index there).
        self._where = [(k, j) for k, (_, bank) in enumerate(self.shards) for j in range(bank.n)]
        self._pool = ThreadPoolExecutor(max_workers=shards, thread_name_prefix="esper-shard")
        self.timings: dict[str, float] = {}

    @property
    def host_seeds(self) -> list[int]:
        return [s for _, bank in self.shards for s in bank.host_seeds]

    def _bank(self, i: int) -> tuple[BatchedHosts, int]:
        k, j = self._where[i]
        return self.shards[k][1], j

    def _each(self, work: Callable[[BatchedHosts], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """``work`` on every shard at once; the results concatenated over envs."""
        outs = list(self._pool.map(work, [bank for _, bank in self.shards]))
        return {k: torch.cat([o[k] for o in outs]) for k in outs[0]}

    def reset(self, host_seeds: Sequence[int]) -> None:
        if len(host_seeds) != self.n:
            raise ValueError(f"ShardedHosts.reset: {len(host_seeds)} host seeds for {self.n} envs")
        for lo, bank in self.shards:  # in order, in this thread: host init draws from the global RNG
            bank.reset(host_seeds[lo : lo + bank.n])

    def measure(
        self, lr_scale: float, *, whatif: bool = False, whatif_statistics: str = "running",
        grad_batches: int = 0,
    ) -> dict[str, torch.Tensor]:  # fmt: skip
        t0 = time.perf_counter()
        out = self._each(
            lambda bank: bank.measure(
                lr_scale, whatif=whatif, whatif_statistics=whatif_statistics, grad_batches=grad_batches
            )
        )
        wall = time.perf_counter() - t0
        # each shard's split of its own wall time between training and validation, scaled to this wall
        busy = [sum(bank.timings.values()) for _, bank in self.shards]
        share = sum(bank.timings["host_training"] for _, bank in self.shards) / max(sum(busy), 1e-12)
        self.timings = {"host_training": wall * share, "validation": wall * (1.0 - share)}
        return out

    def revalidate(self, envs: Sequence[int]) -> dict[str, torch.Tensor]:
        val = self._each(lambda bank: bank.revalidate(range(bank.n)))
        rows = torch.tensor(list(envs), device=val["val_loss"].device)
        return {k: v[rows] for k, v in val.items()}

    def final(self) -> dict[str, torch.Tensor]:
        return self._each(lambda bank: bank.final())

    def host(self, i: int) -> Host:
        bank, j = self._bank(i)
        return bank.host(j)

    def loaders_of(self, i: int) -> Loaders:
        bank, j = self._bank(i)
        return bank.loaders_of(j)

    def host_params(self, i: int) -> int:
        bank, j = self._bank(i)
        return bank.host_params(j)

    def alphas(self, i: int) -> list[float]:
        bank, j = self._bank(i)
        return bank.alphas(j)

    def germinate(
        self, i: int, slot: int, blueprint: int, style: Style | int, epoch: int, *,
        grad_init: float | None = None,
    ) -> int:  # fmt: skip
        bank, j = self._bank(i)
        return bank.germinate(j, slot, blueprint, style, epoch, grad_init=grad_init)

    def prune(self, i: int, slot: int) -> None:
        bank, j = self._bank(i)
        bank.prune(j, slot)

    def set_slot(self, i: int, slot: int, *, alpha: float, stage: int) -> None:
        bank, j = self._bank(i)
        bank.set_slot(j, slot, alpha=alpha, stage=stage)

    def snapshot_state(self, i: int) -> dict[str, torch.Tensor]:
        bank, j = self._bank(i)
        return bank.snapshot_state(j)

    def rollback(self, i: int, snapshot: dict[str, torch.Tensor]) -> list[int]:
        bank, j = self._bank(i)
        return bank.rollback(j, snapshot)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def make_bank(
    cfg: HostSettings, task: HostSource, device: torch.device
) -> PerEnvHosts | BatchedHosts | ShardedHosts:
    """The hosts of a :class:`~esper.shell.env.vecenv.VecEnv`: env by env (``env.host_step per_env``, or
    where batching does not apply), one batch, or, on the CPU with ``env.workers > 1``, that many batches
    on as many threads."""
    if not cfg.batched:
        return PerEnvHosts(cfg, task, device)
    host_device = torch.device(cfg.devices[0] if cfg.devices else cfg.device)
    shards = min(cfg.workers, cfg.n_envs)
    if shards > 1 and host_device.type == "cpu":
        return ShardedHosts(cfg, task, device, shards)
    return BatchedHosts(cfg, task, device)


__all__ = ["BatchedHosts", "ShardedHosts", "make_bank"]
