"""One batch of episodes: every env runs ``max_epochs`` RL steps side by side.

The loop reads forward: :meth:`VecEnv.reset`, then per step the controller acts on the time step and
:meth:`VecEnv.step` applies the action and measures the next epoch (docs/design.md, the loop). Each
step keeps what it produced as data — the controller's output, the reward terms the step decided, the
measurement, the governor's panics, and a telemetry TensorDict — and at the end of the episode:

- :func:`esper.core.rewards.episode_rewards` computes every step's reward once, from the measurements
  stacked over the episode: the step's own terms, the OBJECTIVE reward ``Phi(m_{t+1}) - Phi(m_t)`` of
  the measurement that followed it (the last step's from the final hosts), and a governor rollback's
  penalty charged to the transition that led into the panic (the transitions are kept, so the learner
  sees it). Its ``total`` is the learner's reward: stored as ``("next", "raw_reward")``, logged as
  each epoch event's ``reward``, summed into each episode's ``return``;
- :func:`epoch_events` turns the stacked telemetry and those rewards into the ``epoch`` events (one
  host sync);
- for a learning controller the steps are stored as a TensorDict ``[n_envs, T]`` with the keys of
  docs/design.md (the contracts): ``observation`` is exactly what the policy saw (normalized
  observation + op-legality bits, finding S2), ``raw_observation`` feeds the normalizer, ``(head,
  action | action_log_prob | action_mask)`` per head, ``state_value``, ``is_init``, the pre-step
  recurrent state, and under ``next``: ``raw_reward``, ``done`` (True on the last step),
  ``truncated``/``terminated`` (the last step is truncated by the time limit, or terminal with
  ``lifecycle.terminal_at_limit``: then nothing follows the final host and GAE does not bootstrap
  there) and ``state_value``. The last step's ``("next", "state_value")`` is V of the post-action
  observation built from the post-step slot state with the post-action legality masks and the
  post-step recurrent state (finding H4).

The final measurement also reads the held-out test split for the episode summary: never seen by the
controller. Each summary also carries the FLOPs its episode spent (``train_flops``, ``validation_flops``,
``whatif_flops``: :attr:`VecEnv.flops`, counted by :mod:`esper.shell.host.flops`).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import torch
from tensordict import TensorDict

from esper.core.health import seed_grad_health
from esper.core.lifecycle import is_live
from esper.core.rewards import COMPONENTS, FLAGS, episode_rewards, objective
from esper.core.spec import HEADS, Op, Stage
from esper.shell.env.step import BLEND_SETTINGS, StepInput
from esper.shell.env.vecenv import VecEnv


class Controller(Protocol):
    """What acts in an env: ``learns`` (keep a rollout for a PPO update), ``begin`` (a new batch of
    episodes), ``seed_envs`` (the envs' host seeds, for a controller that samples per env), ``act``
    (``[E]`` TD with ``(head, "action")`` for every head; a learner adds log-probs, masks,
    ``state_value``, ``observation`` and the pre-step ``recurrent_state``), ``explain`` (a rule-based
    controller's reason per env for its last actions, else None) and ``bootstrap`` (V of the
    post-action observation, or None)."""

    learns: bool

    def begin(self, n_envs: int) -> None: ...

    def seed_envs(self, host_seeds: list[int]) -> None: ...

    def act(self, step: StepInput) -> TensorDict: ...

    def explain(self) -> list[str] | None: ...

    def bootstrap(self, step: StepInput) -> torch.Tensor | None: ...


@dataclass
class EpisodeResult:
    rollout: TensorDict | None
    episodes: list[dict] = field(default_factory=list)  # one summary per env
    epochs: list[dict] = field(default_factory=list)  # one "epoch" event payload per step
    lifecycle: list[dict] = field(default_factory=list)  # lifecycle events
    governor: list[dict] = field(default_factory=list)  # panics
    final: TensorDict | None = None  # the final hosts' val/test metrics [E]
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase, whole batch


#: The seed gradient health an ``epoch`` event carries per slot (:func:`esper.core.health.seed_grad_health`
#: of what host training measured, :data:`esper.shell.host.model.SEED_GRAD_KEYS`).
SEED_GRAD_FIELDS = ("seed_grad_norm", "seed_grad_vanishing", "seed_grad_exploding", "seed_grad_health")
#: Fields of an ``epoch`` event that hold one value per env, in env order.
PER_ENV_FIELDS = ("val_acc", "val_loss", "train_loss", "reward", "op", "slot", "blueprint", "stage", "alpha",
                  "contribution", "grad_ratio", *SEED_GRAD_FIELDS, *FLAGS, "reasons")  # fmt: skip


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


def epoch_events(
    telemetry: TensorDict, rewards: torch.Tensor, slot_names, blueprint_names, timings: list[dict],
    reasons: list[list[str] | None],
) -> list[dict]:  # fmt: skip
    """The ``epoch`` events of an episode from its telemetry ``[E, T]`` (``val_acc``, ``val_loss``,
    ``train_loss``, ``op``, ``slot``, ``blueprint``, the reward's ``hacking`` and ``ransomware`` flags,
    and per slot the post-step ``stage`` and ``alpha``, the measured ``contribution``, ``grad_ratio`` and
    :data:`SEED_GRAD_FIELDS`, and ``measured``, whether the slot held a seed when measured) and its
    rewards ``[E, T]``; ``timings`` and ``reasons`` are per step. A slot without a seed has no
    contribution or gradient figures (``None``). One host sync."""
    scalars = (
        torch.stack(
            [telemetry[k].float() for k in ("val_acc", "val_loss", "train_loss")]
            + [rewards.float()]
            + [telemetry[k].float() for k in ("op", "slot", "blueprint", *FLAGS)]
        )
        .transpose(1, 2)
        .tolist()
    )  # sync point: the episode's telemetry, once; [field][t][env]
    per_slot = torch.stack(
        [telemetry[k].float() for k in ("stage", "alpha", "contribution", "grad_ratio", "measured",
                                        *SEED_GRAD_FIELDS)]
    ).transpose(1, 2).tolist()  # fmt: skip
    seeded = lambda rows, live: [[v if on else None for v, on in zip(r, m)] for r, m in zip(rows, live)]
    events = []
    for t in range(rewards.shape[1]):
        live = per_slot[4][t]
        ev = {
            "epoch": t + 1,
            "val_acc": scalars[0][t],
            "val_loss": scalars[1][t],
            "train_loss": scalars[2][t],
            "reward": scalars[3][t],
            "op": [Op(int(o)).name for o in scalars[4][t]],
            "slot": [slot_names[int(s)] for s in scalars[5][t]],
            "blueprint": [blueprint_names[int(b)] for b in scalars[6][t]],
            **{flag: [bool(v) for v in scalars[7 + j][t]] for j, flag in enumerate(FLAGS)},
            "slot_names": list(slot_names),
            "stage": [[Stage(int(s)).name for s in row] for row in per_slot[0][t]],
            "alpha": per_slot[1][t],
            "contribution": seeded(per_slot[2][t], live),
            "grad_ratio": seeded(per_slot[3][t], live),
            **{k: seeded(per_slot[5 + j][t], live) for j, k in enumerate(SEED_GRAD_FIELDS)},
            "timings": timings[t],
        }
        if reasons[t] is not None:  # a rule-based controller explains each choice
            ev["reasons"] = list(reasons[t])
        events.append(ev)
    return events


class EpisodeRunner:
    def __init__(self, env: VecEnv, controller: Controller, *, on_epoch=None) -> None:
        self.env, self.controller = env, controller
        self.on_epoch = on_epoch  # progress callback, called once per step with {"epoch", "envs"}

    def run(self, update: int, *, host_seeds: list[int] | None = None) -> EpisodeResult:
        """One episode of every env: ``update`` numbers it (training host seeds derive from it unless
        ``host_seeds`` gives them, as evaluation does)."""
        env, ctl = self.env, self.controller
        T, E = env.lifecycle.max_epochs, env.n
        ts = env.reset(update, host_seeds=host_seeds)
        ctl.begin(E)
        ctl.seed_envs(env.host_seeds)
        steps, terms, measured, telemetry, panics, timings, reasons = [], [], [], [], [], [], []
        result = EpisodeResult(rollout=None)
        policy_seconds = 0.0
        for t in range(T):
            t0 = time.perf_counter()
            out = ctl.act(ts.obs)
            policy_seconds += time.perf_counter() - t0
            reasons.append(ctl.explain())
            # a controller may act on another device than the env's (a CPU script driving CUDA hosts)
            action = TensorDict({h: out[h, "action"].to(env.device) for h in HEADS}, batch_size=[E])
            tr = env.step(action)
            if ctl.learns:
                steps.append(out)
            terms.append(tr.reward_terms)
            measured.append(ts.measurement)
            panics.append([r is not None for r in ts.panics])
            timings.append(ts.timings)
            telemetry.append(self._telemetry(ts, action, tr))
            result.governor += [{"epoch": t + 1, "env": env.first_env + i, "reason": r}
                                for i, r in enumerate(ts.panics) if r is not None]  # fmt: skip
            result.lifecycle += [{"epoch": t + 1, "env": env.first_env + i, **e}
                                 for i, evs in enumerate(tr.lifecycle) for e in evs]  # fmt: skip
            if self.on_epoch is not None:
                self.on_epoch({"epoch": t + 1, "envs": E})
            ts = tr.next
        # ------------------------------------------------------------------ rewards, bootstrap, assembly
        result.final = ts.measurement
        t0 = time.perf_counter()
        boot = ctl.bootstrap(ts.obs)  # post-action masks (H4)
        policy_seconds += time.perf_counter() - t0
        panicked = torch.tensor(panics, dtype=torch.bool, device=env.device).T  # [E, T]
        finished = episode_rewards(
            torch.stack(terms, 1), torch.stack(measured, 1), result.final, panicked, cfg=env.reward_cfg,
            rollback_penalty=env.governor.cfg.penalty,
        )  # fmt: skip
        rewards = finished["total"]  # the learner's reward, [E, T]
        tele = torch.stack(telemetry, 1)  # [E, T]
        result.epochs = epoch_events(tele, rewards, env.slot_names, env.blueprint_names, timings, reasons)
        if ctl.learns:
            result.rollout = self._assemble(steps, rewards, boot)
        result.episodes = self._episode_summaries(finished, tele, result)
        result.timings = {**env.timings, "policy": policy_seconds}
        return result

    # ---------------------------------------------------------------------------------------- pieces
    @staticmethod
    def _telemetry(ts, action: TensorDict, tr) -> TensorDict:
        """What the epoch event shows of one step ``[E]``: the measurement it acted on (per slot the
        contribution and gradient ratio, and whether the slot held a seed then), the action, the
        reward's flags, and the slots right after it (stage, alpha ``[E, S]``), and the seeds' gradient
        health (:data:`SEED_GRAD_FIELDS`)."""
        m = ts.measurement
        live = is_live(ts.obs.slots["stage"])
        grads = m["slots"]
        health = seed_grad_health(grads["seed_grad_norm"], grads["seed_grad_vanishing"],
                                  grads["seed_grad_exploding"], live)  # fmt: skip
        return TensorDict(
            {**{k: m[k] for k in ("val_acc", "val_loss", "train_loss")},
             **{h: action[h] for h in ("op", "slot", "blueprint")},
             **{flag: tr.reward_terms[flag] for flag in FLAGS},
             "stage": tr.slots["stage"], "alpha": tr.slots["alpha"],
             "contribution": m["slots", "contribution"], "grad_ratio": m["slots", "grad_ratio"],
             "measured": live,
             **{f"seed_grad_{k}": health[k] for k in ("norm", "vanishing", "exploding", "health")}},
            batch_size=m.batch_size,
        )  # fmt: skip

    def _assemble(self, steps: list[TensorDict], rewards: torch.Tensor, boot: torch.Tensor) -> TensorDict:
        td = torch.stack(steps, dim=1)  # [E, T]
        E, T = td.batch_size
        device = rewards.device
        values = td["state_value"]
        done = torch.zeros(E, T, dtype=torch.bool, device=device)
        done[:, -1] = True
        # The time limit truncates (bootstrap from the post-action value) unless the task ends there.
        terminal = done if self.env.lifecycle.terminal_at_limit else torch.zeros_like(done)
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

    def _episode_summaries(self, rewards: TensorDict, telemetry, result) -> list[dict]:
        """One summary per env from :func:`esper.core.rewards.episode_rewards`' output ``[E, T]``
        (``return``: the sum of its ``total``, the learner's reward), the telemetry and the result."""
        env = self.env
        returns = rewards["total"].sum(1).tolist()
        comp_sums = {k: rewards[k].float().sum(1).tolist() for k in COMPONENTS}
        flagged = {k: rewards[k].sum(1).tolist() for k in FLAGS}  # steps whose reward raised each flag
        final_slots = env.slots
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
                "objective": objective(fin, env.reward_cfg, final=True),
                "live": live,
                "blueprint": final_slots["blueprint"],
                "best_val_acc": telemetry["val_acc"].amax(1),
            }.items()
        }  # sync point: the episode's final numbers, once
        grown = self._grown(final["live"], final["blueprint"])
        ops = [Counter(ev["op"][i] for ev in result.epochs) for i in range(env.n)]
        removed, germinations = [0] * env.n, [[] for _ in range(env.n)]
        for e in result.lifecycle:
            i = e["env"] - env.first_env
            removed[i] += e["kind"] == "removed"
            if e["kind"] == "germinated":
                keep = ("epoch", "slot", "blueprint", *BLEND_SETTINGS)
                germinations[i].append({k: e[k] for k in keep if k in e})
        return [
            {
                "env": env.first_env + i,  # the global index (a process may run a slice)
                "host_seed": env.host_seeds[i],
                "return": returns[i],
                "final_val_acc": final["val_acc"][i],
                "final_test_acc": final["test_acc"][i],
                "final_test_loss": final["test_loss"][i],
                "params_added": int(final["params_added"][i]),
                "host_params": int(final["host_params"][i]),
                "objective": final["objective"][i],
                "best_val_acc": final["best_val_acc"][i],
                "n_fossilized": n_fossil[i],
                "n_pruned": removed[i],
                "reward_components": {k: v[i] for k, v in comp_sums.items()},
                "reward_flags": {k: int(v[i]) for k, v in flagged.items()},
                "op_counts": dict(ops[i]),
                "grown": grown[i],
                "germinated_at": [g["epoch"] for g in germinations[i]],
                "germinations": germinations[i],
                # the FLOPs the episode spent, by kind (esper.shell.host.flops): training, validation, what-if
                **{f"{kind}_flops": n for kind, n in env.flops[i].items()},
            }
            for i in range(env.n)
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


__all__ = ["PER_ENV_FIELDS", "SEED_GRAD_FIELDS", "Controller", "EpisodeResult", "EpisodeRunner",
           "epoch_events", "merge_results"]  # fmt: skip
