"""Tamiyo's host-agnostic network (``ppo.policy set``): no weight's shape depends on the host, so one
network acts on hosts with any number of slots and any blueprint catalogue, e.g. one it never trained on.

Its input is a TensorDict (:meth:`esper.shell.agent.agent.Agent.policy_input`, batch ``[*B]``):

- ``globals [*B, G + n_ops]``: the observation's global part (normalized with its own statistics) and
  one legality bit per op;
- ``slots [*B, S, F]``: each slot's features without the blueprint one-hot (normalized with statistics
  pooled over slots), its position and width (:data:`esper.shell.host.descriptors.SLOT_FEATURES`) and the
  descriptor of the blueprint it holds (zeros without a seed);
- ``enabled [*B, S]`` (bool): the slots the env may use;
- ``blueprints [*B, S, NB, D]``: every blueprint's descriptor where it would grow
  (:data:`esper.shell.host.descriptors.DESCRIPTOR_FEATURES`);
- ``log_cost [*B, S, NB]``: ``ln`` of each germination's cost (the capacity prior's term).

The network: one slot encoder with shared weights maps each slot's features to an encoding; their mean
and max over the enabled slots, with the global features, feed the trunk (``Linear -> LayerNorm -> ReLU
-> LSTM -> LayerNorm``, as the flat network's). The op and value heads read the trunk. The slot head is
a pointer: it scores each slot from the trunk, an embedding of the sampled op and that slot's encoding.
The blueprint head is a pointer too: one blueprint encoder maps each descriptor to an encoding, and it
scores each blueprint from the trunk, the op, the chosen slot's encoding and the blueprint's encoding at
that slot. The other heads (style, tempo, alpha target, speed, curve) read the trunk, the op and the
chosen slot's encoding, with the fixed sizes of their enums. Masks, relevance and sampling order are the
flat network's (:mod:`esper.shell.agent.policy`).

Initial preferences: ``wait_bias``, ``germinate_bias``, ``fossilize_bias`` and ``blend_bias`` as in the
flat network (the op and blend heads' output biases). The two pointer heads carry a learned scalar prior
each: the slot head ``-w_order * i`` on slot ``i`` (``w_order`` starts at ``slot_order_bias``: an
untrained policy acts on the first legal slot), the blueprint head ``w_size * ln(cost)`` on each
blueprint at the chosen slot (``w_size`` starts at ``size_bias``: the capacity prior, computed from the
descriptors of whatever host it acts on). Both pointers' score networks start near zero (gain 0.01), so
at the start these priors are the heads' preferences, as the flat network's initial biases are.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import torch
from tensordict import TensorDict
from torch import nn

from esper.core import distributions as dist
from esper.core.masks import action_masks, blueprint_mask, slot_mask
from esper.core.spec import HEADS, ActionSpec, Op
from esper.shell.agent.policy import (
    RecurrentState,
    _mlp,
    _mode_heads,
    _sample,
    check_masks,
    recurrent_trunk,
    start_biases,
)

#: The heads whose sizes are fixed by the action space's enums (everything but the pointers).
FIXED_HEADS = tuple(h for h in HEADS if h not in ("slot", "blueprint"))
#: The keys of the set network's input TensorDict.
INPUT_KEYS = ("globals", "slots", "enabled", "blueprints", "log_cost")


def _encoder(n_in: int, width: int) -> nn.Sequential:
    net = nn.Sequential(
        nn.Linear(n_in, width), nn.LayerNorm(width), nn.ReLU(), nn.Linear(width, width), nn.ReLU()
    )
    for layer in (net[0], net[3]):
        nn.init.orthogonal_(layer.weight, math.sqrt(2))
        nn.init.zeros_(layer.bias)
    return net


def _pick(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x [*B, S, *R]`` at ``index [*B]`` along the slot dim: ``[*B, *R]``."""
    rest = x.shape[index.dim() + 1 :]
    idx = index.reshape(*index.shape, 1, *([1] * len(rest))).expand(*index.shape, 1, *rest)
    return x.gather(index.dim(), idx).squeeze(index.dim())


