"""docs/operations.md's metric and dashboard tables are the generated ones."""

from __future__ import annotations

from skyfed.metrics.reference import PAGE, render


def test_operations_page_tables_are_fresh():
    page = PAGE.read_text()
    assert render(page) == page, "stale: run python -m skyfed.metrics.reference"
