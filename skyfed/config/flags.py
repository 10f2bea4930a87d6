"""Command-line flags from configuration fields: every field a flag (or a stated reason
why not), and every flag's ``--help`` showing the dataclass default."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

NO_FLAG: dict[str, str] = {
    "monitor": "a TOML table of several fields ([monitor] in --config); see docs/configuration.md",
    "policy": "a TOML table ([policy] in --config); --policy sets its mode",
}
"""Fields with no flag of their own, and why (docs/operations.md, "Flags")."""


def field_flags(cls: type, specs: dict[str, tuple[Any, str]]) -> Callable[[Any], Any]:
    """Options ``--field-name`` for ``specs`` (field: (type, help)) of config ``cls``."""

    def decorate(command: Any) -> Any:
        for name, (kind, text) in reversed(specs.items()):
            flag = "--" + name.replace("_", "-")
            command = click.option(flag, name, type=kind, help=text)(command)
        return command

    return decorate


def log_options(command: Any) -> Any:
    """``--log-format`` and ``--log-level``, alike on every command that serves."""
    from skyfed.logs import FORMATS, LOG_LEVELS

    command = click.option(
        "--log-level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default=None,
        help="Log level (default INFO, or $SKYFED_LOG_LEVEL).",
    )(command)
    return click.option(
        "--log-format", type=click.Choice(FORMATS), help="Log lines as text or JSON. [text]"
    )(command)


def metrics_options(command: Any) -> Any:
    """``--metrics-listen`` and ``--metrics-public`` (docs/operations.md)."""
    command = click.option(
        "--metrics-public",
        is_flag=True,
        default=None,
        help="Allow --metrics-listen on a non-loopback address.",
    )(command)
    return click.option(
        "--metrics-listen", help="HOST:PORT for /metrics, /healthz, /readyz (plain HTTP; off)."
    )(command)


def show_defaults(command: click.Command, cls: type) -> click.Command:
    """Append each config field's default to the help of the option that sets it (the
    options themselves default to None, so that TOML and environment values can win)."""
    defaults = {
        f.name: f.default
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING and f.name not in NO_FLAG
    }
    for param in command.params:
        if isinstance(param, click.Option) and param.name in defaults:
            shown = defaults[param.name]
            default = f"[default: {'none' if shown is None else shown}]"
            param.help = f"{param.help} {default}" if param.help else default
    return command


def missing_flags(command: click.Command, cls: type) -> list[str]:
    """Config fields with neither a flag nor a reason in :data:`NO_FLAG`."""
    names = {p.name for p in command.params}
    return [f.name for f in dataclasses.fields(cls) if f.name not in names | set(NO_FLAG)]
