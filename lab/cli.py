"""``lab``: build the network lab, check its links, run a federation across it."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path

import click

from skyfed.lab.profiles import load_catalog
from skyfed.lab.topology import tear_down_on_signals

DEFAULT_AGENTS = ("aws-1=cross-region", "gcp-1=cross-region", "azure-1=cross-region")


def _agents(specs: tuple[str, ...]):  # noqa: ANN202
    from skyfed.lab.topology import AgentSpec

    out = []
    for spec in specs:
        name, _, profile = spec.partition("=")
        out.append(AgentSpec(name=name, profile=profile or "lan"))
    return tuple(out)


def _lab(agents: tuple[str, ...], mechanism: str, profiles: Path | None):  # noqa: ANN202
    from skyfed.lab.topology import Lab, LabSpec

    spec = LabSpec(agents=_agents(agents), mechanism=mechanism)
    return Lab(spec=spec, catalog=load_catalog(profiles))


def _require_lab() -> None:
    from skyfed.lab.netns import why_unavailable

    reason = why_unavailable()
    if reason:
        raise click.ClickException(reason)


agent_option = click.option(
    "--agent",
    "agents",
    multiple=True,
    default=DEFAULT_AGENTS,
    show_default=True,
    help="NAME=PROFILE, repeatable: one agent host and the profile of its link.",
)
mechanism_option = click.option(
    "--mechanism",
    type=click.Choice(["auto", "netem", "tun"]),
    default="auto",
    show_default=True,
    help="Shaper: tc netem where the kernel has it, else tbf + eBPF drop + a TUN delay line.",
)
profiles_option = click.option(
    "--profiles",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Profiles TOML (default: the one shipped with skyfed).",
)


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log what the lab does.")
def lab(verbose: bool) -> None:
    """The network lab: namespaces per host, shaped links, real commands."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )


@lab.command()
@profiles_option
def profiles(profiles: Path | None) -> None:
    """List link profiles and schedules."""
    catalog = load_catalog(profiles)
    click.echo(f"{'profile':<14}{'rtt_ms':>8}{'jitter_ms':>11}{'loss_%':>8}{'rate_mbit':>11}")
    for p in catalog.profiles.values():
        rate = f"{p.rate_mbit:g}" if p.rate_mbit else "-"
        line = f"{p.name:<14}{p.rtt_ms:>8g}{p.jitter_ms:>11g}{p.loss_pct:>8g}{rate:>11}"
        click.echo(line)
    for s in catalog.schedules.values():
        steps = ", ".join(f"{st.profile} {st.hold_s:g}s" for st in s.steps)
        click.echo(f"schedule {s.name}: {steps}")


