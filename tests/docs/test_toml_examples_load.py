"""Every coordinator TOML example in the docs loads as the coordinator reads its file, so
an example cannot keep an option outside its section after the configuration moves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from skyfed.config.load import load_config
from skyfed.coordinator.config import CoordinatorConfig

ROOT = Path(__file__).resolve().parents[2]
TOML_BLOCK = re.compile(r"^```toml\n(.*?)^```", re.M | re.S)


def coordinator_examples() -> list[tuple[str, str]]:
    """(page, text) of every ```toml block that says it is the coordinator's file."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for text in TOML_BLOCK.findall(page.read_text()):
            if "coordinator.toml" in text:
                found.append((str(page.relative_to(ROOT)), text))
    return found


@pytest.mark.parametrize(("page", "text"), coordinator_examples())
def test_a_coordinator_toml_example_in_the_docs_loads(tmp_path, page, text):
    path = tmp_path / "coordinator.toml"
    path.write_text(text)
    flags = {"certs": tmp_path}  # the examples leave the certificates to the reader
    config = load_config(CoordinatorConfig, component="coordinator", path=path, flags=flags)
    assert isinstance(config, CoordinatorConfig), page


def test_the_docs_hold_coordinator_toml_examples():
    assert len(coordinator_examples()) >= 2
