"""Blueprints of the user's own: :func:`register_blueprint` adds one to a family's registry
(:data:`~esper.shell.host.blueprints.BLUEPRINTS`), where everything that reads a host's catalogue finds
it: :meth:`~esper.shell.host.hosts.Host.germinate` builds it, the blueprint head offers it (the action
space is sized by the catalogue, :class:`~esper.core.spec.ActionSpec`), the masks and the parameter cap
count it (:meth:`~esper.shell.host.hosts.Host.germination_cost`), the set policy describes it by its
traits (:mod:`esper.shell.host.descriptors`), the heuristic rotates through it after its own list, and a
fixed plan names it (``grow:SLOT=NAME``)::

    from esper.shell.host.registry import register_blueprint

    class ChannelScale(nn.Module):          # a delta of x's shape, exactly zero at germination
        def __init__(self, c):
            super().__init__()
            self.s = nn.Parameter(torch.zeros(c))
        def forward(self, x):               # x: [N, C, L]
            return x * self.s[:, None]

    register_blueprint("cnn1d", "channel_scale", ChannelScale, kind="normalization")

**Where it goes.** A family's registry is the blueprint head's index order, sorted by size (smallest
first). A registered blueprint is placed after every blueprint of the family whose parameter count at
the family's reference width (:data:`REFERENCE_WIDTH`) is at most its own (``params``: that count; by
default it is built there once and counted), so the order stays by size; the blueprints after it move
one index up. Register before any host, environment or controller is built (at import time of the
module that defines it, so that every process of a run has it), and keep it for the process's life:
hosts (a Grower's included) and controllers built before keep the catalogue they were built with, by
name, builders included (:meth:`~esper.shell.host.hosts.Host.keep_catalogue`).

**Widths.** Registration builds and runs the seed at the family's :data:`REFERENCE_WIDTH` only
(:func:`seed_misfit`); a :class:`~esper.shell.user.grower.Grower` runs the same check on every blueprint
of its catalogue at every width its slots have, and refuses one that fails in one line naming the
blueprint, the slot and the width (an 8-head attention registered at width 32, on a slot of width 12).
The builder is what builds each seed afresh (a class, a function), never a module instance.

**Which controllers act on it.** The heuristic, ``grow_all:NAME``, fixed plans and the host-agnostic
learned controller (``ppo.policy set``: it reads each blueprint's kind, receptive field and size, never
its index) act on any catalogue. A flat-policy controller (``ppo.policy flat``) has a blueprint head
and an observation sized by the catalogue it trained on, the family's built-in one
(:data:`~esper.shell.host.blueprints.BUILTIN_BLUEPRINTS`): on a host whose catalogue has a registered
blueprint it does not fit, and :func:`esper.shell.eval.fits.check_controller_fits` refuses it in one
line.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import nn

from esper.shell.host.blueprints import (
    BLUEPRINT_KINDS,
    BLUEPRINT_TRAITS,
    BLUEPRINTS,
    BUILTIN_BLUEPRINTS,
    GLOBAL,
    REGISTERED_BUILDERS,
    build_blueprint,
    param_count,
)

#: The width at which a family's blueprints are counted to place a registered one (the middle of the
#: widths the registry's order is checked at, ``tests/shell/host/test_blueprints.py``).
REFERENCE_WIDTH = {"cnn": 32, "cnn1d": 8, "transformer": 64, "mlp": 32}
#: A small activation of each family at width ``w``: what a registered builder's module is checked on.
_PROBES: dict[str, Callable[[int], tuple[int, ...]]] = {
    "cnn": lambda w: (2, w, 4, 4),
    "cnn1d": lambda w: (2, w, 8),
    "transformer": lambda w: (2, 4, w),
    "mlp": lambda w: (2, w),
}
#: A blueprint's name: what a plan (``grow:SLOT=NAME+...@STYLE``) and the events can carry.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _line(error: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def seed_misfit(
    family: str, builder: Callable[[int], nn.Module], width: int
) -> tuple[nn.Module | None, str | None]:
    """``(the seed, None)`` where ``builder(width)`` is a seed for ``family`` activations of ``width``
    channels (features): it builds an ``nn.Module`` that maps a small activation of that width to a delta
    of its shape; else ``(None, why not)``, one line (the build or the forward raised, naming the error,
    or the delta's shape is not the input's). Neither draw touches the caller's generator."""
    with torch.random.fork_rng(devices=[]):
        try:
            seed = builder(width)
        except Exception as e:  # any error of the user's builder is reported, in one line
            return None, f"building it at width {width} fails ({_line(e)})"
        if not isinstance(seed, nn.Module):
            return None, f"builder({width}) gave a {type(seed).__name__}, not an nn.Module"
        x = torch.randn(_PROBES[family](width))
        try:
            with torch.no_grad():
                d = seed(x)
        except Exception as e:
            return None, f"its forward on a {family} activation {list(x.shape)} fails ({_line(e)})"
    if not isinstance(d, torch.Tensor) or d.shape != x.shape:
        got = list(d.shape) if isinstance(d, torch.Tensor) else type(d).__name__
        return (
            None,
            f"it maps a {family} activation {list(x.shape)} to {got}; a seed's delta has its input's shape",
        )
    return seed, None


