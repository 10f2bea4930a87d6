"""The README stays the front door: short, with the two commands that CI and a newcomer run."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_readme_stays_short():
    lines = len(README.splitlines())
    assert lines <= 200, f"README.md has {lines} lines: move the detail into a docs/ page"


def test_readme_gives_the_demo_and_the_test_command():
    assert "pip install torch==2.13.0 -e . && skyfed demo" in README
    assert "bash .ci/run" in README


def test_the_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install torch==2.13.0 -e ".[test]"' in ci
    assert "python -m pytest" in ci
