"""The metrics and dashboard tables of docs/operations.md, generated from the catalog and
``deploy/grafana/skyfed.json``: ``python -m skyfed.metrics.reference`` rewrites them
(``--check``: exits 1 when they are stale)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from skyfed.files import regenerate
from skyfed.metrics.catalog import METRICS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "skyfed.json"
BLOCKS = ("metrics", "dashboard")
NAME = re.compile(r"\bskyfed_[a-z0-9_]+")


def metrics_table() -> str:
    rows = ["| metric | type | labels | exported by | meaning |", "|---|---|---|---|---|"]
    for m in METRICS:
        labels = ", ".join(f"`{label}`" for label in m.labels) or "-"
        rows.append(f"| `{m.name}` | {m.kind} | {labels} | {m.role} | {m.help} |")
    return "\n".join(rows)


def dashboard_table(dashboard: Path = DASHBOARD) -> str:
    panels = json.loads(dashboard.read_text())["panels"]
    rows = ["| panel | metrics |", "|---|---|"]
    for p in panels:
        names = sorted({n for t in p["targets"] for n in NAME.findall(t["expr"])})
        rows.append(f"| {p['title']} | {', '.join(f'`{n}`' for n in names)} |")
    return "\n".join(rows)


def render(page: str) -> str:
    """``page`` with every generated block replaced by its fresh table."""
    tables = {"metrics": metrics_table(), "dashboard": dashboard_table()}
    for block in BLOCKS:
        begin, end = f"<!-- generated:{block} -->", f"<!-- end:{block} -->"
        head, found, rest = page.partition(begin)
        if not found:
            raise ValueError(f"{PAGE} has no {begin} marker")
        _, _, tail = rest.partition(end)
        page = f"{head}{begin}\n{tables[block]}\n{end}{tail}"
    return page


def main(argv: list[str]) -> int:
    return regenerate(PAGE, render(PAGE.read_text()), "python -m skyfed.metrics.reference", argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
