"""Esper's functional core: pure functions over TensorDicts, each compiling with
``torch.compile(fullgraph=True)``. Single-head inputs use TorchRL's key names, so another RL stack can
call ``esper.core.gae(td, ...)`` and ``esper.core.ppo_loss(td)`` directly."""

from esper.core.advantage import gae, gae_tensors, group_relative, normalize_advantage
from esper.core.distributions import (
    k3_kl,
    log_prob,
    masked_categorical,
    normalized_entropy,
    sample,
)
from esper.core.health import GradHealthConfig, grad_health, lstm_health, seed_grad_health
from esper.core.lifecycle import (
    LifecycleConfig,
    alpha_at,
    clear_seeds,
    gate_readiness,
    init_slots,
    lifecycle_step,
    record_signals,
)
from esper.core.loss import decouple, loss_counts, ppo_loss, total_loss
from esper.core.masks import (
    action_masks,
    head_relevance,
    legal_masks,
    op_slot_legality,
    slot_mask,
    within_param_cap,
)
from esper.core.minibatch import env_minibatches
from esper.core.normalize import (
    batch_stats,
    merge_running_stats,
    normalize,
    running_stats,
    scale,
    update_running_stats,
)
from esper.core.observation import init_history, obs_dim, observe, update_history
from esper.core.offline import bc_loss, expectile_td_losses, iql_losses
from esper.core.rewards import (
    RewardConfig,
    RewardFamily,
    RewardMode,
    compute_reward,
    episode_rewards,
    objective,
    objective_delta,
)
from esper.core.spec import HEADS, KEYS, ActionSpec, Keys, Op, Stage

__all__ = [
    "HEADS",
    "KEYS",
    "ActionSpec",
    "GradHealthConfig",
    "Keys",
    "LifecycleConfig",
    "Op",
    "RewardConfig",
    "RewardFamily",
    "RewardMode",
    "Stage",
    "action_masks",
    "alpha_at",
    "batch_stats",
    "bc_loss",
    "clear_seeds",
    "compute_reward",
    "decouple",
    "env_minibatches",
    "episode_rewards",
    "expectile_td_losses",
    "gae",
    "gae_tensors",
    "gate_readiness",
    "grad_health",
    "group_relative",
    "head_relevance",
    "init_history",
    "init_slots",
    "iql_losses",
    "k3_kl",
    "legal_masks",
    "lifecycle_step",
    "log_prob",
    "loss_counts",
    "lstm_health",
    "masked_categorical",
    "merge_running_stats",
    "normalize",
    "normalize_advantage",
    "normalized_entropy",
    "objective",
    "objective_delta",
    "obs_dim",
    "observe",
    "op_slot_legality",
    "ppo_loss",
    "record_signals",
    "running_stats",
    "sample",
    "scale",
    "seed_grad_health",
    "slot_mask",
    "total_loss",
    "update_history",
    "update_running_stats",
    "within_param_cap",
]
