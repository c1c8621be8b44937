"""Generic helpers for frozen, slotted config dataclasses: documented fields, strict conversion to and
from plain dicts (unknown keys rejected), and typed parsing of ``section.field=value`` overrides.

Field docs live in ``field(metadata={"doc": ...})`` (use :func:`doc`); they become the CLI's help. A
field's bounds live there too (``doc(0.9, "...", ge=0, lt=1)``), and :func:`check_fields` validates every
field of a config against them in one place: every float must be finite (NaN and ±Inf are never a
meaningful setting; ``None`` is how an optional field says "off"), every number inside its bounds, and
tuples element by element. Each config's ``__post_init__`` calls it, so a bad value fails at parse time
with one line naming the field.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from typing import Any

#: Bound keywords of :func:`doc`, with the comparison each one demands of a value.
BOUNDS = {"ge": (">=", float.__ge__), "gt": (">", float.__gt__), "le": ("<=", float.__le__),
          "lt": ("<", float.__lt__)}  # fmt: skip


def doc(
    default: Any,
    text: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A dataclass field with a default, a one-line doc and optional bounds (checked by
    :func:`check_fields` on every number of the field: the value, or each element of a tuple)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use an immutable default (tuple) for config fields")
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    return dataclasses.field(default=default, metadata={"doc": text, **bounds})


def check_fields(cfg: Any, section: str = "") -> None:
    """Validate every field of the config dataclass ``cfg`` (not its nested sections): floats finite,
    numbers inside the bounds of their :func:`doc`, tuples element by element, ``None`` allowed.

    Raises:
        ValueError: one line naming the first bad field, ``"{section}.{name} must be ..., got ..."``.
    """
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        name = _join(section, f.name)
        for v in value if isinstance(value, tuple) else (value,):
            _check_number(v, name, f.metadata)


def _check_number(v: Any, name: str, meta: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    failed = [key for key, (_, ok) in BOUNDS.items() if key in meta and not ok(float(v), float(meta[key]))]
    if failed:
        raise ValueError(f"{name} must be {_describe(meta)}, got {v}")


def _describe(meta: Any) -> str:
    """``"in [0, 1)"`` for a two-sided bound, ``"> 0"`` for a one-sided one."""
    low = next((k for k in ("ge", "gt") if k in meta), None)
    high = next((k for k in ("le", "lt") if k in meta), None)
    num = lambda x: f"{x:g}" if isinstance(x, float) else str(x)
    if low and high:
        left, right = "[" if low == "ge" else "(", "]" if high == "le" else ")"
        return f"in {left}{num(meta[low])}, {num(meta[high])}{right}"
    key = low or high
    return f"{BOUNDS[key][0]} {num(meta[key])}"


def to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain dict (enums by name, tuples as lists) — JSON-ready."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            out[f.name] = to_dict(v)
        elif isinstance(v, enum.Enum):
            out[f.name] = v.name
        elif isinstance(v, tuple):
            out[f.name] = list(v)
        else:
            out[f.name] = v
    return out


def from_dict(cls: type, data: dict[str, Any], *, path: str = "") -> Any:
    """Build ``cls`` from a nested dict; unknown keys raise, missing keys keep their defaults."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown config key(s) {[_join(path, k) for k in unknown]}; valid: {sorted(names)}")
    kwargs = {}
    for name, value in data.items():
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ValueError(f"{_join(path, name)} is a section (a dict of fields), got {value!r}")
            kwargs[name] = from_dict(tp, value, path=_join(path, name))
        else:
            kwargs[name] = coerce(tp, value, name=_join(path, name))
    return cls(**kwargs)


def fields_flat(cfg_cls: type, prefix: str = "") -> list[tuple[str, Any, str]]:
    """``[(dotted name, type, doc)]`` of every leaf field, nested sections included."""
    out = []
    hints = typing.get_type_hints(cfg_cls)
    for f in dataclasses.fields(cfg_cls):
        tp = hints[f.name]
        name = _join(prefix, f.name)
        if dataclasses.is_dataclass(tp):
            out.extend(fields_flat(tp, name))
        else:
            out.append((name, tp, f.metadata.get("doc", "")))
    return out


def with_overrides(cfg: Any, overrides: dict[str, Any]) -> Any:
    """Return ``cfg`` with dotted-path overrides applied (``{"ppo.lr": "1e-4"}``); strings are parsed
    by the field's type. All overrides of one section are applied together, so validation that ties
    fields of a section (``env.task`` and ``env.data_path``) sees the final values. Unknown paths
    raise with the valid ones listed."""
    tree: dict[str, Any] = {}
    for dotted, value in overrides.items():
        node = tree
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"option {dotted!r} conflicts with another option")
        node[leaf] = (dotted, value)
    return _apply(cfg, tree)


def _apply(cfg: Any, tree: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(type(cfg))
    changes = {}
    for name, sub in tree.items():
        dotted = sub[0] if isinstance(sub, tuple) else name
        if name not in hints:
            valid = sorted(n for n, _, _ in fields_flat(type(cfg)))
            raise ValueError(f"unknown option {dotted!r}; valid options: {', '.join(valid)}")
        current = getattr(cfg, name)
        if isinstance(sub, tuple):
            if dataclasses.is_dataclass(current):
                raise ValueError(f"{dotted!r} is a section; set one of its fields, e.g. {dotted}.<field>")
            changes[name] = coerce(hints[name], sub[1], name=dotted)
        else:
            if not dataclasses.is_dataclass(current):
                raise ValueError(f"unknown option: {name!r} is not a section")
            changes[name] = _apply(current, sub)
    return dataclasses.replace(cfg, **changes)


def coerce(tp: Any, value: Any, *, name: str) -> Any:
    """Convert ``value`` (often a CLI string) to the annotated type ``tp`` or raise a clear error."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(arg, value, name=name)
            except (TypeError, ValueError) as e:
                errors.append(str(e))
        raise ValueError(f"{name}: cannot read {value!r} as {tp}: {'; '.join(errors)}")
    if origin is tuple:
        if not isinstance(value, (str, list, tuple)):
            raise ValueError(f"{name}: {value!r} is not a list (comma-separated on the CLI)")
        items = value.split(",") if isinstance(value, str) else list(value)
        items = [i.strip() for i in items] if isinstance(value, str) else items
        items = [i for i in items if i != ""]
        inner = args[0] if args else str
        return tuple(coerce(inner, i, name=name) for i in items)
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{name}: {value!r} is not one of {list(args)}")
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        key = str(value).upper()
        if key not in tp.__members__:
            raise ValueError(f"{name}: {value!r} is not one of {list(tp.__members__)}")
        return tp[key]
    if tp is bool:
        if isinstance(value, bool):
            return value
        s = str(value).lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name}: {value!r} is not a boolean (true/false)")
    if tp is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"{name}: {value!r} is not an integer")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: {value!r} is not an integer") from None
    if tp is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: {value!r} is not a number") from None
    if tp is str:
        if value is None or isinstance(value, (list, tuple, dict, set)):
            raise ValueError(f"{name}: {value!r} is not a string")
        return str(value)
    if tp is Any:
        return value
    raise TypeError(f"{name}: unsupported config type {tp}")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
