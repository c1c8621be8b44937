"""The PPO learner's configuration (``--ppo.*``): the update's hyperparameters, the network's sizes and
initial biases, replay, and the parameter cap on what the learned controller may grow."""

from __future__ import annotations

from dataclasses import dataclass

from esper.core.spec import HEADS
from esper.shell.common.fields import check_fields, doc

#: The networks ``ppo.policy`` chooses between (:mod:`esper.shell.agent.policy`,
#: :mod:`esper.shell.agent.setpolicy`).
#: The PPO network (``--ppo.policy``).
PPO_POLICIES = ("flat", "set")


@dataclass(frozen=True, slots=True)
class PPOConfig:
    gamma: float = doc(
        0.995, "discount; also the potential-based shaping gamma (one value, finding C1)", ge=0, le=1
    )
    gae_lambda: float = doc(0.97, "GAE lambda", ge=0, le=1)
    clip_epsilon: float = doc(0.2, "surrogate ratio clip", gt=0)
    value_clip: float | None = doc(10.0, "bound on |V_new - V_anchor| in the value loss (none: off)", gt=0)
    value_coef: float = doc(0.5, "weight of the value loss (applied to 0.5 * squared error)", ge=0)
    value_coef_adapt: float = doc(
        0.0,
        "adaptive value coefficient (finding 000 MED-2): the target of the value head's gradient norm over "
        "the policy heads'; after each minibatch step the coefficient moves value_coef_adapt_rate of the "
        "way to the one that would have hit it (in log space), from value_coef and within value_coef / 10 "
        "and x 10 (esper.core.health.adapt_value_coef). 0: off, value_coef fixed",
        ge=0,
    )
    value_coef_adapt_rate: float = doc(
        0.1,
        "share of the log-distance to its target the adaptive value coefficient moves per step",
        gt=0,
        le=1,
    )
    entropy_coef: float = doc(0.05, "entropy bonus coefficient at the first update", ge=0)
    entropy_coef_end: float | None = doc(
        None, "entropy coefficient after annealing (none: no annealing)", ge=0
    )
    entropy_anneal_updates: int = doc(
        0, "updates over which the entropy coefficient moves linearly to its end", ge=0
    )
    head_entropy_weights: tuple[float, ...] = doc(
        (), "per-head entropy weights in HEADS order (empty: all 1)", ge=0
    )
    entropy_floor: tuple[float, ...] = doc(
        (),
        "a floor on each head's normalized entropy (finding 004 P-4): a head whose masked mean entropy "
        "is below it gets entropy_floor_coef x (floor - entropy) more bonus, not annealed "
        "(esper.core.ppo_loss's loss_entropy_floor). Empty: off; one value: every head; 8: per head in "
        "HEADS order",
        ge=0,
        le=1,
    )
    entropy_floor_coef: float = doc(0.1, "weight of the entropy floor's hinge (ppo.entropy_floor)", ge=0)
    lr: float = doc(3e-4, "AdamW learning rate (at the first update, when annealed)", gt=0)
    lr_end: float | None = doc(None, "AdamW learning rate after annealing (none: constant)", ge=0)
    lr_anneal_updates: int = doc(0, "updates over which the learning rate moves linearly to lr_end", ge=0)
    adam_eps: float = doc(1e-5, "AdamW epsilon", gt=0)
    critic_weight_decay: float = doc(0.0, "weight decay on the value head only", ge=0)
    max_grad_norm: float = doc(0.5, "global gradient-norm clip", gt=0)
    clip_per_group: float = doc(
        0.0,
        "per-group gradient clip (findings M19, 000 MED-1): each parameter group the gradient health "
        "reports (trunk, the eight heads, value) is scaled to this norm at most, then the global "
        "max_grad_norm clip applies (0: off, the global clip alone)",
        ge=0,
    )
    n_epochs: int = doc(4, "passes over each batch", ge=1)
    n_minibatches: int = doc(
        2, "minibatches per pass; each holds whole env sequences (must divide n_envs)", ge=1
    )
    target_kl: float | None = doc(
        0.015, "stop the update when kl_approx > 1.5 * target_kl (none: never)", gt=0
    )
    normalize_advantage: bool = doc(True, "normalize advantages over the batch")
    obs_clip: float = doc(10.0, "clip of normalized observations", gt=0)
    reward_clip: float = doc(10.0, "clip of scaled rewards", gt=0)
    obs_momentum: float | None = doc(
        None, "EMA momentum of observation statistics (none: exact Welford)", ge=0, le=1
    )
    policy: str = doc(
        "set",
        "the network: set (the default: no shape depends on the host: slots encoded with shared weights, "
        "blueprints by descriptors any family states, pointer heads; acts on hosts with any slots and "
        "blueprint catalogue) | flat (input and slot and blueprint heads sized by the host it trains on; "
        "the default before ba27988, docs/experiment-log.md)",
    )
    hidden: int = doc(128, "LSTM / trunk width", ge=1)
    head_hidden: int = doc(
        64, "hidden width of each head (and of the set policy's slot and blueprint encodings)", ge=1
    )
    wait_bias: float = doc(0.0, "initial logit of WAIT above the other ops (0: uniform over the legal ops)")
    germinate_bias: float = doc(
        0.0,
        "initial logit of GERMINATE above the ops other than WAIT (equal to wait_bias: an untrained "
        "policy germinates as often as it waits where it can, and rarely prunes or re-targets)",
    )
    fossilize_bias: float = doc(
        0.0,
        "initial logit of FOSSILIZE above the ops that change a live seed (PRUNE, SET_ALPHA_TARGET, "
        "ADVANCE). The mask removes FOSSILIZE until a seed may be kept, so this is a start preference for "
        "keeping a seed once it may be kept (0: none; at wait_bias, as likely as WAIT there)",
    )
    blend_bias: float = doc(
        0.0,
        "initial logit of the fixed schedules' blend (style LINEAR_ADD, tempo FAST, alpha target 1.0) "
        "above each blend head's other choices (0: uniform)",
    )
    fixed_blend: bool = doc(
        False,
        "the learned controller's blend heads offer only the fixed schedules' blend (style LINEAR_ADD, tempo "
        "FAST, alpha target 1.0; esper.core.masks.fixed_blend), and SET_ALPHA_TARGET is not offered (its one "
        "target would be the alpha the seed holds): it decides what, where and when to grow, and blends as "
        "the fixed plans do",
    )
    slot_bias: bool = doc(
        False,
        "a learned logit bias per slot for the heads after the slot head (blueprint, blend): what to "
        "grow where gets a term per slot, not only the heads' shared output bias",
    )
    slot_order_bias: float = doc(
        0.0,
        "initial logit of each slot above the next one (slot s starts s x this below slot 0): an "
        "untrained policy acts on the first legal slot, growing b0 first, as the fixed schedules do "
        "(0: uniform over the legal slots)",
    )
    size_bias: float = doc(
        0.0,
        "a capacity prior: the blueprint head starts this x ln(parameters) logits on each blueprint (its "
        "germination cost, the log averaged over the slots), so an untrained policy grows a seed about in "
        "proportion to its size at 1 (0: uniform over the legal blueprints); the set policy adds a learned "
        "weight, starting here, times ln(cost) at the chosen slot",
        ge=0,
    )
    param_cap: float = doc(
        0.0,
        "a hard budget on the learned controller's seeds: it may germinate only where the env's seed "
        "parameters stay at most this many, counting each germination at its most (a gate included; "
        "esper.core.masks.within_param_cap). 0: no cap. Only the learned controller is capped; "
        "the baselines are not",
        ge=0,
    )
    param_cap_share: float = doc(
        0.0,
        "param_cap as a share of the seed parameters the host's grow_all adds (0.6: 60 % of growing "
        "everything), resolved on each step's host, so one setting reads the same on every task "
        "(esper.shell.env.tasks.grow_all_params). 0: param_cap as given; set, param_cap must be 0",
        ge=0,
    )
    replay: int = doc(
        0,
        "earlier batches each update re-uses (0: on-policy PPO). A replayed batch is re-scored at the "
        "update's start: rewards re-scaled with the current statistics, values and GAE from the current "
        "critic (its last step's bootstrap stays the rollout's), the surrogate clipped around the policy at "
        "the update's start and its advantage weighted by min(1, that policy's ratio to the one that "
        "acted): decoupled PPO (esper.core.decouple). Observation and reward statistics see each batch once",
        ge=0,
    )
    host_group: int = doc(
        1,
        "training envs run in groups of this many consecutive envs that share their host seeds (the "
        "host's init, its seeds' init and data order), and each env's advantage is taken relative to the "
        "other envs of its group at the same step (esper.core.group_relative: a leave-one-out baseline "
        "that takes out the host's luck). 1: every env its own host, no group baseline. Must divide "
        "env.n_envs and each process's share of it",
        ge=1,
    )
    grad_explode_factor: float = doc(
        10.0, "a parameter's pre-clip grad norm above this x max_grad_norm is 'exploding'", gt=0
    )
    max_bad_updates: int = doc(
        3,
        "stop the run after this many consecutive updates rolled back for a non-finite loss or gradient",
        ge=1,
    )

    def __post_init__(self) -> None:
        check_fields(self, "ppo")
        if self.policy not in PPO_POLICIES:
            raise ValueError(f"ppo.policy must be one of {', '.join(PPO_POLICIES)}, got {self.policy!r}")
        if self.policy == "set" and self.slot_bias:
            raise ValueError(
                "ppo.slot_bias is the flat policy's (a table per slot of one host); the set policy "
                "conditions the later heads on the chosen slot's encoding: drop --ppo.slot_bias"
            )
        if self.param_cap > 0 and self.param_cap_share > 0:
            raise ValueError(
                f"ppo.param_cap ({self.param_cap:g}) and ppo.param_cap_share ({self.param_cap_share:g}) both "
                "set; give the cap one way (set the other to 0)"
            )
        if len(self.entropy_floor) not in (0, 1, len(HEADS)):
            raise ValueError(
                f"ppo.entropy_floor needs 1 value (every head) or {len(HEADS)} ({', '.join(HEADS)}), "
                f"got {len(self.entropy_floor)}"
            )
        if self.entropy_floor and self.entropy_floor_coef == 0:
            raise ValueError(
                "ppo.entropy_floor is set with ppo.entropy_floor_coef 0: give the floor a weight > 0"
            )
        if self.value_coef_adapt > 0 and self.value_coef == 0:
            raise ValueError(
                "ppo.value_coef_adapt needs ppo.value_coef > 0 (its start and the centre of its range)"
            )
        if self.head_entropy_weights and len(self.head_entropy_weights) != len(HEADS):
            raise ValueError(
                f"ppo.head_entropy_weights needs {len(HEADS)} values ({', '.join(HEADS)}), "
                f"got {len(self.head_entropy_weights)}"
            )

    @property
    def has_param_cap(self) -> bool:
        """Whether the learned controller has a parameter cap (``param_cap`` or ``param_cap_share`` set;
        :func:`param_cap_on` says how many parameters on a host)."""
        return self.param_cap > 0 or self.param_cap_share > 0

    def entropy_floors(self) -> dict[str, float] | None:
        """``ppo.entropy_floor`` per head (None: off), as :func:`esper.core.ppo_loss` takes it."""
        if not self.entropy_floor:
            return None
        floors = self.entropy_floor * len(HEADS) if len(self.entropy_floor) == 1 else self.entropy_floor
        return dict(zip(HEADS, floors))

    def entropy_coef_at(self, update: int) -> float:
        return _anneal(self.entropy_coef, self.entropy_coef_end, self.entropy_anneal_updates, update)

    def lr_at(self, update: int) -> float:
        """The learning rate of update ``update`` (0-based): ``lr`` moving linearly to ``lr_end`` over
        ``lr_anneal_updates`` (the late updates of a short run take small steps, so a policy that has
        found what pays does not drift away from it on the noise of 8 episodes)."""
        return _anneal(self.lr, self.lr_end, self.lr_anneal_updates, update)


def param_cap_on(cap: float, share: float, grow_all_params: float) -> float:
    """The learned controller's cap in seed parameters on a host where ``grow_all`` adds
    ``grow_all_params``: ``share x grow_all_params`` where ``ppo.param_cap_share`` is set, else
    ``ppo.param_cap`` (0: no cap)."""
    if share <= 0:
        return cap
    if not grow_all_params > 0:
        raise ValueError(
            "ppo.param_cap_share needs the host's grow_all parameters (HostLayout.grow_all_params, from "
            f"VecEnv), got {grow_all_params}"
        )
    return share * float(grow_all_params)


def _anneal(start: float, end: float | None, updates: int, update: int) -> float:
    if end is None or updates == 0:
        return start
    frac = min(1.0, update / updates)
    return (1.0 - frac) * start + frac * end  # exactly ``end`` once annealed


__all__ = ["PPO_POLICIES", "PPOConfig", "param_cap_on"]
