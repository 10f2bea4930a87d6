"""Read the compose simulation's topology, so the lab can run the same one in namespaces."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHAPE_PREFIX = ["python", "-m", "skyfed.lab", "shape"]
"""An agent service's command starts with this wrapper, which shapes its link, then execs."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ComposeAgent:
    """One agent service: its link profile and the agent command it runs."""

    service: str
    name: str
    profile: str
    dev: str
    argv: tuple[str, ...]


def load_compose(path: Path) -> dict[str, Any]:
    """The compose file as data (needs PyYAML)."""
    try:
        import yaml
    except ImportError as exc:  # an optional dependency: only this reader needs it
        raise RuntimeError("reading a compose file needs PyYAML: pip install pyyaml") from exc
    return yaml.safe_load(path.read_text())


def split_shape(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """(wrapper options, inner command) of ``python -m skyfed.lab shape --opt v ... -- cmd``."""
    if argv[: len(SHAPE_PREFIX)] != SHAPE_PREFIX or "--" not in argv:
        raise ValueError(f"not a shaped command: {argv!r}")
    cut = argv.index("--")
    opts = argv[len(SHAPE_PREFIX) : cut]
    if len(opts) % 2 or not all(o.startswith("--") for o in opts[::2]):
        raise ValueError(f"wrapper options must be --name value pairs: {opts!r}")
    return {k[2:]: v for k, v in zip(opts[::2], opts[1::2], strict=True)}, argv[cut + 1 :]


def option(argv: list[str] | tuple[str, ...], name: str) -> str | None:
    """The value of ``--name VALUE`` in a command line, if present."""
    for i, arg in enumerate(argv[:-1]):
        if arg == name:
            return argv[i + 1]
    return None


def compose_agents(doc: dict[str, Any]) -> list[ComposeAgent]:
    """The agent services of a compose document, in file order."""
    agents = []
    for service, body in doc["services"].items():
        command = body.get("command")
        if not isinstance(command, list) or command[: len(SHAPE_PREFIX)] != SHAPE_PREFIX:
            continue
        opts, inner = split_shape(command)
        name = option(inner, "--name") or service
        agents.append(
            ComposeAgent(
                service=service,
                name=name,
                profile=opts["profile"],
                dev=opts.get("dev", "eth0"),
                argv=tuple(inner),
            )
        )
    return agents
