"""The checks every configuration field goes through, and the one-line error a bad value
raises: the component, the section, the key and the value, so a user knows what to change
(and, where the configuration loader knows it, in which file)."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal


class ConfigError(ValueError):
    """A bad configuration value, said in one line:
    ``"<component> option [<section>] <key>=<value> must be <what>"`` (or, with a
    ``reason`` from a parser, ``"... <key>=<value>: <reason>"``)."""

    def __init__(
        self,
        component: str,
        key: str,
        value: object,
        what: str,
        *,
        section: str = "",
        reason: str = "",
        source: str = "",
    ) -> None:
        self.component, self.key, self.value = component, key, value
        self.what, self.section, self.reason = what, section, reason
        self.source = source
        """Where the value came from (a TOML file, an environment variable), if known."""
        where = f"[{section}] " if section else ""
        said = f"{source}: " if source else ""
        tail = f": {reason}" if reason else f" must be {what}"
        super().__init__(f"{said}{component} option {where}{key}={value!r}{tail}")

    def within(self, component: str, section: str) -> ConfigError:
        """The same error said as an option of ``component``'s ``[section]`` (a section
        whose dataclass belongs to another part: the link policy's ``[policy]``)."""
        return self._with(component=component, section=section)

    def at(self, source: str) -> ConfigError:
        """The same error naming where its value came from."""
        return self._with(source=source)

    def _with(self, **changed: str) -> ConfigError:
        said = {"component": self.component, "section": self.section, "source": self.source}
        said.update(changed)
        return ConfigError(
            said["component"],
            self.key,
            self.value,
            self.what,
            section=said["section"],
            reason=self.reason,
            source=said["source"],
        )


def require(
    component: str, ok: bool, field: str, value: object, what: str, *, section: str = ""
) -> None:
    """Unless ``ok``, raise the :class:`ConfigError` a user can act on."""
    if not ok:
        raise ConfigError(component, field, value, what, section=section)


def check_types(config: Any, component: str, section: str = "") -> None:
    """Every field of the dataclass ``config`` holds a value of its annotated type, or a
    :class:`ConfigError` names it (``min_agents = "three"``; a ``Literal``'s choices). A
    TOML integer for a ``float`` becomes a float, a string for a ``Path`` a path; nested
    configuration dataclasses are their own to check."""
    for name, hint in _hints(type(config)).items():
        value = getattr(config, name)
        ok, fixed = _conform(value, hint)
        if not ok:
            raise ConfigError(component, name, value, describe(hint), section=section)
        if fixed is not value:
            setattr(config, name, fixed)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """Each field's resolved annotation (resolved once per class)."""
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return _HINTS[cls]


def _conform(value: object, hint: Any) -> tuple[bool, object]:
    """Whether ``value`` fits ``hint``, and the value as the field keeps it."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        # 1 == True in Python; a choice of 1, 2 or 4 is not a boolean.
        return any(value == c and type(value) is type(c) for c in typing.get_args(hint)), value
    if origin is typing.Union or isinstance(hint, types.UnionType):
        for arm in typing.get_args(hint):
            ok, fixed = _conform(value, arm)
            if ok:
                return True, fixed
        return False, value
    if hint is type(None):
        return value is None, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False, value
        return True, value if isinstance(value, float) else float(value)
    if hint is str:
        return isinstance(value, str), value
    if hint is Path:
        return isinstance(value, str | Path), Path(value) if isinstance(value, str) else value
    return True, value  # a nested section, a callable: its own business


def describe(hint: Any) -> str:
    """A type as a user reads it in an error: ``an integer``, ``"sgd" or "nesterov"``."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return " or ".join(
            f'"{c}"' if isinstance(c, str) else repr(c) for c in typing.get_args(hint)
        )
    if origin is typing.Union or isinstance(hint, types.UnionType):
        arms = [a for a in typing.get_args(hint) if a is not type(None)]
        unset = " (or unset)" if len(arms) < len(typing.get_args(hint)) else ""
        return " or ".join(describe(a) for a in arms) + unset
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(hint, "a path" if hint is Path else getattr(hint, "__name__", str(hint)))