def _counts(family: str, width: int) -> list[int]:
    return [param_count(build_blueprint(family, b, width)) for b in BLUEPRINTS[family]]


def register_blueprint(
    family: str,
    name: str,
    builder: Callable[[int], nn.Module],
    *,
    kind: str,
    reach: int = 1,
    params: int | None = None,
) -> int:
    """Add blueprint ``name`` to ``family``'s registry; returns its index there (the blueprint head's).

    ``builder(width) -> nn.Module``: a fresh seed for activations of ``width`` channels (``cnn``,
    ``cnn1d``) or features (``transformer``, ``mlp``), mapping ``x`` to a delta of ``x``'s shape (start
    it at or near zero, as the built-in ones do, so blending starts from the host's own function).
    ``kind`` (one of :data:`~esper.shell.host.blueprints.BLUEPRINT_KINDS` but ``identity``) and
    ``reach`` (its receptive field in positions, :data:`~esper.shell.host.blueprints.GLOBAL` = 0 for
    every position) are what the set policy knows of it. ``params``: its parameter count at
    :data:`REFERENCE_WIDTH`, which places it in the registry (default: built there and counted). The
    builder is run once here, on that width, without touching the global generator; one-line
    ValueErrors for a family, name, kind or module that does not fit."""
    if family not in BLUEPRINTS:
        raise ValueError(f"register_blueprint: unknown family {family!r}; families: {', '.join(BLUEPRINTS)}")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"register_blueprint: a name is letters, digits and _ (not first a digit), got {name!r}"
        )
    if name in BLUEPRINTS[family]:
        raise ValueError(f"register_blueprint: {family} has a blueprint {name!r} already")
    kinds = [k for k in BLUEPRINT_KINDS if k != "identity"]
    if kind not in kinds:
        raise ValueError(f"register_blueprint: kind must be one of {', '.join(kinds)}, got {kind!r}")
    if isinstance(reach, bool) or not isinstance(reach, int) or reach < 0:
        raise ValueError(f"register_blueprint: reach is positions >= 1, or GLOBAL ({GLOBAL}), got {reach!r}")
    if isinstance(builder, nn.Module):
        kind_of = type(builder).__name__
        raise ValueError(
            f"register_blueprint: builder is a {kind_of} instance; pass what builds a fresh one per seed, "
            f"callable(width) -> nn.Module (the class {kind_of}, or lambda width: {kind_of}(...))"
        )
    if not callable(builder):
        raise ValueError(f"register_blueprint: builder must be callable(width) -> nn.Module, got {builder!r}")
    width = REFERENCE_WIDTH[family]
    seed, why = seed_misfit(family, builder, width)
    if why is not None:
        raise ValueError(f"register_blueprint: {name}: {why}")
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was
        size = param_count(seed) if params is None else int(params)
        counts = _counts(family, width)
    names = BLUEPRINTS[family]
    at = sum(1 for c in counts if c <= size)  # after every blueprint no larger: the order stays by size
    BLUEPRINTS[family] = (*names[:at], name, *names[at:])
    BLUEPRINT_TRAITS[family][name] = (kind, reach)
    REGISTERED_BUILDERS[(family, name)] = builder
    return at


def unregister_blueprint(family: str, name: str) -> None:
    """Take a registered blueprint out of ``family``'s registry (the built-in ones stay)."""
    if (family, name) not in REGISTERED_BUILDERS:
        raise ValueError(f"unregister_blueprint: {name!r} is not a registered {family} blueprint")
    del REGISTERED_BUILDERS[(family, name)]
    del BLUEPRINT_TRAITS[family][name]
    BLUEPRINTS[family] = tuple(b for b in BLUEPRINTS[family] if b != name)


def registered_blueprints(family: str) -> tuple[str, ...]:
    """The blueprints registered into ``family``, in its registry's order (none: ``()``)."""
    return tuple(b for b in BLUEPRINTS.get(family, ()) if b not in BUILTIN_BLUEPRINTS.get(family, ()))


__all__ = [
    "REFERENCE_WIDTH",
    "register_blueprint",
    "registered_blueprints",
    "seed_misfit",
    "unregister_blueprint",
]
