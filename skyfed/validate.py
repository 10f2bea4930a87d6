"""The checks shared across skyfed: a configuration field's bound, and which strings from a
peer are accepted and how a log line shows them."""

from __future__ import annotations


def require(component: str, ok: bool, field: str, value: object, what: str) -> None:
    """Unless ``ok``, raise the one-line ``ValueError`` a user can act on:
    ``"<component> option <field>=<value> must be <what>"``."""
    if not ok:
        raise ValueError(f"{component} option {field}={value!r} must be {what}")


def is_token(text: str) -> bool:
    """A name, codec, digest or URI as a peer may send it: printable, with no space. No
    newline, tab, ESC or bidi control can reach a log line or a terminal through one."""
    return text.isprintable() and " " not in text


def is_text(text: str) -> bool:
    """Free text a peer may send (a task reference, a refusal's reason): printable,
    spaces allowed, no control character."""
    return text.isprintable()


def printable(text: str) -> str:
    """``text`` as a log line may show it: any control character escaped (``\\n``,
    ``\\x1b``), so a string from a peer cannot forge or colour a line."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
