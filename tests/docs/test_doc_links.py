"""Every relative link in README.md, docs/ and bench/results/ leads somewhere that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def pages() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted(DOCS.rglob("*.md")),
        *sorted(ROOT.glob("bench/results/*.md")),
    ]


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    return LINK.findall(text)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens,
    ``-1``, ``-2`` after a repeated heading."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for line in FENCE.sub("", page.read_text()).splitlines():
        if match := re.match(r"#{1,6}\s+(.*)", line):
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            n = counts.get(slug, 0)
            counts[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken(page: Path) -> list[str]:
    bad = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.name})")
    return bad


def test_every_relative_link_resolves():
    problems = {str(p.relative_to(ROOT)): broken(p) for p in pages()}
    problems = {page: bad for page, bad in problems.items() if bad}
    assert not problems, f"dangling links: {problems}"


def test_every_docs_page_is_on_the_map():
    index = DOCS / "index.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for t in links(index)}
    decisions = DOCS / "decisions"
    linked |= {(decisions / t.partition("#")[0]).resolve() for t in links(decisions / "README.md")}
    missing = [
        str(p.relative_to(ROOT))
        for p in DOCS.rglob("*.md")
        if p.resolve() not in linked and p != index
    ]
    assert not missing, f"pages not linked from docs/index.md (add them to the map): {missing}"


def test_link_checker_catches_a_dangling_link(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\nsee [b](b.md), [t](#title), [x](#nope)\n")
    assert broken(tmp_path / "a.md") == ["b.md (no such file)", "#nope (no heading #nope in a.md)"]
