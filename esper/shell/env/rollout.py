"""One batch of episodes: every env runs ``max_epochs`` RL steps side by side.

Per step (docs/design.md, the loop): train + validate + counterfactual (:meth:`VecEnv.measure`), governor
check and rollback, then the pure core — record the signals into the slot state, update the signal
history, build the observation and the legality masks — one batched controller forward, the core's
lifecycle step and reward, and :meth:`VecEnv.apply` to make the models match.

For a learning controller the steps are stored as a TensorDict ``[n_envs, T]`` with the keys of
docs/design.md (the contracts): ``observation`` is exactly what the policy saw (normalized observation
+ op-legality bits, finding S2), ``raw_observation`` feeds the normalizer, ``(head, action | action_log_prob |
action_mask)`` per head, ``state_value``, ``is_init``, the pre-step recurrent state, and under
``next``: ``raw_reward``, ``done`` (True on the last step), ``truncated``/``terminated`` (the last
step is truncated by the time limit, or terminal with ``lifecycle.terminal_at_limit``: then nothing
follows the final host and GAE does not bootstrap there) and ``state_value``. The last step's
``("next", "state_value")`` is V of the post-action observation built from the post-step slot
state with the post-action legality masks and the post-step recurrent state (finding H4).

A governor rollback's penalty is added to the reward of the transition that led into the panic and
the transitions are kept, so the learner sees it.

In OBJECTIVE reward mode (the default) step t's reward is :func:`esper.core.rewards.objective_delta`
between this epoch's measurement and the next one; it is added to step t when the next measurement
arrives, and the last step's uses the evaluation of the final host (:meth:`VecEnv.finish`, which also
reads the held-out test split for the episode summary: never seen by the controller).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import torch
from tensordict import TensorDict

from esper.core.lifecycle import LifecycleConfig, gate_readiness, lifecycle_step, record_signals
from esper.core.masks import legal_masks
from esper.core.observation import init_history, observe, update_history
from esper.core.rewards import RewardConfig, RewardMode, compute_reward, objective, objective_delta
from esper.core.spec import HEADS, Op, Stage
from esper.shell.env.vecenv import BLEND_SETTINGS, VecEnv


@dataclass
class StepInput:
    """What a controller may look at when it acts."""

    raw_obs: torch.Tensor  # [E, obs_dim]
    legal: TensorDict  # legal_masks(...) [E]
    slots: TensorDict  # [E, S]
    signals: TensorDict  # [E]
    history: TensorDict  # [E]


class Controller(Protocol):
    learns: bool

    def begin(self, n_envs: int) -> None: ...

    def act(self, step: StepInput) -> TensorDict:
        """``[E]`` TD with ``(head, "action")`` for every head (a learner adds log-probs, masks,
        ``state_value``, ``observation`` and the pre-step ``recurrent_state``)."""
        ...

    def bootstrap(self, step: StepInput) -> torch.Tensor | None: ...


@dataclass
class EpisodeResult:
    rollout: TensorDict | None
    episodes: list[dict] = field(default_factory=list)  # one summary per env
    epochs: list[dict] = field(default_factory=list)  # one "epoch" event payload per step
    lifecycle: list[dict] = field(default_factory=list)  # lifecycle events
    governor: list[dict] = field(default_factory=list)  # panics
    final: TensorDict | None = None  # VecEnv.finish(): the final hosts' val/test metrics [E]
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase, whole batch


#: Fields of an ``epoch`` event that hold one value per env, in env order.
PER_ENV_FIELDS = ("val_acc", "val_loss", "train_loss", "reward", "op", "slot", "blueprint", "stage", "alpha",
                  "reasons")  # fmt: skip


def merge_results(parts: list[EpisodeResult]) -> EpisodeResult:
    """One result of the whole batch from those of processes that each ran a slice of the envs, in
    global env order (``parts`` in rank order; the per-env events already carry global env indices):
    every ``epoch`` event's per-env lists are joined, episode, lifecycle and governor events are
    concatenated, and each phase's time is the slowest process's. ``rollout`` is the first part's."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    epochs = []
    for events in zip(*(p.epochs for p in parts)):
        merged = dict(events[0])
        for key in PER_ENV_FIELDS:
            if key in merged:
                merged[key] = [v for ev in events for v in ev[key]]
        epochs.append(merged)
    timings = {k: max(p.timings.get(k, 0.0) for p in parts) for k in first.timings}
    return EpisodeResult(
        rollout=first.rollout,
        episodes=[e for p in parts for e in p.episodes],
        epochs=epochs,
        lifecycle=[e for p in parts for e in p.lifecycle],
        governor=[e for p in parts for e in p.governor],
        timings=timings,
    )


