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


def python_sources() -> list[Path]:
    skip = {".venv", ".git", "build", "node_modules"}
    return [
        p
        for p in sorted(ROOT.rglob("*.py"))
        if not skip & set(p.relative_to(ROOT).parts) and not p.name.endswith("_pb2.py")
    ]


def test_code_points_at_docs_pages_not_readme_sections():
    word = "READ" + "ME"  # spelt in two, so this line is not a hit itself
    pointer = re.compile(rf"\({word}[,)]|{word}, [A-Z]|{word}'s \"")
    hits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in python_sources()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pointer.search(line)
    ]
    assert not hits, f"point these at a docs/ page instead of a README section: {hits}"


def test_docs_pages_named_in_code_exist():
    named = re.compile(r"docs/[\w./-]+\.md")
    missing = [
        f"{p.relative_to(ROOT)}: {path}"
        for p in python_sources()
        for path in named.findall(p.read_text())
        if not (ROOT / path).exists()
    ]
    assert not missing, f"code names docs pages that do not exist: {missing}"


def test_every_measured_run_is_listed_in_results_md():
    listed = {(DOCS / t.partition("#")[0]).resolve() for t in links(DOCS / "results.md")}
    runs = sorted(ROOT.glob("bench/results/*.md"))
    missing = [str(p.relative_to(ROOT)) for p in runs if p.resolve() not in listed]
    assert not missing, f"runs not listed in docs/results.md (add a row for each): {missing}"


# A code comment cites a section as ``docs/<page>.md#anchor``, ``docs/<page>.md, "Heading"``
# or ``docs/<page>.md, Heading`` (capitalised, up to the next bracket, stop or ", ").
CITATION = re.compile(
    r"docs/(?P<page>[\w./-]+\.md)"
    r"(?:#(?P<anchor>[\w-]+)"
    r'|,\s+"(?P<quoted>[^"]+)"'
    r"|,\s+(?P<plain>[A-Z][^()\"\n.;:]*?)(?=[).;:]|,\s|$))"
)


def headings(page: Path) -> list[str]:
    """Each heading's text, lower case, without code marks."""
    text = FENCE.sub("", page.read_text())
    return [
        m.group(1).replace("`", "").strip().lower()
        for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)
    ]


def dead_citations(source: str) -> list[str]:
    """The section citations in ``source`` (comments joined across lines) that lead nowhere."""
    joined = re.sub(r"\s*\n\s*(?:#\s?)?", " ", source)
    bad = []
    for m in CITATION.finditer(joined):
        page = DOCS / m["page"]
        cited = m["anchor"] or m["quoted"] or m["plain"]
        if not page.exists():
            bad.append(f"docs/{m['page']} (no such page)")
        elif m["anchor"] and m["anchor"] not in anchors(page):
            bad.append(f"docs/{m['page']}#{cited} (no such heading)")
        elif not m["anchor"]:
            wanted = cited.replace("`", "").strip().lower()
            if not any(wanted in heading for heading in headings(page)):
                bad.append(f'docs/{m["page"]}, "{cited}" (no such heading)')
    return bad


def test_sections_cited_in_code_exist():
    sources = [p for p in python_sources() if p != Path(__file__).resolve()]  # not the examples
    dead = [f"{p.relative_to(ROOT)}: {d}" for p in sources for d in dead_citations(p.read_text())]
    assert not dead, f"code cites docs sections that do not exist (fix the citation): {dead}"


def test_citation_checker_catches_a_dead_section():
    source = (
        "x = 1  # the mean (docs/scale.md, The aggregate), then the rest\n"
        '# see docs/wan.md#overlap and docs/wan.md, "No such\n'
        '# heading"; docs/scale.md, Nowhere). Also docs/scale.md#nope.\n'
    )
    assert dead_citations(source) == [
        'docs/wan.md, "No such heading" (no such heading)',
        'docs/scale.md, "Nowhere" (no such heading)',
        "docs/scale.md#nope (no such heading)",
    ]