class PointerHead(nn.Module):
    """Scores a variable number of choices: ``score([context, choice]) + prior * term`` per choice, the
    score an MLP shared by every choice, ``prior`` a learned scalar."""

    def __init__(self, n_in: int, n_hidden: int, prior: float) -> None:
        super().__init__()
        self.score = _mlp(n_in, n_hidden, 1, 0.01)
        self.prior = nn.Parameter(torch.tensor(float(prior)))

    def forward(self, context: torch.Tensor, choices: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
        """``context [*B, C]``, ``choices [*B, N, K]``, ``term [*B, N]`` -> logits ``[*B, N]``."""
        ctx = context.unsqueeze(-2).expand(*choices.shape[:-1], context.shape[-1])
        return self.score(torch.cat([ctx, choices], dim=-1)).squeeze(-1) + self.prior * term


class SetRecurrentActorCritic(nn.Module):
    """The host-agnostic actor-critic (module docstring). ``global_dim``: the ``globals`` width;
    ``slot_dim``: the ``slots`` width; ``descriptor_dim``: the ``blueprints`` width."""

    def __init__(
        self,
        global_dim: int,
        slot_dim: int,
        descriptor_dim: int,
        *,
        hidden: int = 128,
        head_hidden: int = 64,
        op_embed: int = 16,
        wait_bias: float = 0.0,
        germinate_bias: float = 0.0,
        blend_bias: float = 0.0,
        fossilize_bias: float = 0.0,
        slot_order_bias: float = 0.0,
        size_bias: float = 0.0,
    ) -> None:
        super().__init__()
        if min(global_dim, slot_dim, descriptor_dim, hidden, head_hidden) < 1:
            raise ValueError(
                f"global_dim, slot_dim, descriptor_dim, hidden and head_hidden must be >= 1, got "
                f"{global_dim}, {slot_dim}, {descriptor_dim}, {hidden}, {head_hidden}"
            )
        self.global_dim, self.slot_dim, self.descriptor_dim = global_dim, slot_dim, descriptor_dim
        self.hidden = hidden
        d = self.encoding = head_hidden
        self.slot_encoder = _encoder(slot_dim, d)
        self.blueprint_encoder = _encoder(descriptor_dim, d)
        self.encoder, self.lstm, self.post_norm = recurrent_trunk(global_dim + 2 * d, hidden)
        self.op_embedding = nn.Embedding(len(Op), op_embed)
        sizes = ActionSpec(1, 1).sizes
        later = hidden + op_embed + d  # trunk, op, the chosen slot's encoding
        heads: dict[str, nn.Module] = {h: _mlp(later, head_hidden, sizes[h], 0.01) for h in FIXED_HEADS}
        heads["op"] = _mlp(hidden, head_hidden, sizes["op"], 0.01)
        heads["slot"] = PointerHead(hidden + op_embed + d, head_hidden, -float(slot_order_bias))
        heads["blueprint"] = PointerHead(later + d, head_hidden, float(size_bias))
        self.heads = nn.ModuleDict({h: heads[h] for h in HEADS})
        self.value_head = _mlp(hidden, head_hidden, 1, 1.0)
        #: The flat network's per-slot table has no counterpart here (the chosen slot's encoding).
        self.slot_bias = None
        start_biases(self.heads, wait_bias=wait_bias, germinate_bias=germinate_bias, blend_bias=blend_bias,
                     fossilize_bias=fossilize_bias)  # fmt: skip

    # ------------------------------------------------------------------------------------ building blocks
    def initial_state(self, batch: int, device: torch.device | str | None = None) -> RecurrentState:
        """Zero ``(h, c)``, each ``[1, batch, hidden]``: the state at the start of an episode."""
        z = torch.zeros(1, batch, self.hidden, device=device)
        return z, z.clone()

    def _check(self, obs: TensorDict, dims: int) -> None:
        if not isinstance(obs, TensorDict) or obs.batch_dims != dims:
            what = type(obs).__name__ if not isinstance(obs, TensorDict) else f"batch {list(obs.batch_size)}"
            raise ValueError(
                f"the set policy reads a TensorDict of {dims} batch dims ({', '.join(INPUT_KEYS)}), "
                f"got {what}"
            )
        widths = {"globals": self.global_dim, "slots": self.slot_dim, "blueprints": self.descriptor_dim}
        for key, width in widths.items():
            if obs[key].shape[-1] != width:
                got = obs[key].shape[-1]
                raise ValueError(f"set policy input {key!r} must have {width} features, got {got}")

    def encode(self, obs: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot encodings ``[*B, S, d]`` and the trunk's input ``[*B, G + 2d]`` (global features, mean and
        max of the enabled slots' encodings; 0 where an env has none)."""
        enc = self.slot_encoder(obs["slots"])
        on = obs["enabled"].unsqueeze(-1)
        count = on.sum(-2).clamp(min=1).to(enc.dtype)
        mean = torch.where(on, enc, 0.0).sum(-2) / count
        low = torch.finfo(enc.dtype).min
        top = torch.where(on, enc, low).amax(-2)
        top = torch.where(on.any(-2), top, 0.0)
        return enc, torch.cat([obs["globals"], mean, top], dim=-1)

    def _trunk(
        self, obs: TensorDict, state: RecurrentState
    ) -> tuple[torch.Tensor, torch.Tensor, RecurrentState]:
        """``obs [E, T]`` -> trunk features ``[E, T, hidden]``, slot encodings ``[E, T, S, d]`` and the
        state after step T."""
        self._check(obs, 2)
        enc, x = self.encode(obs)
        out, new_state = self.lstm(self.encoder(x), state)
        return self.post_norm(out), enc, new_state

    def features(self, obs: TensorDict, state: RecurrentState) -> tuple[torch.Tensor, RecurrentState]:
        """``obs [E, T]`` -> trunk features ``[E, T, hidden]`` and the state after step T."""
        feats, _, new_state = self._trunk(obs, state)
        return feats, new_state

    def slot_logits(self, feats: torch.Tensor, enc: torch.Tensor, op: torch.Tensor) -> torch.Tensor:
        """``[*B, S]``: the slot pointer, conditioned on ``op``."""
        order = torch.arange(enc.shape[-2], device=enc.device, dtype=enc.dtype).expand(enc.shape[:-1])
        return self.heads["slot"](torch.cat([feats, self.op_embedding(op)], dim=-1), enc, order)

    def _later_logits(
        self, obs: TensorDict, feats: torch.Tensor, enc: torch.Tensor, op: torch.Tensor, slot: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The heads after the slot head, conditioned on ``op`` and the chosen ``slot``'s encoding."""
        cond = torch.cat([feats, self.op_embedding(op), _pick(enc, slot)], dim=-1)
        blueprints = self.blueprint_encoder(_pick(obs["blueprints"], slot))  # [*B, NB, d]
        logits = {h: self.heads[h](cond) for h in FIXED_HEADS if h != "op"}
        logits["blueprint"] = self.heads["blueprint"](cond, blueprints, _pick(obs["log_cost"], slot))
        return logits

    def head_logits(
        self, obs: TensorDict, feats: torch.Tensor, enc: torch.Tensor, op: torch.Tensor, slot: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Logits of every head (indices shaped ``feats.shape[:-1]``)."""
        return {
            "op": self.heads["op"](feats),
            "slot": self.slot_logits(feats, enc, op),
            **self._later_logits(obs, feats, enc, op, slot),
        }

    def value(self, feats: torch.Tensor) -> torch.Tensor:
        return self.value_head(feats).squeeze(-1)

    # ------------------------------------------------------------------------------------- entry points
    @torch.no_grad()
    def act(
        self,
        obs: TensorDict,
        state: RecurrentState,
        legal: TensorDict,
        *,
        generator: torch.Generator | list[torch.Generator] | None = None,
        deterministic: bool | Collection[str] = False,
    ) -> tuple[TensorDict, RecurrentState]:
        """One step for every env, as :meth:`FactoredRecurrentActorCritic.act
        <esper.shell.agent.policy.FactoredRecurrentActorCritic.act>` (``obs``: the input TensorDict,
        batch ``[E]``)."""
        mode = _mode_heads(deterministic)
        self._check(obs, 1)
        check_masks(legal["op"], "op")
        seq = obs.unsqueeze(1)
        feats, enc, new_state = self._trunk(seq, state)
        feats, enc = feats.squeeze(1), enc.squeeze(1)
        op_logits = self.heads["op"](feats)
        op = _sample(op_logits, legal["op"], generator, "op" in mode)
        slots_ok = slot_mask(legal, op)
        check_masks(slots_ok, "slot")
        slot_logits = self.slot_logits(feats, enc, op)
        slot = _sample(slot_logits, slots_ok, generator, "slot" in mode)
        logits = {"op": op_logits, "slot": slot_logits, **self._later_logits(obs, feats, enc, op, slot)}
        # the blueprint before the masks: under a cap that counts gates, the style mask depends on it
        blueprint = _sample(logits["blueprint"], blueprint_mask(legal, slot), generator, "blueprint" in mode)
        used = action_masks(legal, op, slot, blueprint)
        sampled = {"op": op, "slot": slot, "blueprint": blueprint}
        batch = obs.batch_size
        out = TensorDict({}, batch_size=batch, device=feats.device)
        for head in HEADS:
            mask = used[head]
            if head not in sampled:
                sampled[head] = _sample(logits[head], mask, generator, head in mode)
            a = sampled[head]
            out[head] = TensorDict(
                {"action": a, "action_log_prob": dist.log_prob(logits[head], a, mask), "action_mask": mask},
                batch_size=batch,
            )
        out["state_value"] = self.value(feats)
        return out, new_state

    def rescore(
        self, obs: TensorDict, state: RecurrentState, op: torch.Tensor, slot: torch.Tensor
    ) -> TensorDict:
        """Re-score stored ``[E, T]`` sequences that start at ``state``: per-head logits and
        ``state_value``, with grad, as the flat network's :meth:`rescore`."""
        feats, enc, _ = self._trunk(obs, state)
        logits = self.head_logits(obs, feats, enc, op, slot)
        out = TensorDict(
            {h: TensorDict({"logits": logits[h]}, batch_size=op.shape) for h in HEADS}, batch_size=op.shape
        )
        out["state_value"] = self.value(feats)
        return out

    @torch.no_grad()
    def bootstrap_value(self, obs: TensorDict, state: RecurrentState) -> torch.Tensor:
        """V of the post-action input ``obs [E]`` with the post-action state."""
        feats, _, _ = self._trunk(obs.unsqueeze(1), state)
        return self.value(feats.squeeze(1))


__all__ = ["FIXED_HEADS", "INPUT_KEYS", "PointerHead", "SetRecurrentActorCritic"]
