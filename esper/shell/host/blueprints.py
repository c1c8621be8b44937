"""Seed blueprints: small modules that map a host activation to a residual delta of the same shape.

One registry per host family. The tuple order is the blueprint head's index order, so it is fixed
here and nowhere else; it is sorted by parameter count at the default widths (smallest first), which
the tests check:

- ``"cnn"`` (activation ``[N, C, H, W]``); params for ``C``, and at C = 16 / 32 / 64:

  - noop: zeros. 0
  - norm: ``tanh(s)·(GroupNorm(x) − x)``. 2C + 1 (33 / 65 / 129)
  - attention: squeeze-excite, ``x·tanh(MLP(mean_hw(x)))``, r = C/4. C²/2 + 5C/4 (148 / 552 / 2128)
  - depthwise: dw3×3 → GN → ReLU → pw1×1. C² + 11C (432 / 1376 / 4800)
  - bottleneck: 1×1 C→C/2 → GN → ReLU → 3×3 → GN → ReLU → 1×1 C/2→C. 3.25C² + 2C
    (864 / 3392 / 13440)
  - conv_small: 3×3 C→C/2 → GN → ReLU → 1×1 C/2→C. 5C² + C (1296 / 5152 / 20544)
  - conv_light: 3×3 → GN → ReLU → 1×1. 10C² + 2C (2592 / 10304 / 41088)
  - conv_heavy: 3×3 → GN → ReLU → 3×3. 18C² + 2C (4640 / 18496 / 73856)

- ``"cnn1d"`` (activation ``[N, C, L]``, 1-D signals); params at C = 8:

  - noop: zeros. 0
  - norm: ``tanh(s)·(GroupNorm(x) − x)``. 2C + 1 (17)
  - attention: squeeze-excite over the length, r = C/4. C²/2 + 5C/4 (42)
  - depthwise: dw k5 → GN → ReLU → pw1×1. C² + 7C (120)
  - conv_small: k3 C→C/2 → GN → ReLU → 1×1 C/2→C. 2C² + C (136)
  - conv_light: k3 → GN → ReLU → 1×1. 4C² + 2C (272)
  - self_attention: 1×1 q/k/v projections, softmax over positions, 1×1 out. 4C² + 4C (288)
  - conv_heavy: k3 → GN → ReLU → k3. 6C² + 2C (400)

- ``"transformer"`` (activation ``[N, L, D]``, the residual stream of a causal LM); params at D = 64:

  - noop: zeros. 0
  - norm: ``tanh(s)·(LayerNorm(x) − x)``. 2D + 1 (129)
  - lora: ``x·A·B``, rank 8, B = 0. 16D (1024)
  - lora_large: rank min(32, D). 64D (4096)
  - mlp_small: LN → Linear(D, D) → GELU → Linear(D, D). 2D² + 4D (8448)
  - attention: LN → causal self-attention, 4 heads (fewer if D is not divisible). 4D² + 6D (16768)
  - mlp: LN → Linear(D, 4D) → GELU → Linear(4D, D). 8D² + 7D (33216)

- ``"mlp"`` (activation ``[N, D]``, a flat feature vector: the hidden layers of an MLP); params at
  D = 16 / 32 / 64:

  - noop: zeros. 0
  - norm: ``tanh(s)·(LayerNorm(x) − x)``. 2D + 1 (33 / 65 / 129)
  - lora: ``x·A·B``, rank min(4, D), B = 0. 8D (128 / 256 / 512)
  - widen: D/4 new hidden units, ``W_out·relu(W_in·x + b)``, ``W_out`` and its bias exactly 0
    (:class:`Widen`: a residual block's hidden layer widened by D/4 units). D²/2 + 5D/4
    (148 / 552 / 2128)
  - mlp_small: LN → Linear(D, D/2) → GELU → Linear(D/2, D). D² + 7D/2 (312 / 1136 / 4320)
  - mlp: LN → Linear(D, 2D) → GELU → Linear(2D, D). 4D² + 5D (1104 / 4256 / 16704)

Blueprints of the user's own join a family's registry through
:func:`esper.shell.host.registry.register_blueprint` (placed in it by size, as these are).

Inits are gentle: the last projection of every seed with hidden layers is its default init scaled by
:data:`FINAL_INIT_SCALE` (biases zero), LoRA's up-projection and the norm seed's scale start at exactly
zero, so a fresh seed's delta is (near) zero and blending starts from the host's own function. Every
listed name builds a real module (the reference silently mapped conv_heavy to a no-op). Transformer
seeds are causal: nothing at position t reads positions > t.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

#: Blueprint names per host family, in the blueprint head's index order (sorted by parameter count).
BLUEPRINTS: dict[str, tuple[str, ...]] = {
    "cnn": (
        "noop",
        "norm",
        "attention",
        "depthwise",
        "bottleneck",
        "conv_small",
        "conv_light",
        "conv_heavy",
    ),
    "cnn1d": (
        "noop",
        "norm",
        "attention",
        "depthwise",
        "conv_small",
        "conv_light",
        "self_attention",
        "conv_heavy",
    ),
    "transformer": ("noop", "norm", "lora", "lora_large", "mlp_small", "attention", "mlp"),
    "mlp": ("noop", "norm", "lora", "widen", "mlp_small", "mlp"),
}

#: A receptive field that covers every position (:data:`BLUEPRINT_TRAITS`).
GLOBAL = 0
#: What any family can state about each of its blueprints, by name: its kind and its receptive field
#: (the positions one output reads through the seed's weights: a kernel's extent, 1 for a per-position
#: map, :data:`GLOBAL` where it mixes every position; normalization statistics are not counted). The
#: host-agnostic policy describes blueprints by these (:mod:`esper.shell.host.descriptors`), never by
#: their index in one family's list. Kinds: ``identity`` (the no-op), ``normalization``, ``attention``
#: (a channel gate from a global summary: squeeze-excite), ``self_attention`` (positions mixed by
#: attention), ``depthwise``, ``convolution``, ``mlp``, ``low_rank``.
BLUEPRINT_TRAITS: dict[str, dict[str, tuple[str, int]]] = {
    "cnn": {
        "noop": ("identity", 1),
        "norm": ("normalization", 1),
        "attention": ("attention", GLOBAL),
        "depthwise": ("depthwise", 3),
        "bottleneck": ("convolution", 3),
        "conv_small": ("convolution", 3),
        "conv_light": ("convolution", 3),
        "conv_heavy": ("convolution", 5),
    },
    "cnn1d": {
        "noop": ("identity", 1),
        "norm": ("normalization", 1),
        "attention": ("attention", GLOBAL),
        "depthwise": ("depthwise", 5),
        "conv_small": ("convolution", 3),
        "conv_light": ("convolution", 3),
        "self_attention": ("self_attention", GLOBAL),
        "conv_heavy": ("convolution", 5),
    },
    "transformer": {
        "noop": ("identity", 1),
        "norm": ("normalization", 1),
        "lora": ("low_rank", 1),
        "lora_large": ("low_rank", 1),
        "mlp_small": ("mlp", 1),
        "attention": ("self_attention", GLOBAL),
        "mlp": ("mlp", 1),
    },
    "mlp": {
        "noop": ("identity", 1),
        "norm": ("normalization", 1),
        "lora": ("low_rank", 1),
        "widen": ("mlp", 1),
        "mlp_small": ("mlp", 1),
        "mlp": ("mlp", 1),
    },
}
#: The kinds of :data:`BLUEPRINT_TRAITS`, in the descriptor's column order.
BLUEPRINT_KINDS = (
    "identity", "normalization", "attention", "self_attention", "depthwise", "convolution", "mlp", "low_rank",
)  # fmt: skip

#: The final projection of a seed starts at its default init times this (biases zero).
FINAL_INIT_SCALE = 1e-2


def _near_zero_(layer: nn.Module, scale: float = FINAL_INIT_SCALE) -> nn.Module:
    with torch.no_grad():
        layer.weight.mul_(scale)
        if getattr(layer, "bias", None) is not None:
            layer.bias.zero_()
    return layer


def _groups(channels: int) -> int:
    """GroupNorm groups: the most of (8, 4, 2) that leaves >= 2 channels per group, else 1."""
    for g in (8, 4, 2):
        if channels % g == 0 and channels // g >= 2:
            return g
    return 1


def n_heads_for(width: int, preferred: int = 4) -> int:
    """The largest head count <= ``preferred`` that divides ``width``."""
    for h in range(min(preferred, width), 0, -1):
        if width % h == 0:
            return h
    return 1


# ---------------------------------------------------------------------------------------- modules
class Zero(nn.Module):
    """The no-op seed: a zero delta, no parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


