"""docker-compose.yml parses and is consistent with the project (no Docker engine needed)."""

from __future__ import annotations

import importlib
import shlex
import subprocess
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click
import pytest

from skyfed.lab.cli import lab as lab_cli
from skyfed.lab.compose import compose_agents, load_compose, option, split_shape
from skyfed.lab.profiles import load_catalog
from skyfed.procs import command

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


def mounts(service: dict[str, Any]) -> list[dict[str, Any]]:
    """A service's volume mounts, short (``src:dst[:ro]``) or long syntax, as
    ``{source, target, read_only, subpath}``."""
    out = []
    for mount in service.get("volumes", []):
        if isinstance(mount, str):
            source, target, *mode = mount.split(":")
            out.append({"source": source, "target": target, "read_only": mode == ["ro"]})
        else:
            subpath = mount.get("volume", {}).get("subpath")
            out.append({**mount, "subpath": subpath})
    return out


def certs_mount(service: dict[str, Any]) -> dict[str, Any]:
    (mount,) = [m for m in mounts(service) if m["target"] == "/certs"]
    return mount


def run_certs_script(doc: dict[str, Any], pki: Path) -> None:
    """The certs service's script, run for real with its volume at ``pki``."""
    for argv in certs_lines(doc):
        argv = [a.replace("/pki", str(pki)) for a in argv]
        done = subprocess.run(command("certs", *argv[1:]), capture_output=True, text=True)
        assert done.returncode == 0, f"{argv}: {done.stderr}"


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


def test_every_service_mounts_only_its_own_certificates_and_never_the_ca_key(
    doc: dict[str, Any], tmp_path: Path
) -> None:
    pki = tmp_path / "pki"
    run_certs_script(doc, pki)
    assert (pki / "ca" / "ca.key").is_file()  # the CA stays in the certs service's volume
    readers = {"coordinator": ("coordinator", doc["services"]["coordinator"]["command"])}
    readers |= {a.service: (a.name, a.argv) for a in compose_agents(doc)}
    for service, (name, argv) in readers.items():
        body = doc["services"][service]
        mount = certs_mount(body)
        assert mount["target"] == option(argv, "--certs") == "/certs", service
        assert (mount["source"], mount["subpath"], mount["read_only"]) == ("pki", name, True)
        assert [m["source"] for m in mounts(body)].count("pki") == 1, service
        files = {p.name for p in (pki / mount["subpath"]).iterdir()}
        needed = {"ca.crt", f"{name}.crt", f"{name}.key"}
        assert files == (needed | {"crl.pem"} if service == "coordinator" else needed), service
    (ca_mount,) = mounts(doc["services"]["certs"])
    assert (ca_mount["source"], ca_mount["target"]) == ("pki", "/pki")


def test_every_volume_is_declared_and_the_checkpoints_are_the_coordinators(
    doc: dict[str, Any],
) -> None:
    declared = set(doc["volumes"])
    for name, service in doc["services"].items():
        assert {m["source"] for m in mounts(service)} <= declared, name
    coordinator = doc["services"]["coordinator"]
    targets = {m["source"]: m["target"] for m in mounts(coordinator)}
    assert targets["checkpoints"] == option(coordinator["command"], "--checkpoint-dir")


def test_every_container_runs_as_the_images_unprivileged_user(doc: dict[str, Any]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    users = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root"), users
    for name, service in doc["services"].items():
        assert str(service.get("user", users[-1])).split(":")[0] not in ("0", "root"), name
    # The agents shape their links with the capable copies of ip and tc, first on PATH.
    assert "setcap cap_net_admin+ep /opt/netadmin/tc" in dockerfile
    assert "setcap cap_net_admin+ep /opt/netadmin/ip" in dockerfile
    for agent in compose_agents(doc):
        service = doc["services"][agent.service]
        assert service["environment"]["PATH"].startswith("/opt/netadmin:"), agent.service
        assert service["cap_add"] == ["NET_ADMIN"]
    assert "cap_add" not in doc["services"]["coordinator"]


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


def test_the_image_installs_the_versions_ci_passed_with():
    text = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-cache-dir -c constraints.txt ." in text
    assert "sed -n 's/^torch==//p' constraints.txt" in text  # torch pinned as CI ran it
