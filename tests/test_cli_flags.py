"""The flags follow the configuration: every option a flag (a table says why it has none),
named flat, and --help shows each default."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from skyfed.agent.cli import start
from skyfed.agent.config import AgentConfig
from skyfed.config.sections import flat_keys, sections, tables
from skyfed.coordinator.cli import serve
from skyfed.coordinator.config import CoordinatorConfig

COMMANDS = [(serve, CoordinatorConfig), (start, AgentConfig)]


def leaves(cls: type) -> list[tuple[str, ...]]:
    """Every option of ``cls`` as where it lives, sections opened."""
    found: list[tuple[str, ...]] = []
    for f in dataclasses.fields(cls):
        inner = sections(cls).get(f.name)
        found += (
            [(f.name,)] if inner is None else [(f.name, g.name) for g in dataclasses.fields(inner)]
        )
    return found


@pytest.mark.parametrize(("command", "cls"), COMMANDS, ids=["coordinator", "agent"])
def test_every_option_has_a_flag_or_its_table_says_why(command, cls):
    flags = {p.name for p in command.params}
    reached = {flat_keys(cls)[name] for name in flags if name in flat_keys(cls)}
    without = [p for p in leaves(cls) if p not in reached and p[0] not in tables(cls)]
    assert without == []
    assert all(why for why in tables(cls).values())


def test_the_coordinators_tables_keep_their_flags():
    assert set(tables(CoordinatorConfig)) == {"policy", "monitor", "streams"}
    options = {p.name: p.opts for p in serve.params}
    assert options["policy"] == ["--policy"] and options["max_streams"] == ["--max-streams"]
    assert options["quorum"] == ["--quorum"] and options["rounds"] == ["--rounds"]


@pytest.mark.parametrize(("command", "cls"), COMMANDS, ids=["coordinator", "agent"])
def test_help_shows_every_options_default(command, cls):
    text = " ".join(CliRunner().invoke(command, ["--help"], terminal_width=200).output.split())
    for name, path in flat_keys(cls).items():
        owner = cls if len(path) == 1 else sections(cls)[path[0]]
        field = next(f for f in dataclasses.fields(owner) if f.name == path[-1])
        flag = "--" + name.replace("_", "-")
        assert flag in text, flag
        after = text[text.index(flag + " ") :]
        if field.default is dataclasses.MISSING:
            assert "[required]" in after.split("--", 2)[1], flag
            continue
        shown = {None: "none", "": '""'}.get(field.default, str(field.default))
        own = after.split("[default: ", 1)[1].split("]", 1)[0]  # this option's first default
        assert own == shown, (flag, after[:200])


def test_a_flag_reaches_its_section(tmp_path):
    result = CliRunner().invoke(
        serve, ["--certs", str(tmp_path), "--min-agents", "3", "--quorum", "5"]
    )
    assert result.exit_code == 2
    assert "coordinator option [rounds] quorum=5 must be <= min_agents (3)" in result.output
