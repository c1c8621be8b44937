"""Host networks with named seed slots: a small CNN classifier and a byte-level causal transformer LM.

Both implement :class:`Host`: the slot bookkeeping (germinate, remove, set alpha/stage, parameter
partition, counterfactual) lives in the base class; a host adds its family, its forward and
``loss_and_correct``. Seeds are built from the family's registry (:mod:`esper.shell.host.blueprints`) with
the global torch RNG; seed it (``torch.manual_seed`` or ``torch.random.fork_rng``) for reproducible
germinations.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from esper.core.spec import Stage, Style
from esper.shell.data.batches import Batch
from esper.shell.host.blueprints import (
    BLUEPRINTS,
    REGISTERED_BUILDERS,
    CausalSelfAttention,
    build_blueprint,
    param_count,
)
from esper.shell.host.slots import Gate, SeedSlot


class Host(nn.Module, ABC):
    """A network with named injection slots, ``self.slots[i]`` after the i-th stage of the network.

    Slot indices follow :attr:`slot_names`; the slot head of the policy uses the same order.
    """

    #: "cnn", "cnn1d" or "transformer": picks the blueprint registry.
    family: str

    def __init__(self, slot_names: tuple[str, ...], widths: tuple[int, ...]):
        super().__init__()
        if len(slot_names) != len(widths) or not slot_names:
            raise ValueError(f"Host: need one width per slot, got {slot_names} / {widths}")
        if len(set(slot_names)) != len(slot_names):
            raise ValueError(f"Host: duplicate slot names {slot_names}")
        self.slots = nn.ModuleList(SeedSlot(n, w, self.family) for n, w in zip(slot_names, widths))
        self.keep_catalogue()

    def keep_catalogue(self) -> None:
        """Take the family's blueprint catalogue as it is now (names, in index order, and the builders of
        the registered ones) as this host's for its life: a blueprint registered or unregistered later
        (:mod:`esper.shell.host.registry`) neither shifts the indices its controller acts by nor changes
        what it builds. The constructor calls it; a host that sets its family later calls it then."""
        names = BLUEPRINTS[self.family]
        self._catalogue = names
        self._builders = {n: REGISTERED_BUILDERS[(self.family, n)] for n in names
                          if (self.family, n) in REGISTERED_BUILDERS}  # fmt: skip

    # ------------------------------------------------------------------------------------ the API
    @property
    def slot_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slots)

    @property
    def n_slots(self) -> int:
        return len(self.slots)

    @property
    def blueprint_names(self) -> tuple[str, ...]:
        """The family's blueprints, in blueprint-head index order, as they were when the host was built
        (:meth:`keep_catalogue`)."""
        kept = self.__dict__.get("_catalogue")
        return kept if kept is not None else BLUEPRINTS[self.family]

    def build_seed(self, name: str, width: int) -> nn.Module:
        """A fresh seed of blueprint ``name`` of this host's catalogue for activations of ``width``
        channels (features): the builder the host was built with, for a registered one."""
        names = self.blueprint_names
        if name not in names:
            raise ValueError(f"unknown {self.family} blueprint {name!r}; this host's: {', '.join(names)}")
        builder = self.__dict__.get("_builders", {}).get(name)
        return builder(width) if builder is not None else build_blueprint(self.family, name, width)

    def slot_width(self, name: str) -> int:
        for s in self.slots:
            if s.name == name:
                return s.width
        raise KeyError(f"no slot {name!r}; slots: {', '.join(self.slot_names)}")

    def germination_cost(self) -> torch.Tensor:
        """``[S, n_blueprints]`` float: the most parameters germinating blueprint ``b`` in slot ``s`` can
        add, the seed's plus a GATED_GATE gate's (:meth:`gate_cost`: a cap given it counts the gate only
        where one is built, :func:`esper.core.masks.within_param_cap`). Builds each seed once."""
        gates = self.gate_cost().tolist()
        rows = [
            [param_count(self.build_seed(b, s.width)) + g for b in self.blueprint_names]
            for s, g in zip(self.slots, gates, strict=True)
        ]
        return torch.tensor(rows, dtype=torch.float32)

    def gate_cost(self) -> torch.Tensor:
        """``[S]`` float: the parameters a GATED_GATE gate adds in each slot (the part of
        :meth:`germination_cost` no other style adds)."""
        return torch.tensor([float(param_count(Gate(s.width, self.family))) for s in self.slots])

    def slot(self, slot_index: int) -> SeedSlot:
        if not 0 <= slot_index < len(self.slots):
            raise IndexError(f"slot index {slot_index} out of range for {len(self.slots)} slots")
        return self.slots[slot_index]

    def germinate(self, slot_index: int, blueprint_index: int, style: Style | int) -> list[nn.Parameter]:
        """Build blueprint ``blueprint_names[blueprint_index]`` into the (empty) slot, on the host's
        device and dtype; the slot becomes GERMINATED with alpha 0. Returns the seed's trainable
        parameters, the gate's included."""
        names = self.blueprint_names
        if not 0 <= blueprint_index < len(names):
            raise IndexError(f"blueprint index {blueprint_index} out of range for {self.family}: {names}")
        slot = self.slot(slot_index)
        seed = self.build_seed(names[blueprint_index], slot.width)
        slot.install(seed, style, names[blueprint_index])
        ref = next(iter(self.host_parameters()))
        slot.to(device=ref.device, dtype=ref.dtype)
        return slot.seed_parameters()

    def remove_seed(self, slot_index: int) -> None:
        """Remove the slot's seed (its parameters leave the model); the slot becomes DORMANT."""
        self.slot(slot_index).remove()

    def set_slot(self, slot_index: int, *, alpha: float, stage: Stage | int) -> None:
        self.slot(slot_index).set(alpha=alpha, stage=stage)

    def seed_parameters(self, slot_index: int) -> list[nn.Parameter]:
        return self.slot(slot_index).seed_parameters()

    def host_parameters(self) -> list[nn.Parameter]:
        """Every parameter that is not in a slot (seeds and gates excluded)."""
        return [p for n, p in self.named_parameters() if not n.startswith("slots.")]

    def counterfactual(self, slot_index: int) -> AbstractContextManager[None]:
        """Inside the block, slot ``slot_index`` composes with alpha 0 (its seed is skipped)."""
        return self.slot(slot_index).force_alpha(0.0)

    def incubating_slots(self) -> list[int]:
        """Indices of the slots whose seed incubates (GERMINATED, TRAINING)."""
        return [i for i, s in enumerate(self.slots) if s.incubating]

    @contextmanager
    def incubating(self, slot_indices: Sequence[int], *, keep_counts: bool = False) -> Iterator[None]:
        """The what-if pass of incubating seeds: inside the block the listed slots compose at alpha 1
        on the detached host activation, and batch-norm running statistics do not move (the what-if
        activations must not leak into the host's evaluation statistics). ``keep_counts``: their step
        counts do not move either (which a batch norm of ``momentum=None`` averages by), so the host's state
        is as without the pass; the Grower's what-if pass keeps them (a user's host trains as without its
        slots), the env's keeps its batched path's counting (the stacked step counts every pass)."""
        norms = self.batch_norms()
        saved = [m.momentum for m in norms]
        counts = [
            None if not keep_counts or m.num_batches_tracked is None else m.num_batches_tracked.clone()
            for m in norms
        ]
        with ExitStack() as stack:
            for i in slot_indices:
                stack.enter_context(self.slot(i).force_alpha(1.0))
            try:
                for m in norms:
                    m.momentum = 0.0  # running = (1 - 0) * running + 0 * batch: unchanged
                yield
            finally:
                for m, momentum, count in zip(norms, saved, counts):
                    m.momentum = momentum
                    if count is not None:
                        m.num_batches_tracked.copy_(count)

    def batch_norms(self) -> list[nn.modules.batchnorm._BatchNorm]:
        """The host's batch norms (seeds hold none: their norms are group or layer norms)."""
        return [m for m in self.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    @contextmanager
    def batch_statistics(self) -> Iterator[None]:
        """Inside the block every batch norm normalizes with the statistics of the batch it is given and
        records nothing (running statistics and step counts untouched), whatever the host's mode; other
        modules keep their mode. What the what-if reading under ``whatif_statistics batch`` uses, so that a
        seed before a batch norm is normalized as blending it in would come to normalize it."""
        norms = self.batch_norms()
        saved = [(m.training, m.track_running_stats) for m in norms]
        try:
            for m in norms:
                m.training, m.track_running_stats = True, False  # batch statistics, nothing recorded
            yield
        finally:
            for m, (training, track) in zip(norms, saved):
                m.training, m.track_running_stats = training, track

    @abstractmethod
    def loss_and_correct(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(mean cross-entropy [with grad], n_correct [0-d int64 tensor], n_items)``; no host sync."""

    # ------------------------------------------------------------------- a pass resumed at a slot
    #: Whether the host's forward is a stem, then for each slot ``i`` its stage and the slot, then a tail
    #: (:meth:`_stem`, :meth:`_stage`, :meth:`_tail`), so that a pass can keep every slot's input and a
    #: later pass resume at a slot from it (:meth:`loss_and_correct_inputs`, :meth:`loss_and_correct_from`).
    #: The built-in hosts are; a host that is not runs every pass whole.
    staged: bool = False

    def _stem(self, inp: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """What runs between slot ``i - 1`` (or the stem) and slot ``i``."""
        raise NotImplementedError

    def _tail(self, x: torch.Tensor) -> torch.Tensor:
        """From the last slot's output to the logits."""
        raise NotImplementedError

    def _logits_loss(self, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        return _loss_and_correct(logits, y)

    def _staged(self, inp: torch.Tensor | None = None, *, start: int = 0, x: torch.Tensor | None = None,
                inputs: list[torch.Tensor] | None = None) -> torch.Tensor:  # fmt: skip
        """The forward: from ``inp`` (stem, then every stage and slot), or from slot ``start``'s input ``x``
        (that slot and the rest); with ``inputs``, each slot's input is appended to it."""
        if x is None:
            x = self._stem(inp)
        for i in range(start, self.n_slots):
            if inp is not None or i > start:
                x = self._stage(i, x)
            if inputs is not None:
                inputs.append(x)
            x = self.slots[i](x)
        return self._tail(x)

    def loss_and_correct_inputs(
        self, batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor, int, list[torch.Tensor]]:
        """:meth:`loss_and_correct`, and the input of every slot in that pass (for
        :meth:`loss_and_correct_from`; a :attr:`staged` host only)."""
        inputs: list[torch.Tensor] = []
        return (*self._logits_loss(self._staged(batch[0], inputs=inputs), batch[1]), inputs)

    def loss_and_correct_from(
        self, slot_index: int, x: torch.Tensor, batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """:meth:`loss_and_correct` of ``batch`` resumed at slot ``slot_index`` from its input ``x`` (kept by
        :meth:`loss_and_correct_inputs`): number for number the whole pass, when nothing before the slot
        has changed since ``x`` was kept (the counterfactual and what-if passes change only the slot)."""
        return self._logits_loss(self._staged(start=slot_index, x=x), batch[1])


def _loss_and_correct(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    # logits: [M, K], y: [M]
    loss = F.cross_entropy(logits, y)
    correct = (logits.detach().argmax(dim=-1) == y).sum()
    return loss, correct, y.numel()


# ---------------------------------------------------------------------------------------------- CNN
class _ConvHost(Host):
    """A CNN classifier: ``self.blocks[i]`` then slot ``i`` for each slot, then the mean over the spatial
    dims and ``self.head``. Input ``[N, C_in, *spatial]``, logits ``[N, n_classes]``."""

    staged = True
    blocks: nn.ModuleList
    head: nn.Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._staged(x)

    def _stem(self, inp: torch.Tensor) -> torch.Tensor:
        return inp

    def _stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[i](x)

    def _tail(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.mean(dim=tuple(range(2, x.dim()))))

    def loss_and_correct(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
        x, y = batch
        return self._logits_loss(self(x), y)


class CNNHost(_ConvHost):
    """``len(channels)`` blocks of conv3×3 (no bias) → BN → ReLU → maxpool2, a seed slot after each
    block (``"b0"``, ``"b1"``, ...; widths = ``channels``), global average pool, linear classifier.

    Input ``[N, in_channels, image_size, image_size]``; ``image_size >= 2 ** len(channels)``.
    """

    family = "cnn"

    def __init__(
        self,
        in_channels: int = 3,
        image_size: int = 32,
        channels: tuple[int, ...] = (16, 32, 64),
        n_classes: int = 10,
    ):
        channels = tuple(channels)
        if not channels:
            raise ValueError("CNNHost: channels must not be empty")
        if image_size < 2 ** len(channels):
            raise ValueError(f"CNNHost: image_size {image_size} < 2**{len(channels)} (one pool per block)")
        super().__init__(tuple(f"b{i}" for i in range(len(channels))), channels)
        self.in_channels = in_channels
        self.image_size = image_size
        self.n_classes = n_classes
        blocks, c_in = [], in_channels
        for c in channels:
            blocks.append(
                nn.Sequential(
                    nn.Conv2d(c_in, c, 3, padding=1, bias=False),
                    nn.BatchNorm2d(c),
                    nn.ReLU(inplace=True),
                    nn.MaxPool2d(2),
                )
            )
            c_in = c
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(c_in, n_classes)


class CNN1dHost(_ConvHost):
    """A 1-D CNN for signals ``[N, in_channels, length]``: ``len(channels)`` blocks of
    conv (kernel ``kernels[i]``, no bias) → BN → ReLU → maxpool ``pools[i]`` (none when 1), a seed slot
    after each block (``"b0"``, ``"b1"``, ...; widths = ``channels``), global average pool over the
    length, linear classifier.

    The default is deliberately small: pointwise convolutions (kernel 1) see one position each, so the
    host's receptive field is only what its pools merge, and it cannot read the shape of a signal. The
    seeds (:data:`~esper.shell.host.blueprints.BLUEPRINTS` ``["cnn1d"]``) add what it lacks: spatial
    context (convolutions, depthwise, self-attention over positions) and channel mixing.
    """

    family = "cnn1d"

    def __init__(
        self,
        in_channels: int = 1,
        length: int = 40,
        channels: tuple[int, ...] = (8, 8, 8),
        n_classes: int = 10,
        kernels: tuple[int, ...] = (1, 1, 1),
        pools: tuple[int, ...] = (2, 2, 1),
    ):
        channels, kernels, pools = tuple(channels), tuple(kernels), tuple(pools)
        if not channels or len(kernels) != len(channels) or len(pools) != len(channels):
            raise ValueError(
                f"CNN1dHost: need one kernel and one pool per block, got channels {channels}, "
                f"kernels {kernels}, pools {pools}"
            )
        if min(channels) < 1 or min(kernels) < 1 or min(pools) < 1:
            raise ValueError(f"CNN1dHost: channels, kernels and pools must be >= 1, got {channels}, "
                             f"{kernels}, {pools}")  # fmt: skip
        if length < math.prod(pools):
            raise ValueError(f"CNN1dHost: length {length} < the product of the pools {pools}")
        super().__init__(tuple(f"b{i}" for i in range(len(channels))), channels)
        self.in_channels, self.length, self.n_classes = in_channels, length, n_classes
        blocks, c_in = [], in_channels
        for c, k, p in zip(channels, kernels, pools):
            blocks.append(
                nn.Sequential(
                    nn.Conv1d(c_in, c, k, padding=k // 2, bias=False),
                    nn.BatchNorm1d(c),
                    nn.ReLU(inplace=True),
                    nn.MaxPool1d(p) if p > 1 else nn.Identity(),
                )
            )
            c_in = c
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(c_in, n_classes)


# -------------------------------------------------------------------------------------- transformer
class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(LN(x))``, then ``x + mlp(LN(x))``; with ``attention=False``
    the MLP half alone (a block that acts on each position by itself)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, attention: bool = True):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model) if attention else None
        self.attn = CausalSelfAttention(d_model, n_heads, dropout) if attention else None
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model), nn.Dropout(dropout)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.attn is not None:
            x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.mlp(self.ln2(x))


class TransformerHost(Host):
    """Byte-level causal LM: token + learned position embeddings, ``n_layers`` pre-LN blocks, final
    LN, output head tied to the token embedding. A seed slot on the residual stream after every
    ``slot_every`` layers (``"s0"``, ``"s1"``, ...; width ``d_model``), so the default 4 layers give
    two slots. Input ``[N, L]`` int64 tokens with ``L <= ctx``; logits ``[N, L, vocab]``.

    Two options make a host whose positions do not mix (the `recall` task's): ``attention=False``
    drops the blocks' self-attention, so each position is computed from its own input alone, and
    ``prev_token=True`` adds an embedding of the previous token (a start symbol at position 0) to each
    position's input. Such a host can learn bigram statistics and nothing that needs another position;
    a seed that mixes positions (``attention``) is then the only way to more.
    """

    family = "transformer"

    def __init__(
        self,
        vocab: int = 256,
        d_model: int = 64,
        n_layers: int = 4,
        n_heads: int = 4,
        ctx: int = 64,
        dropout: float = 0.0,
        slot_every: int = 2,
        attention: bool = True,
        prev_token: bool = False,
    ):
        if not 1 <= slot_every <= n_layers:
            raise ValueError(f"TransformerHost: slot_every must be in [1, {n_layers}], got {slot_every}")
        slot_after = tuple(i for i in range(n_layers) if (i + 1) % slot_every == 0)
        n = len(slot_after)
        super().__init__(tuple(f"s{i}" for i in range(n)), (d_model,) * n)
        self.slot_after = slot_after  # layer indices followed by a slot
        self.vocab, self.d_model, self.n_layers, self.ctx = vocab, d_model, n_layers, ctx
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(ctx, d_model)
        # index ``vocab`` is the start symbol: position 0 has no previous token
        self.prev = nn.Embedding(vocab + 1, d_model) if prev_token else None
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(Block(d_model, n_heads, dropout, attention) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2 style: N(0, 0.02), zero biases, residual projections scaled by 1/sqrt(2 n_layers).
        for name, p in self.named_parameters():
            if name.startswith("slots."):
                continue
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                residual = name.endswith(("proj.weight", "mlp.2.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.n_layers) if residual else 0.02)

    staged = True

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        # idx: [N, L] int64 -> logits [N, L, vocab]
        return self._staged(idx)

    def _stem(self, idx: torch.Tensor) -> torch.Tensor:
        length = idx.shape[1]
        if length > self.ctx:
            raise ValueError(f"TransformerHost: sequence length {length} > ctx {self.ctx}")
        x = self.tok(idx) + self.pos(torch.arange(length, device=idx.device))
        if self.prev is not None:
            x = x + self.prev(F.pad(idx[:, :-1], (1, 0), value=self.vocab))
        return self.drop(x)

    def _stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        # the layers after slot i - 1's layer, up to and with slot i's
        for layer in self.layers[self.slot_after[i - 1] + 1 if i else 0 : self.slot_after[i] + 1]:
            x = layer(x)
        return x

    def _tail(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[self.slot_after[-1] + 1 :]:
            x = layer(x)
        return F.linear(self.ln_f(x), self.tok.weight)  # tied head

    def _logits_loss(self, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        return _loss_and_correct(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def loss_and_correct(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
        x, y = batch  # [N, L] inputs, [N, L] next bytes
        return self._logits_loss(self(x), y)


__all__ = ["Batch", "Block", "CNN1dHost", "CNNHost", "Host", "TransformerHost"]
