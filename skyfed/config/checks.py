"""The checks every configuration field goes through, and the one-line error a bad value
raises."""

from __future__ import annotations


def require(component: str, ok: bool, field: str, value: object, what: str) -> None:
    """Unless ``ok``, raise the one-line ``ValueError`` a user can act on:
    ``"<component> option <field>=<value> must be <what>"``."""
    if not ok:
        raise ValueError(f"{component} option {field}={value!r} must be {what}")
