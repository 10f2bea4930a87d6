"""The checks shared across skyfed: a configuration field's bound, which strings from a
peer are accepted and how a log line shows them, and which named metrics may travel."""

from __future__ import annotations

import math
from collections.abc import Mapping


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


MAX_METRICS = 16
"""Named metrics one report may carry: a site's (``skyfed.Site.report``) or an evaluation's."""
MAX_METRIC_NAME = 64
"""Characters of a metric's name."""
METRIC_BOUND = 1e30
"""A metric's value is finite and within this magnitude."""


def metrics_problem(metrics: Mapping[str, float]) -> str | None:
    """Why ``metrics`` cannot travel or be shown (too many, a name that is not a short
    printable token, a value that is not a finite number), or None: the one rule for a
    site's reports, an evaluation's results and the wire (docs/own-loop.md)."""
    if len(metrics) > MAX_METRICS:
        return f"{len(metrics)} metrics, at most {MAX_METRICS}"
    for name, value in metrics.items():
        if not isinstance(name, str) or not name or len(name) > MAX_METRIC_NAME:
            return f"metric name {str(name)[:80]!r} must be 1..{MAX_METRIC_NAME} characters"
        if not is_token(name):
            return f"metric name {printable(name)!r} must be printable with no space"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"metric {name!r} is a {type(value).__name__}, not a number"
        if not (math.isfinite(value) and abs(value) <= METRIC_BOUND):
            return f"metric {name!r} = {value!r} must be finite, within +-{METRIC_BOUND:g}"
    return None


def valid_metrics(metrics: Mapping[str, object]) -> tuple[dict[str, float], list[str]]:
    """The entries of ``metrics`` that may travel (the first ``MAX_METRICS`` that keep
    :func:`metrics_problem`'s rules), and why each other one was left out."""
    kept: dict[str, float] = {}
    dropped: list[str] = []
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            dropped.append(f"metric {str(name)[:80]!r} is a {type(value).__name__}, not a number")
            continue
        problem = metrics_problem({name: float(value)})
        if problem is None and len(kept) == MAX_METRICS:
            problem = f"metric {name!r}: more than {MAX_METRICS} metrics"
        if problem is not None:
            dropped.append(problem)
            continue
        kept[name] = float(value)
    return kept, dropped