class EpisodeRunner:
    def __init__(
        self,
        env: VecEnv,
        controller: Controller,
        *,
        lifecycle: LifecycleConfig,
        reward: RewardConfig,
        gamma: float,
        on_epoch=None,
    ) -> None:
        self.env, self.controller = env, controller
        self.lifecycle, self.reward_cfg, self.gamma = lifecycle, reward, gamma
        self.on_epoch = on_epoch  # progress callback, called once per step

    def _observe(self, signals: TensorDict, history: TensorDict, slots: TensorDict):
        env = self.env
        raw_obs = observe(
            signals,
            history,
            slots,
            max_epochs=self.lifecycle.max_epochs,
            n_blueprints=env.spec.n_blueprints,
            lifecycle_cfg=self.lifecycle,
        )
        lc = self.lifecycle
        gates = gate_readiness(slots, signals["val_acc"], lc) if lc.gate_masks else None
        legal = legal_masks(
            slots, env.spec, max_seeds=lc.max_seeds, min_prune_age=lc.min_prune_age, gates=gates,
            auto_advance=lc.auto_advance, prune_below=lc.prune_floor,
        )  # fmt: skip
        return raw_obs, legal

    def run(self, update: int, *, host_seeds: list[int] | None = None) -> EpisodeResult:
        """One episode of every env: ``update`` numbers it (training host seeds derive from it unless
        ``host_seeds`` gives them, as evaluation does)."""
        env, ctl, lc = self.env, self.controller, self.lifecycle
        T, E = lc.max_epochs, env.n
        by_objective = self.reward_cfg.mode is RewardMode.OBJECTIVE
        env.reset(update, host_seeds=host_seeds)
        ctl.begin(E)
        if hasattr(ctl, "seed_envs"):  # a controller that samples per env seeds from the host seeds
            ctl.seed_envs(env.host_seeds)
        history = init_history(E, device=env.device)
        result = EpisodeResult(rollout=None)
        timings: Counter = Counter()
        steps: list[TensorDict] = []
        rewards: list[torch.Tensor] = []
        components: list[TensorDict] = []
        op_counts = [Counter() for _ in range(E)]
        prev: TensorDict | None = None  # the previous measurement (OBJECTIVE reward)
        best_acc = [0.0] * E
        removed = [0] * E
        for t in range(T):
            signals = env.measure()
            timings.update(env.timings)
            t0 = time.perf_counter()
            signals, reasons = env.govern(signals)
            step_penalty = torch.zeros(E, device=env.device)
            for i, reason in enumerate(reasons):
                if reason is None:
                    continue
                result.governor.append({"epoch": t + 1, "env": env.first_env + i, "reason": reason})
                if rewards:  # charge the transition that led into the panic
                    rewards[-1][i] -= env.governor.cfg.penalty
                else:  # a panic on the first epoch: charge this step
                    step_penalty[i] -= env.governor.cfg.penalty
            if by_objective and prev is not None:  # the previous step's reward: what its action led to
                self._add_objective(rewards, components, objective_delta(prev, signals, self.reward_cfg))
            prev = signals
            slots = record_signals(env.slots, signals, lc)
            history = update_history(history, signals)
            raw_obs, legal = self._observe(signals, history, slots)
            t1 = time.perf_counter()
            out = ctl.act(StepInput(raw_obs, legal, slots, signals, history))
            t2 = time.perf_counter()
            # a controller may act on another device than the env's (a CPU script driving CUDA hosts)
            action = TensorDict({h: out[h, "action"].to(env.device) for h in HEADS}, batch_size=[E])
            new_slots, events = lifecycle_step(slots, action, signals, lc, n_blueprints=env.spec.n_blueprints)
            reward = compute_reward(
                slots, action, new_slots, events, signals, history, gamma=self.gamma, cfg=self.reward_cfg,
                max_epochs=T,
            )  # fmt: skip
            t3 = time.perf_counter()
            happened = env.apply(new_slots, events)
            t4 = time.perf_counter()
            total = reward["total"] + step_penalty
            rewards.append(total)
            components.append(reward.exclude("total"))
            if ctl.learns:
                steps.append(out)
            timings.update(
                {
                    "governor_and_observation": t1 - t0,
                    "policy": t2 - t1,
                    "lifecycle_reward": t3 - t2,
                    "apply": t4 - t3,
                }
            )
            result.epochs.append(self._epoch_event(t + 1, signals, action, total, new_slots))
            if hasattr(ctl, "last_reasons"):  # a rule-based controller explains each choice
                result.epochs[-1]["reasons"] = list(ctl.last_reasons)
            for i, evs in enumerate(happened):
                removed[i] += sum(e["kind"] == "removed" for e in evs)
                for e in evs:
                    result.lifecycle.append({"epoch": t + 1, "env": env.first_env + i, **e})
            for i, op in enumerate(result.epochs[-1]["op"]):
                op_counts[i][op] += 1
            best_acc = [max(b, a) for b, a in zip(best_acc, result.epochs[-1]["val_acc"])]
            if self.on_epoch is not None:
                self.on_epoch(result.epochs[-1])
            last = (signals, history, new_slots)
        # ------------------------------------------------------------------ bootstrap and assembly
        signals, history, final_slots = last
        t0 = time.perf_counter()
        result.final = env.finish()
        timings["final_evaluation"] += time.perf_counter() - t0
        if by_objective:
            delta = objective_delta(prev, result.final, self.reward_cfg, final=True)
            self._add_objective(rewards, components, delta)
        t0 = time.perf_counter()
        raw_obs, legal = self._observe(signals, history, final_slots)  # post-action masks (H4)
        boot = ctl.bootstrap(StepInput(raw_obs, legal, final_slots, signals, history))
        timings["policy"] += time.perf_counter() - t0
        reward_seq = torch.stack(rewards, dim=1)  # [E, T]
        comp_seq = torch.stack(components, dim=1)
        for ev, r in zip(result.epochs, reward_seq.T.tolist()):  # sync point: the rewards as paid, once
            ev["reward"] = r  # with the terms that arrived later (objective, governor penalty)
        if ctl.learns:
            result.rollout = self._assemble(steps, reward_seq, boot)
        result.episodes = self._episode_summaries(
            reward_seq, comp_seq, final_slots, result, op_counts, best_acc, removed
        )
        result.timings = dict(timings)
        return result

    # ---------------------------------------------------------------------------------------- pieces
    @staticmethod
    def _add_objective(rewards: list[torch.Tensor], components: list[TensorDict], delta: torch.Tensor):
        rewards[-1] = rewards[-1] + delta
        components[-1]["objective"] = components[-1]["objective"] + delta

    def _assemble(self, steps: list[TensorDict], rewards: torch.Tensor, boot: torch.Tensor) -> TensorDict:
        td = torch.stack(steps, dim=1)  # [E, T]
        E, T = td.batch_size
        device = rewards.device
        values = td["state_value"]
        done = torch.zeros(E, T, dtype=torch.bool, device=device)
        done[:, -1] = True
        # The time limit truncates (bootstrap from the post-action value) unless the task ends there.
        terminal = done if self.lifecycle.terminal_at_limit else torch.zeros_like(done)
        td["is_init"] = torch.zeros(E, T, dtype=torch.bool, device=device)
        td["is_init"][:, 0] = True
        td["next"] = TensorDict(
            {
                "raw_reward": rewards.float(),
                "done": done,
                "truncated": done & ~terminal,
                "terminated": terminal,
                "state_value": torch.cat([values[:, 1:], boot.reshape(E, 1).to(values.dtype)], dim=1),
            },
            batch_size=[E, T],
        )
        return td

    def _epoch_event(self, epoch, signals, action, reward, slots) -> dict:
        env = self.env
        host = torch.stack(
            [signals["val_acc"], signals["val_loss"], signals["train_loss"], reward.float()]
            + [action[h].float() for h in ("op", "slot", "blueprint")]
        ).tolist()  # sync point: one read per epoch for telemetry
        per_slot = torch.stack([slots["stage"].float(), slots["alpha"].float()]).tolist()
        return {
            "epoch": epoch,
            "val_acc": host[0],
            "val_loss": host[1],
            "train_loss": host[2],
            "reward": host[3],
            "op": [Op(int(o)).name for o in host[4]],
            "slot": [env.slot_names[int(s)] for s in host[5]],
            "blueprint": [env.blueprint_names[int(b)] for b in host[6]],
            "slot_names": list(env.slot_names),
            "stage": [[Stage(int(s)).name for s in row] for row in per_slot[0]],
            "alpha": per_slot[1],
            "timings": dict(env.timings),
        }

    def _episode_summaries(
        self, rewards, comps, final_slots, result, op_counts, best_acc, removed
    ) -> list[dict]:
        returns = rewards.sum(1).tolist()
        comp_sums = {k: v.float().sum(1).tolist() for k, v in comps.items() if v.is_floating_point()}
        n_fossil = (final_slots["stage"] == int(Stage.FOSSILIZED)).sum(-1).tolist()
        fin = result.final
        live = fin["slots", "alpha"] > 0  # seeds blended into the final host
        blended = torch.where(live, fin["slots", "seed_params"], 0.0)
        final = {
            k: v.tolist()
            for k, v in {
                "val_acc": fin["val_acc"],
                "test_acc": fin["test_acc"],
                "test_loss": fin["test_loss"],
                "params_added": blended.sum(-1),
                "host_params": fin["host_params"],
                "objective": objective(fin, self.reward_cfg, final=True),
                "live": live,
                "blueprint": final_slots["blueprint"],
            }.items()
        }  # sync point: the episode's final numbers, once
        grown = self._grown(final["live"], final["blueprint"])
        germinations: list[list[dict]] = [[] for _ in range(self.env.n)]
        for e in result.lifecycle:
            if e["kind"] == "germinated":
                germinations[e["env"] - self.env.first_env].append(
                    {k: e[k] for k in ("epoch", "slot", "blueprint", *BLEND_SETTINGS) if k in e}
                )
        return [
            {
                "env": self.env.first_env + i,  # the global index (a process may run a slice)
                "host_seed": self.env.host_seeds[i],
                "return": returns[i],
                "final_val_acc": final["val_acc"][i],
                "final_test_acc": final["test_acc"][i],
                "final_test_loss": final["test_loss"][i],
                "params_added": int(final["params_added"][i]),
                "host_params": int(final["host_params"][i]),
                "objective": final["objective"][i],
                "best_val_acc": best_acc[i],
                "n_fossilized": n_fossil[i],
                "n_pruned": removed[i],
                "reward_components": {k: v[i] for k, v in comp_sums.items()},
                "op_counts": dict(op_counts[i]),
                "grown": grown[i],
                "germinated_at": [g["epoch"] for g in germinations[i]],
                "germinations": germinations[i],
            }
            for i in range(self.env.n)
        ]

    def _grown(self, live: list[list[bool]], blueprint: list[list[int]]) -> list[str]:
        """Per env, the seeds blended into the final host ([env][slot] flags and blueprint indices) in
        the fixed placements' notation (``b0=conv_heavy+b2=depthwise``; ``""``: none), so a
        controller's hosts compare with a plan."""
        slots, names = self.env.slot_names, self.env.blueprint_names
        return [
            "+".join(f"{slots[s]}={names[int(b)]}" for s, (on, b) in enumerate(zip(lv, bp)) if on)
            for lv, bp in zip(live, blueprint)
        ]


__all__ = ["PER_ENV_FIELDS", "Controller", "EpisodeResult", "EpisodeRunner", "StepInput", "merge_results"]
