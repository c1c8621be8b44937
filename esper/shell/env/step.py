"""The records of one env step, what :class:`~esper.shell.env.vecenv.VecEnv` hands its controller and its
rollout: :class:`StepInput` (what a controller may look at), :class:`TimeStep` (one measurement and the
observation built from it) and :class:`Transition` (one step's outcome). Controllers and baselines import
these, not the env that makes them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tensordict import TensorDict

from esper.shell.host.descriptors import HostLayout

#: Lifecycle events that record how the seed will be blended: its style and tempo (chosen at germination,
#: kept after) and the alpha target the action chose.
BLEND_SETTING_EVENTS = frozenset({"germinated", "alpha_set"})
#: The blend settings a germination records (and episode summaries and evaluations count).
BLEND_SETTINGS = ("style", "tempo", "alpha_target")


@dataclass
class StepInput:
    """What a controller may look at when it acts."""

    raw_obs: torch.Tensor  # [E, obs_dim]
    legal: TensorDict  # legal_masks(...) [E]
    slots: TensorDict  # [E, S]
    signals: TensorDict  # [E]
    history: TensorDict  # [E]
    #: The host's shape-free description (slots, blueprint descriptors, germination costs): what the
    #: host-agnostic policy reads besides the observation (None: a controller that needs none).
    host: HostLayout | None = None


@dataclass
class TimeStep:
    """One measurement and the observation built from it.

    ``measurement``: the epoch's signals ``[E]`` after the governor (a rolled-back env re-validated),
    or, after the last action, the final hosts' (:meth:`VecEnv.step`: ``val_*``, ``test_*``,
    ``host_params`` and the seeds' ``seed_params``/``alpha``). ``obs``: what the controller acts on
    next; after the last action the post-action observation a learner bootstraps from (finding H4).
    ``panics``: the governor's reason per env, None where healthy."""

    obs: StepInput
    measurement: TensorDict
    panics: list[str | None]
    last: bool = False
    #: Seconds of the measurement's phases (``host_training``, ``validation``).
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class Transition:
    """What :meth:`VecEnv.step` returns: the step's own reward terms ``[E]``
    (:func:`esper.core.rewards.compute_reward`: components, their sum ``step_total`` and the telemetry
    flags; not yet the learner's reward, which :func:`esper.core.rewards.episode_rewards` makes of them
    at the end of the episode, adding the OBJECTIVE term and the rollback charge that only the next
    measurement decides), the slot state right after the action ``[E, S]``, per env the lifecycle events
    that happened, and the next time step (``last`` after the episode's final epoch)."""

    reward_terms: TensorDict
    slots: TensorDict
    lifecycle: list[list[dict]]
    next: TimeStep


__all__ = ["BLEND_SETTINGS", "BLEND_SETTING_EVENTS", "StepInput", "TimeStep", "Transition"]
