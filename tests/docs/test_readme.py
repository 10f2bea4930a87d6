"""The README stays the front door: short, with the two commands that CI and a newcomer run."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_readme_stays_short():
    lines = len(README.splitlines())
    assert lines <= 200, f"README.md has {lines} lines: move the detail into a docs/ page"


def test_readme_gives_the_demo_and_the_test_command():
    assert "pip install -c constraints.txt torch==2.13.0 -e . && skyfed demo" in README
    assert "bash .ci/run" in README


def test_the_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'install -q -c constraints.txt torch==2.13.0 -e ".[test]"' in ci
    assert "python3 -m venv --clear" in ci  # a fresh venv: the pins alone decide
    assert "python -m pytest" in ci


def test_the_readme_demo_output_has_the_rows_the_demo_prints():
    block = README.split("## The demo", 1)[1].split("```", 2)[1]
    cells = [[c.strip() for c in line.split("│") if c.strip()] for line in block.splitlines()]
    shown = [row[0] for row in cells if len(row) == 2]
    # The demo's own rows, and the run summary it shares with `coordinator serve`.
    source = "".join((ROOT / f).read_text() for f in ("skyfed/demo.py", "coordinator/admin.py"))
    printed = {label.strip() for label in re.findall(r'add_row\(\s*f?"([^"{]+)', source)}
    unknown = [label for label in shown if label not in printed and label.split()[0] not in printed]
    assert shown and not unknown, (
        f"README's demo output shows rows the demo no longer prints: {unknown}"
    )
