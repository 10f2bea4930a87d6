"""The project speaks of the system and its runs, never of how its work was organised: no
work-log labels (sittings, run counters, branch tags, issue numbers, people) in docs, the
README, bench texts and file names, code, comments or tests."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".venv", ".git", "build", "node_modules", "__pycache__", "skyfed.egg-info"}
TEXT = {".md", ".py", ".toml", ".yml", ".yaml", ".sh", ".txt", ".cfg", ".proto", ".json"}
NAMED = {"Makefile", "Dockerfile", "run", "system-packages"}

# Each pattern is a kind of label; none fires on the words the system uses for itself (a
# gRPC session, a `Session` class, "round 3", the lab's `wan0` device, "DiLoCo's 0.7").
LABELS = {
    "a sitting's number": r"\bsessions? ?\d+\b|\bsittings? ?\d+\b",
    "a stop's number": r"\bstops? \d+\b",
    "a run counted across work": r"\brun \d+ of\b",
    "a branch tag": r"\b(?:diloco|large|topk|scale|codecs|stripe)\d+\b|\bwan[1-9]\d*\b",
    "an issue number": r"(?<![\w&/#])#\d{1,3}(?![\w;])|\bissues? #?\d+",
    "a person": r"\bthe lead\b|\blead's\b|\bhelpers?'|\bhelper's\b|\bengineers'|\b(?:an)?other engineers?\b",
}
PATTERN = re.compile("|".join(f"(?P<k{i}>{p})" for i, p in enumerate(LABELS.values())), re.I)
KINDS = list(LABELS)


def texts() -> list[Path]:
    files = []
    for path in sorted(ROOT.rglob("*")):
        parts = set(path.relative_to(ROOT).parts)
        if SKIP_DIRS & parts or not path.is_file() or path.name.endswith("_pb2.py"):
            continue
        if path.suffix in TEXT or path.name in NAMED:
            files.append(path)
    return files


def labels_in(text: str) -> list[str]:
    """Each label in ``text`` with its kind, as ``kind: 'label'``."""
    found = []
    for m in PATTERN.finditer(text):
        kind = KINDS[int(next(k for k, v in m.groupdict().items() if v)[1:])]
        found.append(f"{kind}: {m.group(0)!r}")
    return found


def test_no_work_log_labels_in_any_text():
    this = Path(__file__).resolve()
    hits = [
        f"{p.relative_to(ROOT)}:{n}: {label}"
        for p in texts()
        if p != this  # the patterns and their examples below
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        for label in labels_in(line)
    ]
    assert not hits, "speak of the system and the run, not of the work log:\n" + "\n".join(hits)


def test_no_work_log_labels_in_file_names():
    names = [
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*")
        if not SKIP_DIRS & set(p.relative_to(ROOT).parts) and labels_in(p.stem.replace("-", " "))
    ]
    assert not names, f"name these for what they hold, dated where they are runs: {names}"


def test_the_patterns_catch_labels_and_spare_the_systems_own_words():
    caught = [
        "as in session 26",
        "session26's tree",
        "see diloco13",
        "(large3)",
        "stop 34",
        "run 3 of 5",
        "branch topk6",
        "wan3's tip",
        "#25's goal",
        "(issue #20 item 1)",
        "the lead's fix",
        "helpers' benches",
        "other engineers' work",
    ]
    spared = [
        "the agent's session ends",
        "class Session:",
        "round 3 closed",
        "dev wan0",
        "DiLoCo's 0.7/0.9",
        "color: #222;",
        "PKCS#8 PEM",
        "a stop at round 5",
        "#0072B2",
        "the bench's run 2",
        "Top-k's lead over FP16",
    ]
    assert [t for t in caught if not labels_in(t)] == []
    assert [(t, labels_in(t)) for t in spared if labels_in(t)] == []
