"""The vectorized environment: ``n_envs`` hosts trained side by side, one RL step per host epoch.

:class:`VecEnv` owns the stateful half of every env — the host and its optimizers
(:class:`~esper.shell.host.model.EnvModel`), the data iterators, the AMP scaler, the CUDA stream and the
governor snapshots — and the tensorized slot state that :mod:`esper.core.lifecycle` evolves. One step:

1. :meth:`VecEnv.measure` trains every env for an epoch and validates it with every live seed's
   counterfactual, each env on its own CUDA stream (devices round-robin); the results are joined
   onto the policy device's current stream through per-env events (finding S1) and returned as the
   ``signals`` TensorDict ``[E]`` that the core consumes;
2. the governor reads the validation losses (one host sync) and rolls back any env that panicked;
3. after the policy acted and the core stepped the lifecycle, :meth:`VecEnv.apply` reads the
   lifecycle events once (one host sync) and builds or removes seed modules to match.

On CPU the same code runs without streams.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch
from tensordict import TensorDict

from esper.core.lifecycle import EVENT_KINDS as LIFECYCLE_EVENT_KINDS
from esper.core.lifecycle import LifecycleConfig, clear_seeds, init_slots
from esper.core.spec import ActionSpec, Stage, Style, Tempo
from esper.shell.data.tasks import Task
from esper.shell.env.config import EnvConfig, check_devices, lr_scale
from esper.shell.env.governor import Governor, GovernorConfig
from esper.shell.env.seeding import derive_seed, train_host_seeds
from esper.shell.env.streams import EnvStreams
from esper.shell.host.model import EnvModel

#: Lifecycle events that record how the seed will be blended: its style and tempo (chosen at germination,
#: kept after) and the alpha target the action chose.
BLEND_SETTING_EVENTS = frozenset({"germinated", "alpha_set"})
#: The blend settings a germination records (and episode summaries and evaluations count).
BLEND_SETTINGS = ("style", "tempo", "alpha_target")

def _uses_dropout(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules())


class VecEnv:
    def __init__(
        self,
        cfg: EnvConfig,
        lifecycle: LifecycleConfig,
        governor: GovernorConfig,
        *,
        seed: int,
        task: Task | None = None,
        first_env: int = 0,
    ) -> None:
        check_devices(cfg)
        self.cfg, self.lifecycle = cfg, lifecycle
        #: Global index of this VecEnv's first env (several processes may each run a slice).
        self.first_env = first_env
        self.host_seeds: list[int] = []
        self.task = task if task is not None else cfg.build_task()
        self.n = cfg.n_envs
        self.device = torch.device(cfg.device)
        names = cfg.devices or (cfg.device,)
        self.env_devices = [torch.device(names[i % len(names)]) for i in range(self.n)]
        self.streams = EnvStreams(self.env_devices)
        self.seed = seed
        probe = self.task.make_host()
        self.slot_names = probe.slot_names
        self.blueprint_names = probe.blueprint_names
        #: ``[S, n_blueprints]``: the most parameters each germination can add (a controller's cap).
        self.germination_cost = probe.germination_cost().to(self.device)
        self.spec = ActionSpec(
            n_slots=probe.n_slots,
            n_blueprints=len(probe.blueprint_names),
            masked_blueprints=tuple(i for i, b in enumerate(probe.blueprint_names) if b == "noop"),
        )
        bad = [s for s in cfg.slots if not 0 <= s < probe.n_slots]
        if bad:
            raise ValueError(
                f"env.slots {bad} out of range: the {self.task.name} host has slots 0..{probe.n_slots - 1}"
            )
        self.enabled = tuple((i in cfg.slots) if cfg.slots else True for i in range(probe.n_slots))
        self.random_guess_loss = float(torch.log(torch.tensor(float(self.task.n_classes))))
        self.governor = Governor(governor, self.n, self.random_guess_loss)
        self.models: list[EnvModel] = []
        self.loaders: list = []
        self.scalers: list = []
        self.seed_params = [[0] * self.spec.n_slots for _ in range(self.n)]
        self.slots: TensorDict = init_slots(self.n, self.enabled, device=self.device)
        self.epoch = 0
        self.timings: dict[str, float] = {}
        # Worker threads for CPU envs: only where training draws no random numbers from the global
        # generator (dropout would make the result depend on thread timing), so runs stay reproducible.
        concurrent = cfg.workers > 1 and all(d.type == "cpu" for d in self.env_devices)
        self._pool = (
            ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="esper-env")
            if concurrent and not _uses_dropout(probe)
            else None
        )

    # ----------------------------------------------------------------------------------------- episode
    def reset(self, episode: int, *, host_seeds: Sequence[int] | None = None) -> None:
        """Fresh hosts, optimizers, data order and slot state for a new batch of episodes. Env ``i``'s
        host is seeded with ``host_seeds[i]`` (default: :func:`train_host_seeds` of the run seed, the
        episode and the env's global index ``first_env + i``)."""
        if host_seeds is None:
            host_seeds = train_host_seeds(self.seed, episode, range(self.first_env, self.first_env + self.n))
        if len(host_seeds) != self.n:
            raise ValueError(f"VecEnv.reset: {len(host_seeds)} host seeds for {self.n} envs")
        self.host_seeds = list(host_seeds)
        self.models, self.loaders, self.scalers = [], [], []
        for i, dev in enumerate(self.env_devices):
            env_seed = int(host_seeds[i])
            torch.manual_seed(env_seed)  # host init and seed builds draw from the global RNG
            host = self.task.make_host().to(dev)
            self.models.append(
                EnvModel(
                    host,
                    host_lr=self.cfg.host_lr,
                    seed_lr=self.cfg.seed_lr,
                    momentum=self.cfg.momentum,
                    weight_decay=self.cfg.weight_decay,
                )
            )
            self.loaders.append(self.task.make_loaders(env_seed, device=dev))
            # H12: one scaler per env, only ever used inside that env's stream
            use_scaler = self.cfg.amp and dev.type == "cuda"
            self.scalers.append(torch.amp.GradScaler("cuda") if use_scaler else None)
            self.governor.reset(i)
            if self.governor.should_snapshot(0):
                self.governor.snapshot(i, self._snapshot_state(i))
        self.seed_params = [[0] * self.spec.n_slots for _ in range(self.n)]
        self.slots = init_slots(self.n, self.enabled, device=self.device)
        self.epoch = 0

    def host_params(self, i: int) -> int:
        return sum(p.numel() for p in self.models[i].host.host_parameters())

    # -------------------------------------------------------------------------------------------- step
    def measure(self) -> TensorDict:
        """Train every env one epoch, validate with counterfactuals; the ``signals`` TD ``[E]``."""
        self.epoch += 1
        t0 = time.perf_counter()
        scale = lr_scale(self.cfg.lr_schedule, self.epoch, self.lifecycle.max_epochs)
        for model in self.models:
            model.set_lr_scale(scale)
        train = self._each(lambda i: self.models[i].train_epoch(self.loaders[i].train, **self._amp(i)))
        t1 = time.perf_counter()
        val = self._each(lambda i: self.models[i].evaluate(self.loaders[i].val))
        t2 = time.perf_counter()
        self.timings = {"host_training": t1 - t0, "validation": t2 - t1}
        return self._gather(train, val)

    def finish(self) -> TensorDict:
        """Evaluate the final hosts (after the episode's last action): ``[E]`` TensorDict with
        ``val_loss``, ``val_acc`` and, on the held-out split, ``test_loss``, ``test_acc``, plus
        ``host_params`` and ``("slots", "seed_params") [E, S]`` (so :func:`esper.core.rewards.objective`
        reads it like a measurement). The test split is read here and nowhere else."""
        val = self._each(lambda i: self.models[i].validate(self.loaders[i].val))
        test = self._each(lambda i: self.models[i].validate(self.loaders[i].test))
        rows = [
            [p.float() for p in self.streams.join(i, [*val[i], *test[i]], self.device)] for i in range(self.n)
        ]
        col = lambda k: torch.stack([r[k] for r in rows])
        E, S = self.n, self.spec.n_slots
        return TensorDict(
            {
                "val_loss": col(0),
                "val_acc": col(1),
                "test_loss": col(2),
                "test_acc": col(3),
                "host_params": self._host_params_tensor(),
                "slots": TensorDict(self._seed_state(), batch_size=[E, S]),
            },
            batch_size=[E],
            device=self.device,
        )

    def _host_params_tensor(self) -> torch.Tensor:
        return torch.tensor([float(self.host_params(i)) for i in range(self.n)], device=self.device)

    def _seed_state(self) -> dict[str, torch.Tensor]:
        """``seed_params`` and ``alpha`` ``[E, S]`` of the seeds as the models hold them now (the alpha
        the last measurement used): what :func:`esper.core.rewards.objective` charges."""
        alpha = [[self.models[i].host.slot(s).alpha for s in range(self.spec.n_slots)] for i in range(self.n)]
        return {
            "seed_params": torch.tensor(self.seed_params, dtype=torch.float32, device=self.device),
            "alpha": torch.tensor(alpha, dtype=torch.float32, device=self.device),
        }

    def _gather(self, train: list[dict], val: list[tuple]) -> TensorDict:
        rows = []
        for i in range(self.n):
            tr, (vloss, vacc, contrib) = train[i], val[i]
            parts = [tr["loss"], tr["acc"], vloss, vacc, tr["grad_ratio"], contrib]
            # cast after the join: a cast is a read, and reads of env i's results wait on its event (S1)
            rows.append([p.float() for p in self.streams.join(i, parts, self.device)])
        col = lambda k: torch.stack([r[k] for r in rows])
        E, S = self.n, self.spec.n_slots
        return TensorDict(
            {
                "epoch": torch.full((E,), self.epoch, dtype=torch.int64, device=self.device),
                "train_loss": col(0),
                "train_acc": col(1),
                "val_loss": col(2),
                "val_acc": col(3),
                "host_params": self._host_params_tensor(),
                "slots": TensorDict(
                    {"grad_ratio": col(4), "contribution": col(5), **self._seed_state()}, batch_size=[E, S]
                ),
            },
            batch_size=[E],
            device=self.device,
        )

    def govern(self, signals: TensorDict) -> tuple[TensorDict, list[str | None]]:
        """Governor check on this epoch's validation losses (one host sync). Panicked envs are rolled
        back — weights restored from the env's snapshot, every seed that is not fossilized removed,
        host momentum cleared — and re-validated; others are snapshotted on the cadence. Returns the
        (patched) signals and the panic reason per env (None where healthy)."""
        losses = signals["val_loss"].tolist()  # sync point: the governor reads floats
        reasons = [self.governor.check(i, loss) for i, loss in enumerate(losses)]
        panicked = [i for i, r in enumerate(reasons) if r is not None]
        for i in panicked:
            self.rollback(i)
        if panicked:
            mask = torch.zeros(self.n, dtype=torch.bool, device=self.device)
            mask[panicked] = True
            self.slots = clear_seeds(self.slots, mask)
            val = []
            for i in panicked:
                with self.streams.run(i):
                    val.append(self.models[i].evaluate(self.loaders[i].val))
            for i, (vloss, vacc, contrib) in zip(panicked, val):
                vloss, vacc, contrib = (
                    t.float() for t in self.streams.join(i, [vloss, vacc, contrib], self.device)
                )
                signals["val_loss"][i] = vloss
                signals["val_acc"][i] = vacc
                signals["slots", "contribution"][i] = contrib
                signals["slots", "grad_ratio"][i] = 0.0
            seeds = self._seed_state()  # the rollback removed seeds: their parameters and alphas go
            for k in ("seed_params", "alpha"):
                signals["slots", k][panicked] = seeds[k][panicked]
        if self.governor.should_snapshot(self.epoch):
            for i in range(self.n):
                if reasons[i] is None:
                    self.governor.snapshot(i, self._snapshot_state(i))
        return signals, reasons

    def rollback(self, i: int) -> None:
        model = self.models[i]
        for s in range(self.spec.n_slots):
            slot = model.host.slot(s)
            if slot.occupied and slot.stage != Stage.FOSSILIZED:
                model.prune(s)
                self.seed_params[i][s] = 0
        snapshot, _ = self.governor.rollback(i)
        current = model.host.state_dict()
        model.host.load_state_dict({k: v for k, v in snapshot.items() if k in current}, strict=False)
        for opt in model.optimizers():
            opt.state.clear()

    def apply(self, slots: TensorDict, events: TensorDict) -> list[list[dict]]:
        """Make the models match the stepped slot state: remove pruned seeds, build germinated ones,
        push alpha and stage. One host sync. Returns per env the lifecycle events that happened."""
        packed = torch.stack(
            [events[k].double() for k in LIFECYCLE_EVENT_KINDS]
            + [slots[k].double() for k in ("stage", "blueprint", "style", "alpha", "tempo", "alpha_target")]
            + [self.slots["blueprint"].double()]
        ).tolist()  # sync point: the shell reads the lifecycle step once
        n_kinds = len(LIFECYCLE_EVENT_KINDS)
        stage, blueprint, style, alpha, tempo, alpha_target, old_blueprint = packed[n_kinds:]
        happened: list[list[dict]] = []
        for i, model in enumerate(self.models):
            env_events = []
            for s in range(self.spec.n_slots):
                fired = {k: bool(packed[j][i][s]) for j, k in enumerate(LIFECYCLE_EVENT_KINDS)}
                if fired["removed"]:
                    model.prune(s)
                    self.seed_params[i][s] = 0
                if fired["germinated"]:
                    with self.streams.run(i), self._seeded(i, s):
                        self.seed_params[i][s] = model.germinate(s, int(blueprint[i][s]), int(style[i][s]))
                model.host.set_slot(s, alpha=min(max(alpha[i][s], 0.0), 1.0), stage=int(stage[i][s]))
                for kind, on in fired.items():
                    if on:
                        event = {
                            "slot": s,
                            "kind": kind,
                            "stage": Stage(int(stage[i][s])).name,
                            "blueprint": self.blueprint_names[
                                int(old_blueprint[i][s] if kind != "germinated" else blueprint[i][s])
                            ],
                        }
                        if kind in BLEND_SETTING_EVENTS:  # how the seed will be blended, as chosen
                            event["style"] = Style(int(style[i][s])).name
                            event["alpha_target"] = round(alpha_target[i][s], 4)
                            if kind == "germinated":
                                event["tempo"] = Tempo(int(tempo[i][s])).name
                        env_events.append(event)
            happened.append(env_events)
        self.slots = slots
        return happened

    # --------------------------------------------------------------------------------------- helpers
    @contextmanager
    def _seeded(self, i: int, slot: int) -> Iterator[None]:
        """The global RNG seeded for a module built into env ``i``'s slot now (a seed, a gate), from the
        env's host seed, the epoch and the slot, and restored after: what is built does not depend on
        what the other envs drew before, so an env's episode is the same in any process's slice."""
        dev = self.env_devices[i]
        seed = derive_seed("build", self.host_seeds[i], self.epoch, slot)
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.default_generator.manual_seed(seed)
            if dev.type == "cuda":
                with torch.cuda.device(dev):
                    torch.cuda.manual_seed(seed)
            yield

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

    def close(self) -> None:
        """Stop the worker threads (if any); the env stays usable, one env after the other."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _amp(self, i: int) -> dict:
        if not self.cfg.amp:
            return {}
        dev = self.env_devices[i]
        return {
            "autocast_dtype": torch.float16 if dev.type == "cuda" else torch.bfloat16,
            "scaler": self.scalers[i],
        }

    def _snapshot_state(self, i: int) -> dict[str, torch.Tensor]:
        """The host and its fossilized seeds (what a rollback restores)."""
        host = self.models[i].host
        keep_slots = {
            f"slots.{s}." for s in range(self.spec.n_slots) if host.slot(s).stage == Stage.FOSSILIZED
        }
        return {
            k: v
            for k, v in host.state_dict().items()
            if not k.startswith("slots.") or any(k.startswith(p) for p in keep_slots)
        }


__all__ = ["BLEND_SETTINGS", "BLEND_SETTING_EVENTS", "VecEnv"]
