"""Tamiyo's network: a factored recurrent actor-critic.

Trunk: ``Linear(obs -> hidden) -> LayerNorm -> ReLU -> LSTM(hidden) -> LayerNorm``. One head per action
head (``Linear -> ReLU -> Linear``) and a value head. ``wait_bias`` sets the initial preference for WAIT
(a cautious start: random pruning and re-targeting would otherwise destroy most seeds before the policy
learns what a good one is worth), ``germinate_bias`` that for GERMINATE (with both equal, an untrained
policy grows early and is cautious with live seeds: seeds germinated early have time to pay, so the
policy sees what each blueprint and slot is worth from its first update). ``blend_bias`` starts the
style, tempo and alpha-target heads on the blend of the fixed growth schedules
(:data:`esper.core.spec.DEFAULT_BLEND`), and ``slot_order_bias`` starts the slot head on their order:
each slot ``slot_order_bias`` logits below the one before it, so an untrained policy acts on the first
legal slot (grows into ``b0`` first, then ``b1``), as the schedules do. The heads are sampled in order,
each reading what was sampled before it: the op head reads the trunk features; the slot head also reads
a learned embedding of the sampled op, so "which slot" can depend on "to do what" (the op is sampled
first and the slot mask is conditioned on it, :func:`esper.core.masks.action_masks`); every other head
reads embeddings of the sampled op *and* slot, so "which blueprint, how fast, how far" can depend on
"where" (a slot where a large seed pays and one where a small one does are both expressible; with the
blueprint independent of the slot they are not).

Two entry points, named for what they return:

- :meth:`act` — one step for all envs: sample every head under its legality mask, return the
  per-head action / log-prob / mask actually used, V(s) and the next recurrent state.
- :meth:`rescore` — whole ``[E, T]`` sequences from a stored initial state, re-scoring stored ops:
  per-head logits and V, ready to go under ``"current"`` for :func:`esper.core.ppo_loss`.

Masks are applied inside :mod:`esper.core.distributions` (upcast, most-negative-finite fill), so
fp16/bf16 logits stay NaN-free. An all-False mask row is a bug and raises here, before sampling.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import torch
from tensordict import TensorDict
from torch import nn

from esper.core import distributions as dist
from esper.core.masks import action_masks, blueprint_mask, slot_mask
from esper.core.spec import CHOICE_NAMES, DEFAULT_BLEND, HEADS, ActionSpec, Op

RecurrentState = tuple[torch.Tensor, torch.Tensor]


def _mlp(n_in: int, n_hidden: int, n_out: int, out_gain: float) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(n_in, n_hidden), nn.ReLU(), nn.Linear(n_hidden, n_out))
    nn.init.orthogonal_(net[0].weight, math.sqrt(2))
    nn.init.zeros_(net[0].bias)
    nn.init.orthogonal_(net[2].weight, out_gain)
    nn.init.zeros_(net[2].bias)
    return net


def recurrent_trunk(n_in: int, hidden: int) -> tuple[nn.Sequential, nn.LSTM, nn.LayerNorm]:
    """The trunk both policies share: an encoder (linear, layer norm, ReLU), a one-layer LSTM (orthogonal
    weights, forget-gate bias 1) and the layer norm after it."""
    encoder = nn.Sequential(nn.Linear(n_in, hidden), nn.LayerNorm(hidden), nn.ReLU())
    nn.init.orthogonal_(encoder[0].weight, math.sqrt(2))
    nn.init.zeros_(encoder[0].bias)
    lstm = nn.LSTM(hidden, hidden, batch_first=True)
    for name, p in lstm.named_parameters():
        if "weight" in name:
            nn.init.orthogonal_(p)
        else:
            nn.init.zeros_(p)
            p.data[hidden : 2 * hidden] = 1.0  # forget-gate bias
    return encoder, lstm, nn.LayerNorm(hidden)


@torch.no_grad()
def start_biases(heads: nn.ModuleDict, *, wait_bias: float, germinate_bias: float, blend_bias: float,
                 fossilize_bias: float) -> None:  # fmt: skip
    """The initial preferences both policies share. The heads' last layers start near zero (gain 0.01),
    so their biases are the initial logits: WAIT starts ``wait_bias`` logits above the ops that change a
    live seed (PRUNE, SET_ALPHA_TARGET, ADVANCE), GERMINATE ``germinate_bias``, FOSSILIZE
    ``fossilize_bias``, and each blend head ``blend_bias`` above its other choices on the fixed
    schedules' blend (DEFAULT_BLEND; 0: uniform). The biases start at zero, so a 0 leaves them as they
    were, bit for bit."""
    heads["op"][2].bias[int(Op.WAIT)] = float(wait_bias)
    heads["op"][2].bias[int(Op.GERMINATE)] = float(germinate_bias)
    heads["op"][2].bias[int(Op.FOSSILIZE)] = float(fossilize_bias)
    for head, choice in DEFAULT_BLEND.items():
        heads[head][2].bias[choice] = float(blend_bias)


def prior_choices(blend_bias: float) -> dict[str, tuple[int, str]]:
    """The choice each blend head starts favouring, as :func:`start_biases` sets it: ``{head: (index,
    name)}`` of the fixed schedules' blend when ``blend_bias`` is above 0, else none (the heads start
    uniform). The anomaly detector calls a collapse onto such a choice a commitment, not a fault."""
    if blend_bias <= 0:
        return {}
    return {head: (choice, CHOICE_NAMES[head][choice]) for head, choice in DEFAULT_BLEND.items()}


class FactoredRecurrentActorCritic(nn.Module):
    def __init__(
        self,
        obs_dim: int,
        spec: ActionSpec,
        *,
        hidden: int = 128,
        head_hidden: int = 64,
        op_embed: int = 16,
        slot_embed: int = 8,
        wait_bias: float = 0.0,
        germinate_bias: float = 0.0,
        blend_bias: float = 0.0,
        fossilize_bias: float = 0.0,
        slot_bias: bool = False,
        slot_order_bias: float = 0.0,
        blueprint_prior: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if obs_dim < 1 or hidden < 1 or head_hidden < 1:
            raise ValueError(
                f"obs_dim, hidden and head_hidden must be >= 1, got {obs_dim}, {hidden}, {head_hidden}"
            )
        self.obs_dim, self.spec, self.hidden = obs_dim, spec, hidden
        self.encoder, self.lstm, self.post_norm = recurrent_trunk(obs_dim, hidden)
        self.op_embedding = nn.Embedding(len(Op), op_embed)
        self.slot_embedding = nn.Embedding(spec.n_slots, slot_embed)
        sizes = spec.sizes
        width = {"op": hidden, "slot": hidden + op_embed}  # the others: + op and slot embeddings
        later = hidden + op_embed + slot_embed
        self.heads = nn.ModuleDict({h: _mlp(width.get(h, later), head_hidden, sizes[h], 0.01) for h in HEADS})
        self.value_head = _mlp(hidden, head_hidden, 1, 1.0)
        # slot_bias: each head after the slot head gets a learned logit bias per slot (zero at the start),
        # so "which blueprint here" has a term of its own for every slot. Without it the heads' output
        # bias, which moves fastest while the output weights are near zero, is one preference for all slots.
        self.slot_bias: nn.ModuleDict | None = None
        if slot_bias:
            self.slot_bias = nn.ModuleDict(
                {h: nn.Embedding(spec.n_slots, sizes[h]) for h in HEADS if h not in ("op", "slot")}
            )
            for table in self.slot_bias.values():
                nn.init.zeros_(table.weight)
        start_biases(self.heads, wait_bias=wait_bias, germinate_bias=germinate_bias, blend_bias=blend_bias,
                     fossilize_bias=fossilize_bias)  # fmt: skip
        with torch.no_grad():
            # Slot s starts s * slot_order_bias logits below slot 0 (0: uniform over the legal slots).
            order = torch.arange(spec.n_slots, dtype=self.heads["slot"][2].bias.dtype)
            self.heads["slot"][2].bias.sub_(float(slot_order_bias) * order)  # 0 leaves +0.0, bit for bit
            # The blueprint head starts on ``blueprint_prior`` ([n_blueprints] logits; None: uniform).
            if blueprint_prior is not None:
                prior = torch.as_tensor(blueprint_prior, dtype=torch.float32)
                if prior.shape != (spec.n_blueprints,) or not torch.isfinite(prior).all():
                    raise ValueError(
                        f"blueprint_prior must be {spec.n_blueprints} finite logits, got {prior.tolist()}"
                    )
                self.heads["blueprint"][2].bias.copy_(prior)

    # ------------------------------------------------------------------------------------ building blocks
    def initial_state(self, batch: int, device: torch.device | str | None = None) -> RecurrentState:
        """Zero ``(h, c)``, each ``[1, batch, hidden]``: the state at the start of an episode."""
        z = torch.zeros(1, batch, self.hidden, device=device)
        return z, z.clone()

    def features(self, obs: torch.Tensor, state: RecurrentState) -> tuple[torch.Tensor, RecurrentState]:
        """``obs [E, T, obs_dim]`` -> trunk features ``[E, T, hidden]`` and the state after step T."""
        if obs.dim() != 3 or obs.shape[-1] != self.obs_dim:
            raise ValueError(f"observation must be [E, T, {self.obs_dim}], got {list(obs.shape)}")
        x, new_state = self.lstm(self.encoder(obs), state)
        return self.post_norm(x), new_state

    def slot_logits(self, feats: torch.Tensor, op: torch.Tensor) -> torch.Tensor:
        """Logits of the slot head, conditioned on ``op`` (``feats.shape[:-1]``)."""
        return self.heads["slot"](torch.cat([feats, self.op_embedding(op)], dim=-1))

    def head_logits(
        self, feats: torch.Tensor, op: torch.Tensor, slot: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Logits of every head: op from ``feats``, slot conditioned on ``op``, the others on ``op``
        and ``slot`` (indices shaped ``feats.shape[:-1]``)."""
        return {
            "op": self.heads["op"](feats),
            "slot": self.slot_logits(feats, op),
            **self._later_logits(feats, op, slot),
        }

    def _later_logits(
        self, feats: torch.Tensor, op: torch.Tensor, slot: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Logits of the heads after the slot head, conditioned on ``op`` and ``slot``."""
        cond = torch.cat([feats, self.op_embedding(op), self.slot_embedding(slot)], dim=-1)
        logits = {h: self.heads[h](cond) for h in HEADS if h not in ("op", "slot")}
        if self.slot_bias is not None:
            logits = {h: x + self.slot_bias[h](slot) for h, x in logits.items()}
        return logits

    def value(self, feats: torch.Tensor) -> torch.Tensor:
        return self.value_head(feats).squeeze(-1)

    # ------------------------------------------------------------------------------------- entry points
    @torch.no_grad()
    def act(
        self,
        obs: torch.Tensor,
        state: RecurrentState,
        legal: TensorDict,
        *,
        generator: torch.Generator | list[torch.Generator] | None = None,
        deterministic: bool | Collection[str] = False,
    ) -> tuple[TensorDict, RecurrentState]:
        """One step for every env. ``obs [E, obs_dim]``; ``legal`` from
        :func:`esper.core.masks.legal_masks` (batch ``[E]``). Returns a TensorDict ``[E]`` with
        ``(head, action | action_log_prob | action_mask)`` per head and ``state_value``, and the new
        recurrent state. ``generator``: one for the batch, or one per env (each env's draws from its
        own, so an env's actions do not depend on which envs share its batch). ``deterministic``: True
        takes every head's most likely legal choice, a collection of head names only those heads' (the
        others are sampled). Raises if some env has no legal op (a lifecycle bug)."""
        mode = _mode_heads(deterministic)
        check_masks(legal["op"], "op")
        feats, new_state = self.features(obs.unsqueeze(1), state)
        feats = feats.squeeze(1)
        op_logits = self.heads["op"](feats)
        op = _sample(op_logits, legal["op"], generator, "op" in mode)
        slots_ok = slot_mask(legal, op)
        check_masks(slots_ok, "slot")
        slot_logits = self.slot_logits(feats, op)
        slot = _sample(slot_logits, slots_ok, generator, "slot" in mode)
        logits = {"op": op_logits, "slot": slot_logits, **self._later_logits(feats, op, slot)}
        # the blueprint before the masks: under a cap that counts gates, the style mask depends on it
        blueprint = _sample(logits["blueprint"], blueprint_mask(legal, slot), generator, "blueprint" in mode)
        used = action_masks(legal, op, slot, blueprint)
        sampled = {"op": op, "slot": slot, "blueprint": blueprint}
        out = TensorDict({}, batch_size=obs.shape[:1], device=obs.device)
        for head in HEADS:
            mask = used[head]
            if head not in sampled:
                sampled[head] = _sample(logits[head], mask, generator, head in mode)
            a = sampled[head]
            out[head] = TensorDict(
                {"action": a, "action_log_prob": dist.log_prob(logits[head], a, mask), "action_mask": mask},
                batch_size=obs.shape[:1],
            )
        out["state_value"] = self.value(feats)
        return out, new_state

    def rescore(
        self, obs: torch.Tensor, state: RecurrentState, op: torch.Tensor, slot: torch.Tensor
    ) -> TensorDict:
        """Re-score stored ``[E, T]`` sequences that start at ``state``: per-head logits ``[E, T, n]``
        (under ``(head, "logits")``) and ``state_value [E, T]``, with grad. ``op`` and ``slot``
        ``[E, T]`` are the stored actions the later heads are conditioned on."""
        feats, _ = self.features(obs, state)
        logits = self.head_logits(feats, op, slot)
        out = TensorDict(
            {h: TensorDict({"logits": logits[h]}, batch_size=op.shape) for h in HEADS}, batch_size=op.shape
        )
        out["state_value"] = self.value(feats)
        return out

    @torch.no_grad()
    def bootstrap_value(self, obs: torch.Tensor, state: RecurrentState) -> torch.Tensor:
        """V of the post-action observation ``obs [E, obs_dim]`` with the post-action state."""
        feats, _ = self.features(obs.unsqueeze(1), state)
        return self.value(feats.squeeze(1))


def _mode_heads(deterministic: bool | Collection[str]) -> frozenset[str]:
    """The heads that take their most likely choice: all for True, none for False, else the named ones."""
    if isinstance(deterministic, bool):
        return frozenset(HEADS) if deterministic else frozenset()
    if isinstance(deterministic, str):
        raise TypeError(f"deterministic: a bool or a collection of head names, not the str {deterministic!r}")
    heads = frozenset(deterministic)
    if unknown := sorted(heads - set(HEADS)):
        raise ValueError(f"deterministic: unknown head(s) {unknown}; heads: {', '.join(HEADS)}")
    return heads


def _sample(
    logits: torch.Tensor, mask: torch.Tensor, generator: torch.Generator | list | None, deterministic: bool
) -> torch.Tensor:
    if not isinstance(generator, list) or deterministic:
        return dist.sample(logits, mask, generator=generator, deterministic=deterministic)
    dtype = dist.compute_dtype(logits.dtype)
    n = logits.shape[-1]
    draw = lambda g: torch.empty(n, dtype=dtype, device=logits.device).exponential_(generator=g)
    race = torch.stack([draw(g) for g in generator])
    return dist.sample(logits, mask, race=race)


def check_masks(mask: torch.Tensor, head: str) -> None:
    """Raise if some row of a legality mask is all False (host sync: the shell's boundary check)."""
    empty = ~mask.any(-1)
    if bool(empty.any()):  # sync point: one read per head per step, only to fail loudly
        rows = empty.nonzero().flatten().tolist()
        raise RuntimeError(
            f"no legal choice for head {head!r} in env(s) {rows}: the lifecycle state allowed nothing, "
            "which is a bug (WAIT is always legal for op)"
        )


__all__ = ["FactoredRecurrentActorCritic", "RecurrentState", "check_masks"]