@lab.command()
@click.option("--profile", "names", multiple=True, help="Profile to check (default: all).")
@click.option("--probes", type=int, default=2000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON report per line.")
@mechanism_option
@profiles_option
def check(
    names: tuple[str, ...], probes: int, as_json: bool, mechanism: str, profiles: Path | None
) -> None:
    """Build a one-link lab per profile and measure it against the profile."""
    from skyfed.lab.selfcheck import CheckSettings, measure_link

    _require_lab()
    tear_down_on_signals()
    names = names or tuple(load_catalog(profiles).profiles)
    failed = 0
    for name in names:
        with _lab((f"probe={name}",), mechanism, profiles) as built:
            report = measure_link(built, "probe", CheckSettings(probes=probes))
        failed += not report.ok
        click.echo(json.dumps(report.to_dict()) if as_json else report.summary())
    if failed:
        raise click.ClickException(f"{failed} of {len(names)} profiles do not match")


@lab.command()
@click.option("--seconds", type=float, default=3.0, show_default=True)
@click.option("--repeat", type=int, default=3, show_default=True)
@mechanism_option
def ceiling(seconds: float, repeat: int, mechanism: str) -> None:
    """Measure the shaper's own ceiling: TCP goodput over an unlimited link at MTU 1500."""
    from skyfed.lab.profiles import LinkProfile
    from skyfed.lab.selfcheck import measure_ceiling

    _require_lab()
    tear_down_on_signals()
    with _lab(("probe=lan",), mechanism, None) as built:
        link = built.link("probe")
        link.set_profile(LinkProfile(name="unshaped", rtt_ms=0.0))
        for _ in range(repeat):
            drops = link.tx_drops()
            mbit = measure_ceiling(built, "probe", seconds)
            drops = link.tx_drops() - drops
            click.echo(f"{built.mechanism}: {mbit:.0f} Mbit/s TCP goodput, {drops} TX drops")


@lab.command()
@agent_option
@click.option("--check/--no-check", "do_check", default=True, show_default=True)
@mechanism_option
@profiles_option
def up(agents: tuple[str, ...], do_check: bool, mechanism: str, profiles: Path | None) -> None:
    """Build the lab and hold it until Ctrl-C; use `ip netns exec NS CMD` meanwhile."""
    from skyfed.lab.selfcheck import check_lab

    _require_lab()
    tear_down_on_signals()
    with _lab(agents, mechanism, profiles) as built:
        if do_check:
            for report in check_lab(built):
                click.echo(report.summary())
        click.echo(f"mechanism: {built.mechanism}")
        for host, ns in built.hosts.items():
            click.echo(f"{host:<14}{str(built.address(host)):<14}ip netns exec {ns.name} ...")
        click.echo("Ctrl-C tears the lab down.")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            click.echo("tearing down")


@lab.command()
@agent_option
@click.option("--rounds", type=int, default=3, show_default=True)
@click.option("--round-deadline-s", type=float, default=30.0, show_default=True)
@click.option("--timeout-s", type=float, default=600.0, show_default=True)
@click.option(
    "--compose",
    "compose_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Take agents, profiles and rounds from this docker-compose.yml.",
)
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--check/--no-check", "do_check", default=True, show_default=True)
@mechanism_option
@profiles_option
def run(
    agents: tuple[str, ...],
    rounds: int,
    round_deadline_s: float,
    timeout_s: float,
    compose_file: Path | None,
    workdir: Path | None,
    do_check: bool,
    mechanism: str,
    profiles: Path | None,
) -> None:
    """Run `coordinator serve` and one `agent start` per agent across the lab's links."""
    from skyfed.lab.federation import Federation, FederationSpec
    from skyfed.lab.selfcheck import check_lab

    _require_lab()
    tear_down_on_signals()
    if compose_file is not None:
        agents, rounds = _from_compose(compose_file, rounds)
    workdir = workdir or Path(tempfile.mkdtemp(prefix="skyfed-lab-"))
    workdir.mkdir(parents=True, exist_ok=True)
    spec = FederationSpec(rounds=rounds, round_deadline_s=round_deadline_s)
    with _lab(agents, mechanism, profiles) as built:
        if do_check:
            for report in check_lab(built):
                click.echo(report.summary())
        fed = Federation(built, spec, workdir)
        fed.start()
        codes = fed.wait(timeout_s)
        _print_outcome(fed, codes)
    if any(code != 0 for code in codes.values()):
        raise click.ClickException(f"not every host finished cleanly; logs in {workdir}")


def _from_compose(path: Path, rounds: int) -> tuple[tuple[str, ...], int]:
    from skyfed.lab.compose import compose_agents, load_compose, option

    doc = load_compose(path)
    agents = tuple(f"{a.name}={a.profile}" for a in compose_agents(doc))
    coordinator_cmd = doc["services"]["coordinator"]["command"]
    return agents, int(option(coordinator_cmd, "--rounds") or rounds)


def _print_outcome(fed, codes: dict[str, int | None]) -> None:  # noqa: ANN001
    from skyfed.lab.federation import round_floor_s

    click.echo(f"exit codes: {codes}")
    reports = fed.reports()
    for name, rep in reports.items():
        click.echo(f"{name}: round {rep['round']} digest {rep['weights_digest'][:16]}")
    profile = next(iter(fed.lab.links.values())).profile
    per_round = max(
        (r["bytes_up"] / max(1, r["rounds_applied"]) for r in reports.values()), default=0
    )
    floor = round_floor_s(profile.rtt_ms, profile.rate_mbit, per_round, per_round)
    for rnd, agents, duration in fed.rounds():
        click.echo(f"round {rnd}: {agents} agents, {duration:.3f} s (floor {floor:.3f} s)")


@lab.command()
@click.option("--profile", required=True, help="Profile name to shape this container's link with.")
@click.option("--dev", default="eth0", show_default=True)
@profiles_option
@click.argument("command", nargs=-1, required=True)
def shape(profile: str, dev: str, profiles: Path | None, command: tuple[str, ...]) -> None:
    """Inside a container (NET_ADMIN): shape DEV with tc netem, then exec COMMAND."""
    from skyfed.lab.container import shape_container_link

    how = shape_container_link(dev, load_catalog(profiles).profile(profile))
    click.echo(f"shaped {dev} with {profile} ({how})", err=True)
    os.execvp(command[0], list(command))


@lab.command()
def clean() -> None:
    """Remove namespaces left by lab runs whose process is gone."""
    from skyfed.lab.netns import reap_stale

    for name in reap_stale():
        click.echo(f"removed {name}")


main = lab
