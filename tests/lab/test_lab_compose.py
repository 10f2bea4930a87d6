"""docker-compose.yml parses and is consistent with the project (no Docker engine needed)."""

from __future__ import annotations

import importlib
import shlex
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click
import pytest

from skyfed.lab.cli import lab as lab_cli
from skyfed.lab.compose import compose_agents, load_compose, option, split_shape
from skyfed.lab.profiles import load_catalog

pytest.importorskip("yaml", reason="the compose tests read YAML with PyYAML")

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
CLOUDS = ("aws", "gcp", "azure")


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return load_compose(COMPOSE)


def project_command(name: str) -> click.Command:
    """The click command behind one of the project's console scripts."""
    (ep,) = [ep for ep in entry_points(group="console_scripts") if ep.name == name]
    cmd = ep.load()
    if isinstance(cmd, click.Command):
        return cmd
    # An entry point may be a plain function that calls the module's click group.
    module = importlib.import_module(cmd.__module__)
    groups = [v for v in vars(module).values() if isinstance(v, click.Group)]
    nested = {id(c) for g in groups for c in g.commands.values()}
    groups = [g for g in groups if id(g) not in nested]
    assert len(groups) == 1, f"{name}: cannot find its click group in {cmd.__module__}"
    return groups[0]


def validate(cmd: click.Command, args: list[str], prog: str) -> None:
    """Parse ``args`` as ``cmd`` would, without running it: bad options raise UsageError."""
    while isinstance(cmd, click.Group):
        ctx = cmd.make_context(prog, list(args))
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        name, sub, args = cmd.resolve_command(ctx, rest)
        assert sub is not None, f"{prog}: no subcommand {rest[:1]}"
        cmd, prog = sub, f"{prog} {name}"
    cmd.make_context(prog, list(args))


def validate_argv(argv: list[str]) -> None:
    validate(project_command(argv[0]), argv[1:], argv[0])


def certs_lines(doc: dict[str, Any]) -> list[list[str]]:
    service = doc["services"]["certs"]
    assert service["entrypoint"] == ["sh", "-ec"]
    (script,) = service["command"]
    return [shlex.split(line) for line in script.splitlines() if line.strip()]


def produced_cert_files(doc: dict[str, Any]) -> set[str]:
    """Files the certs service writes into /certs, from its own command lines."""
    files = set()
    for argv in certs_lines(doc):
        assert option(argv, "--dir") == "/certs"
        if argv[1] == "init":
            files |= {"ca.crt", "crl.pem"}
        elif argv[1:3] == ["issue", "coordinator"]:
            name = option(argv, "--name") or "coordinator"
            files |= {f"{name}.crt", f"{name}.key"}
        elif argv[1:3] == ["issue", "agent"]:
            files |= {f"{option(argv, '--name')}.crt", f"{option(argv, '--name')}.key"}
    return files


def test_compose_has_certs_coordinator_and_one_agent_per_cloud(doc: dict[str, Any]) -> None:
    assert set(doc["services"]) == {"certs", "coordinator", *CLOUDS}
    assert [a.service for a in compose_agents(doc)] == list(CLOUDS)


def test_every_service_is_built_from_the_one_dockerfile(doc: dict[str, Any]) -> None:
    for name, service in doc["services"].items():
        assert service["build"] == {"context": ".", "dockerfile": "Dockerfile"}, name
        assert service["image"] == "skyfed:local"
    assert (ROOT / "Dockerfile").is_file()
    assert "iproute2" in (ROOT / "Dockerfile").read_text()


def test_certs_service_runs_valid_certs_commands(doc: dict[str, Any]) -> None:
    for argv in certs_lines(doc):
        assert argv[0] == "certs"
        validate_argv(argv)


def test_coordinator_runs_a_valid_serve_command(doc: dict[str, Any]) -> None:
    validate_argv(doc["services"]["coordinator"]["command"])


@pytest.mark.parametrize("cloud", CLOUDS)
def test_agent_shapes_its_link_then_runs_a_valid_agent_command(
    doc: dict[str, Any], cloud: str
) -> None:
    service = doc["services"][cloud]
    assert "NET_ADMIN" in service["cap_add"]
    opts, inner = split_shape(service["command"])
    validate(lab_cli, service["command"][3:], "python -m skyfed.lab")
    load_catalog().profile(opts["profile"])
    assert inner[:2] == ["agent", "start"] and option(inner, "--cloud") == cloud
    validate_argv(inner)


def test_every_agent_trains_on_its_own_shard(doc: dict[str, Any]) -> None:
    shards = []
    for cloud in CLOUDS:
        _, inner = split_shape(doc["services"][cloud]["command"])
        assert option(inner, "--num-shards") == str(len(CLOUDS)), inner
        shards.append(option(inner, "--shard"))
    assert sorted(shards) == [str(i) for i in range(len(CLOUDS))], shards


def test_every_certificate_a_service_reads_is_produced_by_the_certs_service(
    doc: dict[str, Any],
) -> None:
    produced = produced_cert_files(doc)
    needed = {"ca.crt", "crl.pem", "coordinator.crt", "coordinator.key"}
    for agent in compose_agents(doc):
        assert option(agent.argv, "--certs") == "/certs"
        needed |= {f"{agent.name}.crt", f"{agent.name}.key"}
    assert needed <= produced
    assert option(doc["services"]["coordinator"]["command"], "--certs") == "/certs"


def test_every_volume_is_declared_and_certs_are_shared(doc: dict[str, Any]) -> None:
    declared = set(doc["volumes"])
    for name, service in doc["services"].items():
        mounts = dict(v.split(":", 1) for v in service["volumes"])
        assert set(mounts) <= declared, name
        assert mounts.get("certs") == "/certs", name
    coordinator = doc["services"]["coordinator"]
    mounts = dict(v.split(":", 1) for v in coordinator["volumes"])
    assert mounts["checkpoints"] == option(coordinator["command"], "--checkpoint-dir")


def test_agents_dial_the_coordinator_its_certificate_names(doc: dict[str, Any]) -> None:
    serve = doc["services"]["coordinator"]["command"]
    port = option(serve, "--listen").rsplit(":", 1)[1]
    hosts = [a for line in certs_lines(doc) if "coordinator" in line for a in line]
    agents = compose_agents(doc)
    assert int(option(serve, "--min-agents")) == len(agents)
    assert int(option(serve, "--quorum")) <= len(agents)
    for agent in agents:
        assert option(agent.argv, "--coordinator") == f"coordinator:{port}"
        assert option(agent.argv, "--rounds") == option(serve, "--rounds")
    assert "coordinator" in hosts
    for service in compose_agents(doc):
        assert doc["services"][service.service]["depends_on"]["certs"] == {
            "condition": "service_completed_successfully"
        }


def test_the_lab_reads_the_same_topology_from_the_compose_file(doc: dict[str, Any]) -> None:
    from skyfed.lab.cli import _from_compose

    agents, rounds = _from_compose(COMPOSE, 1)
    assert agents == tuple(f"{a.name}={a.profile}" for a in compose_agents(doc))
    assert rounds == int(option(doc["services"]["coordinator"]["command"], "--rounds"))


def test_validation_catches_an_option_the_command_does_not_have() -> None:
    with pytest.raises(click.UsageError):
        validate_argv(["agent", "start", "--cloud", "aws", "--no-such-option", "1"])