class NormSeed(nn.Module):
    """``tanh(s) · (norm(x) − x)``: moves the activation towards its normalized version by a bounded,
    learned amount; ``s`` starts at 0."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm
        self.scale = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.scale) * (self.norm(x) - x)


class SqueezeExcite(nn.Module):
    """Channel attention on ``[N, C, *spatial]`` (2-D images or 1-D signals): ``delta = x ·
    tanh(MLP(mean_spatial(x)))``, so the composed output rescales channels by a factor in (0, 2) per
    sample; the MLP's last layer starts near zero."""

    def __init__(self, channels: int, reduction: int = 4):
        super().__init__()
        hidden = max(1, channels // reduction)
        self.fc1 = nn.Linear(channels, hidden)
        self.fc2 = _near_zero_(nn.Linear(hidden, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spatial = tuple(range(2, x.dim()))
        z = self.fc2(F.relu(self.fc1(x.mean(dim=spatial))))  # [N, C]
        return x * torch.tanh(z).reshape(*z.shape, *(1,) * len(spatial))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention on ``[N, L, D]`` (used by the transformer host and seeds)."""

    def __init__(self, width: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        if width % n_heads:
            raise ValueError(f"CausalSelfAttention: width {width} not divisible by n_heads {n_heads}")
        self.n_heads = n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, d = x.shape
        # [N, L, 3D] -> [3, N, H, L, D/H]
        q, k, v = self.qkv(x).view(n, length, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)  # [N, H, L, D/H]
        return self.proj(y.transpose(1, 2).reshape(n, length, d))


class PositionAttention(nn.Module):
    """Self-attention over the positions of a 1-D signal ``[N, C, L]`` (non-causal: the whole signal is
    one example): 1×1 q/k/v projections, one head, softmax over positions, 1×1 output projection
    (near zero at init). Gives every position a global receptive field in one step."""

    def __init__(self, channels: int):
        super().__init__()
        self.qkv = nn.Conv1d(channels, 3 * channels, 1)
        self.proj = _near_zero_(nn.Conv1d(channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=1)  # each [N, C, L]
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.proj(y.transpose(1, 2))


class LoRA(nn.Module):
    """Low-rank linear delta on the residual stream: ``x A B`` with ``B`` zero at init."""

    def __init__(self, width: int, rank: int):
        super().__init__()
        self.down = nn.Linear(width, rank, bias=False)
        self.up = nn.Linear(rank, width, bias=False)
        nn.init.zeros_(self.up.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))


class Widen(nn.Module):
    """``k`` new hidden units on a flat activation ``[N, D]``: ``W_out · relu(W_in · x + b_in) + b_out``
    with ``W_out`` and ``b_out`` exactly zero at germination, so the network's function is unchanged
    until they learn. Added residually by the slot (``h + alpha · delta``), it is the hidden layer of a
    two-layer residual block ``h + W2 · relu(W1 · h + b1) + b2`` at the slot, widened by ``k`` units:
    the new units feed the layer after through zero outgoing weights. It does not widen the user's own
    layers (their parameters keep their shapes): the units live in the seed, with their own optimizer
    state."""

    def __init__(self, width: int, units: int):
        super().__init__()
        self.units = nn.Linear(width, units)
        self.out = nn.Linear(units, width)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.units(x)))


class PreNorm(nn.Module):
    """``body(LayerNorm(x))``: transformer seeds read a normalized residual stream."""

    def __init__(self, width: int, body: nn.Module):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.ln(x))


# ---------------------------------------------------------------------------------------- builders
def _conv(c_in: int, c_out: int, k: int, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, k, padding=k // 2, groups=groups, bias=False)


def _gn_relu(c: int) -> list[nn.Module]:
    return [nn.GroupNorm(_groups(c), c), nn.ReLU()]


def _conv1d(c_in: int, c_out: int, k: int, groups: int = 1) -> nn.Conv1d:
    return nn.Conv1d(c_in, c_out, k, padding=k // 2, groups=groups, bias=False)


def _build_conv_seed(name: str, c: int, conv: Callable[..., nn.Module], depthwise_k: int) -> nn.Module:
    """The blueprints the 2-D and 1-D CNN families share, built with ``conv`` (:func:`_conv` or
    :func:`_conv1d`); ``depthwise_k``: the depthwise blueprint's kernel size."""
    half = max(1, c // 2)
    if name == "noop":
        return Zero()
    if name == "norm":
        return NormSeed(nn.GroupNorm(_groups(c), c))
    if name == "attention":
        return SqueezeExcite(c)
    if name == "depthwise":
        return nn.Sequential(conv(c, c, depthwise_k, groups=c), *_gn_relu(c), _near_zero_(conv(c, c, 1)))
    if name == "conv_small":
        return nn.Sequential(conv(c, half, 3), *_gn_relu(half), _near_zero_(conv(half, c, 1)))
    if name == "conv_light":
        return nn.Sequential(conv(c, c, 3), *_gn_relu(c), _near_zero_(conv(c, c, 1)))
    if name == "conv_heavy":
        return nn.Sequential(conv(c, c, 3), *_gn_relu(c), _near_zero_(conv(c, c, 3)))
    raise AssertionError(name)  # unreachable: names are checked against BLUEPRINTS first


def _build_cnn(name: str, c: int) -> nn.Module:
    if name == "bottleneck":
        half = max(1, c // 2)
        return nn.Sequential(
            _conv(c, half, 1), *_gn_relu(half), _conv(half, half, 3), *_gn_relu(half),
            _near_zero_(_conv(half, c, 1)),
        )  # fmt: skip
    return _build_conv_seed(name, c, _conv, depthwise_k=3)


def _build_cnn1d(name: str, c: int) -> nn.Module:
    if name == "self_attention":
        return PositionAttention(c)
    return _build_conv_seed(name, c, _conv1d, depthwise_k=5)


def _mlp(d: int, hidden: int) -> nn.Module:
    return PreNorm(d, nn.Sequential(nn.Linear(d, hidden), nn.GELU(), _near_zero_(nn.Linear(hidden, d))))


def _build_transformer(name: str, d: int) -> nn.Module:
    if name == "noop":
        return Zero()
    if name == "norm":
        return NormSeed(nn.LayerNorm(d))
    if name == "lora":
        return LoRA(d, min(8, d))
    if name == "lora_large":
        return LoRA(d, min(32, d))
    if name == "mlp_small":
        return _mlp(d, d)
    if name == "attention":
        attn = CausalSelfAttention(d, n_heads_for(d, 4))
        _near_zero_(attn.proj)
        return PreNorm(d, attn)
    if name == "mlp":
        return _mlp(d, 4 * d)
    raise AssertionError(name)


def _build_mlp(name: str, d: int) -> nn.Module:
    if name == "noop":
        return Zero()
    if name == "norm":
        return NormSeed(nn.LayerNorm(d))
    if name == "lora":
        return LoRA(d, min(4, d))
    if name == "widen":
        return Widen(d, max(1, d // 4))
    if name == "mlp_small":
        return _mlp(d, max(1, d // 2))
    if name == "mlp":
        return _mlp(d, 2 * d)
    raise AssertionError(name)


_BUILDERS = {"cnn": _build_cnn, "cnn1d": _build_cnn1d, "transformer": _build_transformer, "mlp": _build_mlp}
#: The built-in catalogue of each family, as shipped (what a run of ``python -m esper.shell.run`` trained on).
BUILTIN_BLUEPRINTS: dict[str, tuple[str, ...]] = dict(BLUEPRINTS)
#: ``(family, name) -> builder(width)`` of the blueprints registered by
#: :func:`esper.shell.host.registry.register_blueprint` (the built-in ones are :data:`_BUILDERS`'s).
REGISTERED_BUILDERS: dict[tuple[str, str], Callable[[int], nn.Module]] = {}


def blueprint_index(family: str, name: str) -> int:
    """Index of ``name`` in ``BLUEPRINTS[family]`` (the blueprint head's action index)."""
    names = _names(family)
    if name not in names:
        raise ValueError(f"unknown {family} blueprint {name!r}; valid: {', '.join(names)}")
    return names.index(name)


def _names(family: str) -> tuple[str, ...]:
    if family not in BLUEPRINTS:
        raise ValueError(f"unknown host family {family!r}; valid: {', '.join(BLUEPRINTS)}")
    return BLUEPRINTS[family]


def build_blueprint(family: str, name: str, width: int) -> nn.Module:
    """Build blueprint ``name`` of host family ``family`` for activations of ``width`` channels (CNN)
    or features (transformer). The module maps ``x`` to a delta of ``x``'s shape."""
    blueprint_index(family, name)  # raises ValueError listing the valid names
    if width < 1:
        raise ValueError(f"build_blueprint: width must be >= 1, got {width}")
    registered = REGISTERED_BUILDERS.get((family, name))
    return registered(width) if registered is not None else _BUILDERS[family](name, width)


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


__all__ = [
    "BLUEPRINTS",
    "BLUEPRINT_KINDS",
    "BLUEPRINT_TRAITS",
    "BUILTIN_BLUEPRINTS",
    "FINAL_INIT_SCALE",
    "GLOBAL",
    "REGISTERED_BUILDERS",
    "CausalSelfAttention",
    "LoRA",
    "NormSeed",
    "PositionAttention",
    "PreNorm",
    "SqueezeExcite",
    "Widen",
    "Zero",
    "blueprint_index",
    "build_blueprint",
    "n_heads_for",
    "param_count",
]
