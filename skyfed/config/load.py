"""Loading a component's configuration dataclass from TOML, environment and flags.

Precedence, lowest first: dataclass defaults, the TOML file (by section: ``[rounds]
quorum = 3``), ``SKYFED_<COMPONENT>_<OPTION>`` environment variables, then command-line
flags that were given explicitly (both named flat: ``SKYFED_COORDINATOR_QUORUM``,
``--quorum``). A bad value is one line naming its section, key and value, and the file or
variable it came from.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

from skyfed.config.checks import ConfigError
from skyfed.config.sections import build, flat_keys, hint, route, sections

T = TypeVar("T")


def load_config(cls: type[T], *, component: str, path: Path | None, flags: dict[str, Any]) -> T:
    """Build ``cls`` from the layers above; unknown keys are an error that names them."""
    values: dict[str, Any] = {}
    sources: dict[tuple[str, ...], str] = {}
    if path is not None:
        values = _read_toml(cls, component, path)
        for name, value in values.items():
            if name in sections(cls) and isinstance(value, dict):
                sources.update({(name, key): str(path) for key in value})
            else:
                sources[("", name)] = str(path)
    prefix = f"SKYFED_{component.upper()}_"
    for name, where in flat_keys(cls).items():
        raw = os.environ.get(prefix + name.upper())
        if raw is not None:
            value = _parse_env(raw, hint(cls, where), prefix + name.upper())
            _merge(values, route(cls, {name: value}, component))
            sources[where if len(where) == 2 else ("", name)] = prefix + name.upper()
    given = {k: v for k, v in flags.items() if v is not None}
    _merge(values, route(cls, given, component))
    try:
        return build(cls, values, component)
    except ConfigError as exc:
        source = sources.get((exc.section, exc.key))
        raise (exc.at(source) if source else exc) from None


def _read_toml(cls: type, component: str, path: Path) -> dict[str, Any]:
    """The file's tables; an option written outside its section, or in another's, is
    named with where it belongs, and an unknown one with the file."""
    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None
    keys, whole = flat_keys(cls), sections(cls)
    for name, value in values.items():
        if name in whole and isinstance(value, dict):
            known = {f.name for f in dataclasses.fields(whole[name]) if f.init}
            for key in sorted(set(value) - known):
                _misplaced(keys.get(key), key, component, path, within=name)
                raise ValueError(
                    f"{path}: unknown {component} option in [{name}]: {key} "
                    f"(its options: {', '.join(sorted(known))})"
                )
            continue
        _misplaced(keys.get(name), name, component, path)
        if name not in keys and name not in whole:
            raise ValueError(f"{path}: unknown {component} option: {name}")
    return values


def _misplaced(
    where: tuple[str, ...] | None, name: str, component: str, path: Path, within: str = ""
) -> None:
    """Raise the one line that says which section the option ``name`` belongs in, if it
    belongs in one other than where the file wrote it (``within``; "": the top)."""
    if where is None or len(where) == 1 and not within:
        return
    if len(where) == 1:
        place, key = "the top of the file, before any [section]", name
    elif where[0] == within:
        return
    else:
        place, key = f"[{where[0]}]", where[1]
    written = f"[{within}] {name}" if within else name
    said = f" as {key}" if key != name else ""
    raise ValueError(
        f"{path}: {component} option {written} belongs in {place}{said}: move it there"
    )


def _merge(into: dict[str, Any], values: dict[str, Any]) -> None:
    """``values`` over ``into``, a section's table key by key."""
    for name, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(name), dict):
            into[name] = {**into[name], **value}
        else:
            into[name] = value


def _base_type(hint: Any) -> Any:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    if typing.get_origin(hint) is Literal:
        return type(typing.get_args(hint)[0])
    return typing.get_origin(hint) or hint


def _parse_env(raw: str, hint: Any, var: str) -> Any:
    kind = _base_type(hint)
    try:
        if kind is bool:
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if kind in (int, float):
            return kind(raw)
        if kind is Path:
            return Path(raw)
        if kind in (list, tuple):
            return [item.strip() for item in raw.split(",") if item.strip()]
        return raw
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a valid {kind.__name__}") from None
