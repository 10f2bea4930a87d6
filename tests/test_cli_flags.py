"""Every configuration field has a flag (or a stated reason), and --help shows defaults."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from skyfed.agent.cli import start
from skyfed.agent.config import AgentConfig
from skyfed.config.flags import NO_FLAG, missing_flags
from skyfed.coordinator.cli import serve
from skyfed.coordinator.config import CoordinatorConfig

COMMANDS = [(serve, CoordinatorConfig), (start, AgentConfig)]


@pytest.mark.parametrize(("command", "cls"), COMMANDS, ids=["coordinator", "agent"])
def test_every_config_field_has_a_flag_or_a_reason(command, cls):
    assert missing_flags(command, cls) == []


@pytest.mark.parametrize(("command", "cls"), COMMANDS, ids=["coordinator", "agent"])
def test_help_shows_every_fields_default(command, cls):
    text = " ".join(CliRunner().invoke(command, ["--help"], terminal_width=200).output.split())
    for f in dataclasses.fields(cls):
        if f.name in NO_FLAG or f.default is dataclasses.MISSING:
            continue
        flag = "--" + f.name.replace("_", "-")
        shown = "none" if f.default is None else str(f.default)
        assert flag in text, flag
        after = text[text.index(flag + " ") :]
        own = after.split("[default: ", 1)[1].split("]", 1)[0]  # this option's first default
        assert own == shown, (flag, after[:200])
