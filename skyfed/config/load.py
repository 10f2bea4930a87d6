"""Loading a component's configuration dataclass from TOML, environment and flags.

Precedence, lowest first: dataclass defaults, the TOML file, ``SKYFED_<COMPONENT>_<FIELD>``
environment variables, then command-line flags that were given explicitly.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def load_config(cls: type[T], *, component: str, path: Path | None, flags: dict[str, Any]) -> T:
    """Build ``cls`` from the layers above; unknown keys are an error that names them."""
    values: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as f:
            values.update(tomllib.load(f))
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{path}: unknown {component} option(s): {', '.join(unknown)}")
    prefix = f"SKYFED_{component.upper()}_"
    for name in names:
        env = os.environ.get(prefix + name.upper())
        if env is not None:
            values[name] = _parse_env(env, hints[name], prefix + name.upper())
    values.update({k: v for k, v in flags.items() if v is not None})
    return cls(**_coerce(values, hints))


def _coerce(values: dict[str, Any], hints: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in values.items():
        kind = _base_type(hints[name])
        out[name] = Path(value) if kind is Path and value is not None else value
    return out


def _base_type(hint: Any) -> Any:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return typing.get_origin(hint) or hint


def _parse_env(raw: str, hint: Any, var: str) -> Any:
    kind = _base_type(hint)
    try:
        if kind is bool:
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if kind in (int, float):
            return kind(raw)
        if kind in (list, tuple):
            return [item.strip() for item in raw.split(",") if item.strip()]
        return raw
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a valid {kind.__name__}") from None
