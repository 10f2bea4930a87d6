"""docs/index.md groups every page by kind, and an explanation page stays short enough to
read: what the system does and why, with today's figures, not a diary of runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "docs" / "index.md"
KINDS = ("Tutorial", "How-to guides", "Explanation", "Reference")
MOST_LINES = 300


def section(kind: str) -> list[Path]:
    """The pages the index lists under ``## kind``."""
    text = INDEX.read_text()
    body = text.split(f"\n## {kind}\n", 1)[1].split("\n## ", 1)[0]
    targets = re.findall(r"\]\(([^)#\s]+)", body)
    return [(INDEX.parent / t).resolve() for t in targets if t.endswith(".md")]


def test_the_index_has_the_four_kinds():
    for kind in KINDS:
        assert f"\n## {kind}\n" in INDEX.read_text(), f"docs/index.md has no '## {kind}' section"
        assert section(kind), f"docs/index.md lists no page under '## {kind}'"


def test_no_explanation_page_is_over_300_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in section("Explanation")
        if (n := len(p.read_text().splitlines())) > MOST_LINES
    }
    assert not long, (
        f"explanation pages over {MOST_LINES} lines: {long}; move run history to bench/results/ "
        "and closed experiments to docs/decisions/"
    )
