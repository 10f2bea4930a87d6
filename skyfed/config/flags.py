"""Command-line flags generated from configuration fields: one flag per flat option name
(``--quorum`` for ``[rounds] quorum``), typed by its annotation (a choice for a
``Literal``, a ``--x/--no-x`` pair for a bool), its help the first sentence of the field's
docstring with the dataclass default shown. So the flags follow the dataclasses, and a
section without flags (another part's table) says why in its field's metadata."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import click

from skyfed.config.docstrings import field_docs, first_sentence
from skyfed.config.sections import flat_keys, sections


def config_options(cls: type) -> Callable[[Any], Any]:
    """A click option for every flat option of ``cls``, in the dataclasses' order; each
    defaults to None, so TOML and environment values win over a flag not given."""

    def decorate(command: Any) -> Any:
        for name, path in reversed(flat_keys(cls).items()):
            command = _option(name, *_declared(cls, path))(command)
        return command

    return decorate


def _declared(cls: type, path: tuple[str, ...]) -> tuple[Any, Any, str]:
    """The annotated type, the default and the docstring of the option at ``path``."""
    owner = cls if len(path) == 1 else sections(cls)[path[0]]
    field = next(f for f in dataclasses.fields(owner) if f.name == path[-1])
    return typing.get_type_hints(owner)[path[-1]], field.default, field_docs(owner)[path[-1]]


def _option(name: str, hint: Any, default: Any, doc: str) -> Callable[[Any], Any]:
    flag = "--" + name.replace("_", "-")
    shown = {None: "none", "": '""'}.get(default, str(default))
    said = "[required]" if default is dataclasses.MISSING else f"[default: {shown}]"
    help_text = f"{first_sentence(doc)} {said}"
    if _plain(hint) is bool:
        return click.option(f"{flag}/--no-{flag[2:]}", name, default=None, help=help_text)
    return click.option(flag, name, type=_click_type(hint), help=help_text)


def _plain(hint: Any) -> Any:
    """``X`` for ``X | None``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        arms = [a for a in typing.get_args(hint) if a is not type(None)]
        return arms[0] if len(arms) == 1 else hint
    return hint


def _click_type(hint: Any) -> Any:
    kind = _plain(hint)
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        if all(isinstance(c, str) for c in choices):
            return click.Choice(choices)
        return type(choices[0])  # a number among a few: the configuration checks which
    if kind is Path:
        return click.Path(path_type=Path)
    return kind if kind in (int, float, str) else str


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
