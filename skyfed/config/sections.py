"""A configuration by sections, and the one map from flat option names to them.

A component's dataclass holds a few scalars and a section per concern, each a dataclass of
its own. A TOML file names the sections (``[rounds] quorum = 3``); flags, environment
variables and keyword arguments name options flat (``--quorum``, ``quorum=3``), each name
belonging to one section. A section that is another part's table (the link policy's
``[policy]``) has no flat names of its own, save those its field's :func:`table` metadata
lends it (``--policy`` for its ``mode``), and says why.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from skyfed.config.checks import ConfigError

T = TypeVar("T")

TABLE = "skyfed.table"
"""Field metadata of a section that is a table of its own: why it has no flags."""
ALIASES = "skyfed.flags"
"""Field metadata of such a table: the flat names that still reach into it, {name: key}."""


def table(why: str, **aliases: str) -> dict[str, Any]:
    """The metadata of a section kept as a table of its own (no flat names), saying
    ``why``; ``aliases`` lend some of its keys a flat name (``policy="mode"``)."""
    return {TABLE: why, ALIASES: aliases}


def sections(cls: type) -> dict[str, type]:
    """The fields of ``cls`` that are sections: their names and dataclasses."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)
        if dataclasses.is_dataclass(hints[f.name])
    }


def tables(cls: type) -> dict[str, str]:
    """The sections of ``cls`` kept as tables of their own, and why they have no flags."""
    return {f.name: f.metadata[TABLE] for f in dataclasses.fields(cls) if TABLE in f.metadata}


def flat_keys(cls: type) -> dict[str, tuple[str, ...]]:
    """Every flat option name of ``cls`` and where it lives: ``("task",)`` for a field of
    its own, ``("rounds", "quorum")`` for a section's."""
    keys: dict[str, tuple[str, ...]] = {}
    for f in dataclasses.fields(cls):
        kind = sections(cls).get(f.name)
        found: dict[str, tuple[str, ...]]
        if kind is None:
            found = {f.name: (f.name,)}
        elif TABLE in f.metadata:
            found = {flat: (f.name, key) for flat, key in f.metadata[ALIASES].items()}
        else:
            found = {g.name: (f.name, g.name) for g in dataclasses.fields(kind) if g.init}
        twice = sorted(set(found) & set(keys))
        assert not twice, f"{cls.__name__}: options named twice: {twice}"
        keys.update(found)
    return keys


def hint(cls: type, path: tuple[str, ...]) -> Any:
    """The annotated type of the option at ``path``."""
    owner = cls if len(path) == 1 else sections(cls)[path[0]]
    return typing.get_type_hints(owner)[path[-1]]


def route(cls: type, flat: Mapping[str, Any], component: str) -> dict[str, Any]:
    """Options named flat (flags, environment, keyword arguments) in the shape a TOML file
    has: each in its section's table. A section may also be given whole, as a table or
    its dataclass; a flat option of it then goes into it."""
    nested: dict[str, Any] = {}
    keys, whole = flat_keys(cls), sections(cls)
    given = {k: v for k, v in flat.items() if k in whole and isinstance(v, dict | whole[k])}
    for name, value in given.items():
        nested[name] = value
    for name, value in flat.items():
        if name in given:
            continue
        if name not in keys:
            raise ValueError(f"unknown {component} option: {name}")
        path = keys[name]
        if len(path) == 1:
            nested[name] = value
        else:
            section = nested.get(path[0], {})
            nested[path[0]] = {**as_table(section), path[1]: value}
    return nested


def as_table(section: object) -> dict[str, Any]:
    """A section as a table of its keys (a table stays one)."""
    if isinstance(section, dict):
        return section
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section) if f.init}  # type: ignore[arg-type]


def build(cls: type[T], values: Mapping[str, Any], component: str) -> T:
    """``cls`` from values shaped as a TOML file is (a table per section); an unknown key
    or a value out of bounds is a one-line ValueError naming it and its section."""
    whole, keys = sections(cls), flat_keys(cls)
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        if name in whole:
            kwargs[name] = _section(whole[name], value, component, name)
        elif name in keys:
            kwargs[name] = value
        else:
            raise ValueError(f"unknown {component} option: {name}")
    return cls(**kwargs)


def _section(kind: type, value: object, component: str, name: str) -> Any:
    if isinstance(value, kind):
        return value
    if not isinstance(value, dict):
        what = f"a table of {name}'s options ([{name}] in TOML)"
        raise ConfigError(component, name, value, what)
    known = [f.name for f in dataclasses.fields(kind) if f.init]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(
            f"unknown {component} option(s) in [{name}]: {', '.join(unknown)} "
            f"(its options: {', '.join(known)})"
        )
    try:
        return kind(**value)
    except ConfigError as exc:
        raise exc.within(component, name) if exc.section != name else exc from None


def from_flat(cls: type[T], component: str, options: Mapping[str, Any]) -> T:
    """``cls`` from options named flat (``quorum=3``), as flags and the environment name
    them; what keyword arguments in tests and tools use."""
    return build(cls, route(cls, options, component), component)
