"""The vectorized environment: ``n_envs`` hosts trained side by side, one RL step per host epoch.

:class:`VecEnv` owns the tensorized slot state that :mod:`esper.core.lifecycle` evolves, the signal
history, the governor, and a bank of hosts that trains and measures them: all envs as one batch
(:class:`~esper.shell.host.batched.BatchedHosts`; on the CPU with ``env.workers > 1``, that many batches
on as many threads, :class:`~esper.shell.host.batched.ShardedHosts`) or env by env
(:class:`~esper.shell.host.bank.PerEnvHosts`, the reference), by ``env.host_step``. Its interface is a
named step:

- :meth:`VecEnv.reset` builds fresh hosts, trains their first epoch and returns the first
  :class:`TimeStep`;
- :meth:`VecEnv.step` applies the controller's action — the core's lifecycle step, the reward terms
  that step decides (:func:`esper.core.rewards.compute_reward`), the seed modules built or removed to
  match (one host sync) — then trains the next epoch and returns its :class:`TimeStep`; after the last
  epoch's action it measures the final hosts instead (validation and the held-out test split).

A measurement trains every env for an epoch and validates it with every live seed's counterfactual;
the governor then reads the validation losses (one host sync) and rolls back any env that panicked.
The observation is built from it by the pure core: the signals recorded into the slot state, the
history updated, the observation vector and the legality masks.

Each env's FLOPs are counted as it goes (:attr:`VecEnv.flops`, by :mod:`esper.shell.host.flops`): every
measured epoch's training, what-if and validation passes, a rollback's revalidation and the final
validation, for the architecture each env's host had then.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Sequence

import torch
from tensordict import TensorDict

from esper.core.lifecycle import EVENT_KINDS as LIFECYCLE_EVENT_KINDS
from esper.core.lifecycle import (
    LifecycleConfig,
    clear_seeds,
    init_slots,
    lifecycle_step,
    record_signals,
)
from esper.core.observation import controller_inputs, init_history, layout_options, obs_dim, update_history
from esper.core.reward_config import with_loss_calibration, with_param_budget
from esper.core.rewards import RewardConfig, compute_reward
from esper.core.spec import DEFAULT_BLEND, ActionSpec, Stage, Style, Tempo
from esper.shell.common.seeding import derive_seed, member_train_host_seeds, train_host_seeds
from esper.shell.env.config import EnvConfig, check_devices, lr_scale
from esper.shell.env.governor import Governor, GovernorConfig
from esper.shell.env.step import BLEND_SETTING_EVENTS, BLEND_SETTINGS, StepInput, TimeStep, Transition
from esper.shell.env.tasks import Task, grow_all_params
from esper.shell.host.batched import make_bank
from esper.shell.host.descriptors import describe_host
from esper.shell.host.flops import FLOP_KINDS, SHARED
from esper.shell.host.gradinit import GRAD_GAIN_KEYS
from esper.shell.host.model import SEED_GRAD_KEYS
from esper.shell.host.slots import attach_seeds


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
        reward: RewardConfig | None = None,
        gamma: float = 0.99,
        host_group: int = 1,
    ) -> None:
        check_devices(cfg)
        self.cfg, self.lifecycle = cfg, lifecycle
        self.gamma = gamma
        #: Global index of this VecEnv's first env (several processes may each run a slice).
        self.first_env = first_env
        if first_env % host_group or cfg.n_envs % host_group:
            raise ValueError(
                f"ppo.host_group={host_group} must divide each process's envs: this one runs envs "
                f"{first_env}..{first_env + cfg.n_envs - 1} (a group of envs shares a host; none may span "
                "two processes)"
            )
        #: Consecutive envs that share their training hosts' seeds (``ppo.host_group``).
        self.host_group = host_group
        self.task = task if task is not None else cfg.build_task()
        self.n = cfg.n_envs
        self.device = torch.device(cfg.device)
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
        self._reward = reward or RewardConfig()
        #: The episode's budget as a share of what ``grow_all`` adds (``env.budget_shares``: drawn at each
        #: reset, :meth:`budget_share_of`); None without a budget input.
        self.budget_share: float | None = self.budget_share_of(0)
        self._describe(probe)
        #: Length of the raw observation (:func:`esper.core.observation.obs_dim` of this host and config).
        self.obs_dim = obs_dim(self.spec.n_slots, self.spec.n_blueprints, **layout_options(lifecycle))
        self.governor = Governor(governor, self.n, self.random_guess_loss)
        self.hosts = make_bank(cfg, self.task, self.device)
        self.seed_params = [[0] * self.spec.n_slots for _ in range(self.n)]
        self.slots: TensorDict = init_slots(self.n, self.enabled, device=self.device)
        self.history: TensorDict = init_history(self.n, device=self.device)
        self.epoch = 0
        #: Seconds per phase since the last reset (host training, validation, governor and observation,
        #: lifecycle and reward, apply, final evaluation).
        self.timings: Counter = Counter()
        self._last: TimeStep | None = None
        #: Per env, seeds every reset builds in before the first epoch (slot -> blueprint index), FOSSILIZED
        #: at alpha 1: part of the network from epoch 0, trained with the host (the ``born_big``
        #: baseline; None or an empty plan: none).
        self.born: Sequence[dict[int, int]] | None = None
        #: Measure every incubating seed's what-if gain even where G2 does not read it (``g2_evidence
        #: host``): for a controller that reads it (the ``probe`` baseline); validation only.
        self.measure_whatif = False
        #: Counts each pass's FLOPs once per architecture and batch shape (shared by every env's episodes).
        self.flop_counter = SHARED
        #: Per env, the FLOPs its episode has spent since the last reset, by kind
        #: (:data:`~esper.shell.host.flops.FLOP_KINDS`: ``train``, ``validation``, ``whatif``).
        self.flops: list[dict[str, int]] = [dict.fromkeys(FLOP_KINDS, 0) for _ in range(self.n)]

    def _describe(self, probe) -> None:
        """What the envs' host is, read off ``probe`` (a host of the task): its germination costs (above),
        what ``grow_all`` adds, the reward's budget and the shape-free description."""
        self.germination_cost = probe.germination_cost().to(self.device)
        #: The seed parameters ``grow_all`` adds here: the unit of the budgets stated as a share of it.
        self.grow_all_params = grow_all_params(self.task, probe, tuple(self.cfg.slots))
        reward, budget = self._reward, None
        if self.budget_share is not None:  # the episode's budget: the reward's and the controller's cap
            reward = dataclasses.replace(reward, param_budget=0.0, param_budget_share=self.budget_share)
            budget = self.budget_share * self.grow_all_params
        #: The reward's configuration, its budget in parameters of this task (``param_budget_share``, or
        #: the episode's drawn share) and the LOSS terminal calibrated to its chance loss (``loss_baseline``,
        #: ``loss_target``).
        self.reward_cfg = with_loss_calibration(with_param_budget(reward, self.grow_all_params),
                                                self.random_guess_loss)  # fmt: skip
        #: The host's shape-free description (:mod:`esper.shell.host.descriptors`), on every step; with a
        #: budget input, the episode's budget in it.
        self.layout = describe_host(probe, self.germination_cost, self.grow_all_params,
                                    budget_params=budget).to(self.device)  # fmt: skip
        self._probe = probe

    def budget_share_of(self, episode: int) -> float | None:
        """The budget share episode ``episode`` runs under: one of ``env.budget_shares``, drawn by the run
        seed and the episode (every process of a run draws the same), or None without a budget input."""
        shares = self.cfg.budget_shares
        if not shares:
            return None
        return float(shares[derive_seed("budget", self.seed, episode) % len(shares)])

    def _describe_family(self, host_seeds: Sequence[int]) -> None:
        """A task whose hosts differ by seed (a family, :attr:`Task.varies`): the batch's hosts must be one
        member, whose costs, budget and description replace the last batch's. One description stands for
        every env of a batch; a batch of different members would give some envs another host's, so it is
        refused. Training draws one member a batch (:func:`member_train_host_seeds`); evaluating on a family
        runs its hosts a batch each (``env.n_envs 1``) or grouped by member."""
        with torch.random.fork_rng(devices=[]):  # a host draws its init: leave the caller's stream
            members = {s: self.task.host_for(s) for s in dict.fromkeys(int(s) for s in host_seeds)}
        shapes = {repr(h) for h in members.values()}
        if len(shapes) > 1:
            raise ValueError(
                f"task {self.task.name!r}: its hosts differ by seed, and this batch holds {len(shapes)} "
                "different ones; one batch must be one host (one description for every env)"
            )
        probe = next(iter(members.values()))
        if (probe.slot_names, probe.blueprint_names) != (self.slot_names, self.blueprint_names):
            raise ValueError(
                f"task {self.task.name!r}: a member's slots or catalogue differ from the family's"
            )
        self._describe(probe)

    @property
    def host_seeds(self) -> list[int]:
        return self.hosts.host_seeds

    # ----------------------------------------------------------------------------------------- episode
    def reset(self, episode: int, *, host_seeds: Sequence[int] | None = None) -> TimeStep:
        """Fresh hosts, optimizers, data order, slot state and history for a new batch of episodes, and
        the first epoch's measurement. Env ``i``'s host is seeded with ``host_seeds[i]`` (default:
        :func:`train_host_seeds` of the run seed, the episode and the env's global index, shared by the
        envs of a ``host_group``; on a family, :func:`member_train_host_seeds`: one member a batch)."""
        if host_seeds is None:
            envs = range(self.first_env, self.first_env + self.n)
            if self.task.varies:  # a family: one member a batch (one description for every env)
                host_seeds = member_train_host_seeds(self.seed, episode, envs, self.task.describe_member,
                                                     group=self.host_group)  # fmt: skip
            else:
                host_seeds = train_host_seeds(self.seed, episode, envs, group=self.host_group)
        if len(host_seeds) != self.n:
            raise ValueError(f"VecEnv.reset: {len(host_seeds)} host seeds for {self.n} envs")
        drawn = self.budget_share_of(episode)
        redescribe = drawn != self.budget_share  # a new budget: the reward's and the layout's change
        self.budget_share = drawn
        if self.task.varies:
            self._describe_family(host_seeds)
        elif redescribe:
            self._describe(self._probe)
        self.hosts.reset(host_seeds)
        for i in range(self.n):  # the fresh hosts' seeds read the live activation from lifecycle.attach_at
            attach_seeds(self.hosts.host(i).slots, self.lifecycle.attach_at)
        self.seed_params = [[0] * self.spec.n_slots for _ in range(self.n)]
        self.slots = init_slots(self.n, self.enabled, device=self.device)
        if self.born:
            self._plant(self.born)
        for i in range(self.n):
            self.governor.reset(i)
            if self.governor.should_snapshot(0):
                self.governor.snapshot(i, self.hosts.snapshot_state(i))
        self.history = init_history(self.n, device=self.device)
        self.epoch = 0
        self.timings = Counter()
        self.flops = [dict.fromkeys(FLOP_KINDS, 0) for _ in range(self.n)]
        self._last = self._measure()
        return self._last

    def step(self, action: TensorDict) -> Transition:
        """Apply ``action`` ``[E]`` (int64 per head) to the current time step, then measure the next
        epoch (or, after the last, the final hosts)."""
        if self._last is None:
            raise RuntimeError("VecEnv.step before VecEnv.reset")
        t0 = time.perf_counter()
        obs, lc, T = self._last.obs, self.lifecycle, self.lifecycle.max_epochs
        slots, signals = obs.slots, obs.signals
        new_slots, events = lifecycle_step(slots, action, signals, lc, n_blueprints=self.spec.n_blueprints)
        terms = compute_reward(
            slots, action, new_slots, events, signals, self.history, gamma=self.gamma, cfg=self.reward_cfg,
            max_epochs=T,
        )  # fmt: skip
        t1 = time.perf_counter()
        happened = self._apply(new_slots, events)
        self.timings.update({"lifecycle_reward": t1 - t0, "apply": time.perf_counter() - t1})
        self._last = self._measure() if self.epoch < T else self._final(obs)
        return Transition(terms, new_slots, happened, self._last)

    def close(self) -> None:
        """Stop the host bank's worker threads (if any)."""
        self.hosts.close()

    # ------------------------------------------------------------------------------------ measurement
    def _measure(self) -> TimeStep:
        """Train every env one epoch, validate with counterfactuals, let the governor check it, and
        observe: the time step the controller acts on."""
        self.epoch += 1
        scale = lr_scale(self.cfg.lr_schedule, self.epoch, self.lifecycle.max_epochs)
        life = self.lifecycle
        whatif = life.g2_evidence != "host" or self.measure_whatif
        measured = self.hosts.measure(
            scale, whatif=whatif, whatif_statistics=life.whatif_statistics,
            grad_batches=life.grad_init_batches if life.grad_stats else 0,
        )  # fmt: skip
        self.timings.update(self.hosts.timings)
        self._count_flops(range(self.n), "epoch", whatif=whatif)
        t0 = time.perf_counter()
        E, S = self.n, self.spec.n_slots
        signals = TensorDict(
            {
                "epoch": torch.full((E,), self.epoch, dtype=torch.int64, device=self.device),
                **{k: measured[k] for k in ("train_loss", "train_acc", "val_loss", "val_acc")},
                "host_params": self._host_params_tensor(),
                "slots": TensorDict(
                    {
                        k: measured[k]
                        for k in ("contribution", "loss_contribution", "whatif_gain", *SEED_GRAD_KEYS)
                    }
                    | {k: measured[k] for k in self._gain_keys}
                    | self._seed_state(),
                    batch_size=[E, S],
                ),
            },
            batch_size=[E],
            device=self.device,
        )
        panics = self._govern(signals)
        self.slots = record_signals(self.slots, signals, self.lifecycle)
        self.history = update_history(self.history, signals)
        obs = self._observe(self.slots, signals)
        self.timings["governor_and_observation"] += time.perf_counter() - t0
        return TimeStep(obs, signals, panics, timings=dict(self.hosts.timings))

    def _final(self, obs: StepInput) -> TimeStep:
        """The final hosts (after the episode's last action): ``val_loss``, ``val_acc`` and, on the
        held-out split, ``test_loss``, ``test_acc``, plus ``host_params`` and ``("slots",
        "seed_params" | "alpha") [E, S]`` (so :func:`esper.core.rewards.objective` reads it like a
        measurement); the observation is the post-action one, built from the last epoch's signals and
        history (finding H4). The test split is read here and nowhere else."""
        t0 = time.perf_counter()
        E, S = self.n, self.spec.n_slots
        final = TensorDict(
            {**self.hosts.final(), "host_params": self._host_params_tensor(),
             "slots": TensorDict(self._seed_state(), batch_size=[E, S])},
            batch_size=[E], device=self.device,
        )  # fmt: skip
        self.timings["final_evaluation"] += time.perf_counter() - t0
        self._count_flops(range(self.n), "final")  # validation; the test split is the evaluation's
        post = self._observe(self.slots, obs.signals)
        return TimeStep(post, final, [None] * self.n, last=True)

    def _observe(self, slots: TensorDict, signals: TensorDict) -> StepInput:
        raw_obs, legal = controller_inputs(signals, self.history, slots, self.spec, self.lifecycle)
        return StepInput(raw_obs, legal, slots, signals, self.history, self.layout)

    def _govern(self, signals: TensorDict) -> list[str | None]:
        """Governor check on this epoch's validation losses (one host sync). Panicked envs are rolled
        back — weights restored from the env's snapshot, every seed that is not fossilized removed,
        momentum cleared — and re-validated, their signals patched in place; the others are
        snapshotted on the cadence. Returns the panic reason per env (None where healthy)."""
        losses = signals["val_loss"].tolist()  # sync point: the governor reads floats
        reasons = [self.governor.check(i, loss) for i, loss in enumerate(losses)]
        panicked = [i for i, r in enumerate(reasons) if r is not None]
        for i in panicked:
            snapshot, _ = self.governor.rollback(i)
            for s in self.hosts.rollback(i, snapshot):
                self.seed_params[i][s] = 0
        if panicked:
            mask = torch.zeros(self.n, dtype=torch.bool, device=self.device)
            mask[panicked] = True
            self.slots = clear_seeds(self.slots, mask)
            again = self.hosts.revalidate(panicked)
            self._count_flops(panicked, "revalidation")
            for k, i in enumerate(panicked):
                signals["val_loss"][i] = again["val_loss"][k]
                signals["val_acc"][i] = again["val_acc"][k]
                signals["slots", "contribution"][i] = again["contribution"][k]
                signals["slots", "loss_contribution"][i] = again["loss_contribution"][k]
                for key in SEED_GRAD_KEYS:  # the removed seeds' gradients are gone with them
                    signals["slots", key][i] = 0.0
                for key in self._gain_keys:  # measured on the host before the rollback
                    signals["slots", key][i] = 0.0
            seeds = self._seed_state()  # the rollback removed seeds: their parameters and alphas go
            for k in ("seed_params", "alpha"):
                signals["slots", k][panicked] = seeds[k][panicked]
        if self.governor.should_snapshot(self.epoch):
            for i in range(self.n):
                if reasons[i] is None:
                    self.governor.snapshot(i, self.hosts.snapshot_state(i))
        return reasons

    # ------------------------------------------------------------------------------------------ apply
    def _apply(self, slots: TensorDict, events: TensorDict) -> list[list[dict]]:
        """Make the hosts match the stepped slot state: remove pruned seeds, build germinated ones, push
        alpha and stage. One host sync. Returns per env the lifecycle events that happened."""
        packed = torch.stack(
            [events[k].double() for k in LIFECYCLE_EVENT_KINDS]
            + [slots[k].double() for k in ("stage", "blueprint", "style", "alpha", "tempo", "alpha_target")]
            + [self.slots["blueprint"].double()]
        ).tolist()  # sync point: the shell reads the lifecycle step once
        n_kinds = len(LIFECYCLE_EVENT_KINDS)
        stage, blueprint, style, alpha, tempo, alpha_target, old_blueprint = packed[n_kinds:]
        happened: list[list[dict]] = []
        for i in range(self.n):
            env_events = []
            for s in range(self.spec.n_slots):
                fired = {k: bool(packed[j][i][s]) for j, k in enumerate(LIFECYCLE_EVENT_KINDS)}
                if fired["removed"]:
                    self.hosts.prune(i, s)
                    self.seed_params[i][s] = 0
                if fired["germinated"]:
                    self.seed_params[i][s] = self.hosts.germinate(
                        i,
                        s,
                        int(blueprint[i][s]),
                        int(style[i][s]),
                        self.epoch,
                        grad_init=self.lifecycle.grad_init_scale if self.lifecycle.grad_init else None,
                    )
                self.hosts.set_slot(i, s, alpha=min(max(alpha[i][s], 0.0), 1.0), stage=int(stage[i][s]))
                for kind in (k for k, on in fired.items() if on):
                    bp = old_blueprint[i][s] if kind != "germinated" else blueprint[i][s]
                    event = {"slot": s, "kind": kind, "stage": Stage(int(stage[i][s])).name,
                             "blueprint": self.blueprint_names[int(bp)]}  # fmt: skip
                    if kind in BLEND_SETTING_EVENTS:  # how the seed will be blended, as chosen
                        event["style"] = Style(int(style[i][s])).name
                        event["alpha_target"] = round(alpha_target[i][s], 4)
                        if kind == "germinated":
                            event["tempo"] = Tempo(int(tempo[i][s])).name
                    env_events.append(event)
            happened.append(env_events)
        self.slots = slots
        return happened

    def _plant(self, born: Sequence[dict[int, int]]) -> None:
        """Build ``born``'s seeds (per env, slot -> blueprint) into the fresh hosts, FOSSILIZED at alpha 1
        with the default blend's style, and write them into the slot state as a seed fossilized at alpha 1
        (its ramp ended, no age): the lifecycle then treats each as any fossilized seed, and its module
        reads the host's live activation, so it trains with the host from the first epoch. Built as a
        germination at epoch 0 would be (its own generator seed)."""
        if len(born) != self.n:
            raise ValueError(f"VecEnv.born: {len(born)} plans for {self.n} envs")
        mask = torch.zeros(self.n, self.spec.n_slots, dtype=torch.bool)
        bps = torch.zeros(self.n, self.spec.n_slots, dtype=torch.int64)
        style = int(DEFAULT_BLEND["style"])
        for i, plan in enumerate(born):
            for s, bp in sorted(plan.items()):
                if not self.enabled[s]:
                    raise ValueError(f"VecEnv.born: slot {self.slot_names[s]} is not enabled (env.slots)")
                self.seed_params[i][s] = self.hosts.germinate(i, s, int(bp), style, 0)
                self.hosts.set_slot(i, s, alpha=1.0, stage=int(Stage.FOSSILIZED))
                mask[i, s], bps[i, s] = True, int(bp)
        mask, bps = mask.to(self.device), bps.to(self.device)
        fields = {k: self.slots[k].clone() for k in self.slots.keys()}
        for k in ("stage", "prev_stage"):
            fields[k] = torch.where(mask, int(Stage.FOSSILIZED), fields[k])
        fields["blueprint"] = torch.where(mask, bps, fields["blueprint"])
        fields["style"] = torch.where(mask, style, fields["style"])
        fields["tempo"] = torch.where(mask, int(DEFAULT_BLEND["tempo"]), fields["tempo"])
        for k in ("alpha", "alpha_target", "ramp_from", "ramp_to"):
            fields[k] = torch.where(mask, 1.0, fields[k])
        self.slots = TensorDict(fields, batch_size=self.slots.batch_size, device=self.device)

    # --------------------------------------------------------------------------------------- helpers
    def _count_flops(self, envs: Sequence[int], what: str, *, whatif: bool = False) -> None:
        """Add to each of ``envs``' :attr:`flops` what ``what`` spent on its host as it stands now:
        ``"epoch"`` a measured epoch (training, validation with the counterfactuals, with ``whatif`` the
        what-if readings), ``"revalidation"`` a rollback's validation with the counterfactuals, ``"final"``
        the final validation. Seconds in ``timings["flop_count"]``."""
        t0 = time.perf_counter()
        counter, statistics = self.flop_counter, self.lifecycle.whatif_statistics
        for i in envs:
            host, loaders = self.hosts.host(i), self.hosts.loaders_of(i)
            val = loaders.val.epoch_shapes()
            if what == "epoch":
                spent = counter.epoch(host, loaders.train.epoch_shapes(), val, whatif=whatif,
                                      whatif_statistics=statistics)  # fmt: skip
            else:
                spent = counter.validation(host, val, counterfactual=what == "revalidation")
            for kind, flops in spent.items():
                self.flops[i][kind] += flops
        self.timings["flop_count"] += time.perf_counter() - t0

    @property
    def _gain_keys(self) -> tuple[str, ...]:
        """The slot statistics' keys in the signals (``lifecycle.grad_init``, ``grad_gain_features``)."""
        return GRAD_GAIN_KEYS if self.lifecycle.grad_stats else ()

    def _host_params_tensor(self) -> torch.Tensor:
        return torch.tensor([float(self.hosts.host_params(i)) for i in range(self.n)], device=self.device)

    def _seed_state(self) -> dict[str, torch.Tensor]:
        """``seed_params`` and ``alpha`` ``[E, S]`` of the seeds as the hosts hold them now (the alpha
        the last measurement used): what :func:`esper.core.rewards.objective` charges."""
        alpha = [self.hosts.alphas(i) for i in range(self.n)]
        return {
            "seed_params": torch.tensor(self.seed_params, dtype=torch.float32, device=self.device),
            "alpha": torch.tensor(alpha, dtype=torch.float32, device=self.device),
        }


__all__ = ["BLEND_SETTINGS", "BLEND_SETTING_EVENTS", "StepInput", "TimeStep", "Transition", "VecEnv"]
