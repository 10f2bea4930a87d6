"""The `certs` command: init a federation's CA, issue, revoke, show and list certificates."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from .authority import AuthorityError, CertificateAuthority, IssuedCertificate
from .describe import describe, format_serial, format_time, load_material
from .identity import COORDINATOR_NAME, IdentityError, replica_name, validate_name
from .revocation import RevocationError

DEFAULT_DIR = "certs"
DIR_ENV = "SKYFED_CERTS_DIR"
_USER_ERRORS = (AuthorityError, IdentityError, RevocationError, OSError, ValueError)


class CertsError(click.ClickException):
    """A one-line error for people; exit status 2, no traceback."""

    exit_code = 2


class _TranslatingGroup(click.Group):
    """Turns the library's domain errors into CertsError, in one place."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
        except _USER_ERRORS as e:
            raise CertsError(str(e)) from None


def _dir_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--dir",
        "directory",
        type=click.Path(file_okay=False, path_type=Path),
        envvar=DIR_ENV,
        default=DEFAULT_DIR,
        show_default=f"${DIR_ENV} or ./{DEFAULT_DIR}",
        help="The federation's certificate directory.",
    )(command)


def _days_option(default: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--days",
        type=click.IntRange(min=1),
        default=default,
        show_default=True,
        help="Validity in days.",
    )


_replace_option = click.option(
    "--replace", is_flag=True, help="Overwrite a live certificate of the same name."
)


@click.group(cls=_TranslatingGroup)
@click.option("-v", "--verbose", is_flag=True, help="Log what the library does.")
def cli(verbose: bool) -> None:
    """Certificates for a skyfed federation: one CA, one coordinator, one agent per site."""
    if verbose:
        logging.getLogger().setLevel(logging.INFO)


@cli.command()
@_dir_option
@click.option("--trust-domain", default="skyfed.local", show_default=True)
@_days_option(3650)
@click.option("--force", is_flag=True, help="Replace an existing CA (invalidates its certs).")
def init(directory: Path, trust_domain: str, days: int, force: bool) -> None:
    """Create the federation's CA and an empty CRL."""
    ca = CertificateAuthority.init(directory, trust_domain, days=days, force=force)
    click.echo(f"CA for spiffe://{ca.trust_domain} in {ca.directory}")
    click.echo(f"  certificate  {ca.ca_cert_path}")
    click.echo(f"  private key  {ca.directory / 'ca.key'} (0600; keep it off the sites)")
    click.echo(f"  CRL          {ca.crl_path}")


@cli.group()
def issue() -> None:
    """Issue a certificate for an agent, an operator (admin) or the coordinator."""


@issue.command("agent")
@_dir_option
@click.option("--cloud", required=True, help="The agent's cloud, e.g. aws.")
@click.option("--name", required=True, help="Unique name in the federation, e.g. aws-1.")
@_days_option(365)
@_replace_option
def issue_agent(directory: Path, cloud: str, name: str, days: int, replace: bool) -> None:
    """Issue an agent's client certificate."""
    ca = CertificateAuthority.open(directory)
    _echo_issued(ca.issue_agent(cloud, name, days=days, replace=replace))


@issue.command("admin")
@_dir_option
@click.option("--name", required=True, help="The operator's name, e.g. ops.")
@_days_option(365)
@_replace_option
def issue_admin(directory: Path, name: str, days: int, replace: bool) -> None:
    """Issue an operator's client certificate (for `coordinator status`)."""
    ca = CertificateAuthority.open(directory)
    _echo_issued(ca.issue_admin(name, days=days, replace=replace))


@issue.command("coordinator")
@_dir_option
@click.option("--name", default="coordinator", show_default=True)
@click.option(
    "--replica",
    help="A coordinator replica's name (docs/failover.md): issues coordinator-REPLICA, "
    "its own key under the coordinator role.",
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="DNS name or IP agents dial (repeatable); default: localhost and 127.0.0.1.",
)
@_days_option(365)
@_replace_option
def issue_coordinator(
    directory: Path,
    name: str,
    replica: str | None,
    hosts: Sequence[str],
    days: int,
    replace: bool,
) -> None:
    """Issue the coordinator's server-and-client certificate (one per replica)."""
    if replica is not None:
        if name != COORDINATOR_NAME:
            raise CertsError("give --name or --replica, not both")
        name = replica_name(validate_name("replica", replica))
    ca = CertificateAuthority.open(directory)
    hosts = hosts or ("localhost", "127.0.0.1")
    _echo_issued(ca.issue_coordinator(name, hosts, days=days, replace=replace))


def _echo_issued(issued: IssuedCertificate) -> None:
    click.echo(f"issued {issued.identity.uri}")
    click.echo(f"  certificate  {issued.cert_path}")
    click.echo(f"  private key  {issued.key_path} (0600)")
    click.echo(f"  serial       {format_serial(issued.serial)}")
    click.echo(f"  not after    {format_time(issued.not_after)}")


@cli.command()
@_dir_option
@click.argument("what")
def revoke(directory: Path, what: str) -> None:
    """Revoke WHAT: an issued name, a certificate file, or a serial (0x.. or decimal)."""
    ca = CertificateAuthority.open(directory)
    serial = ca.resolve_serial(what)
    if ca.is_revoked(serial):
        click.echo(f"serial {format_serial(serial)} ({what}) was already revoked")
        return
    crl_path = ca.revoke(serial)
    click.echo(f"revoked serial {format_serial(serial)} ({what}); CRL written to {crl_path}")


@cli.command("refresh-crl")
@_dir_option
def refresh_crl(directory: Path) -> None:
    """Re-sign the CRL with a fresh next-update date (do it at least monthly)."""
    path = CertificateAuthority.open(directory).refresh_crl()
    click.echo(f"CRL re-signed: {path}")


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def show(file: Path, as_json: bool) -> None:
    """Show a certificate (identity, serial, validity, SAN, fingerprint) or a CRL."""
    fields = describe(load_material(file))
    if as_json:
        click.echo(json.dumps(fields, indent=2))
        return
    for key, value in fields.items():
        click.echo(f"{key.replace('_', ' ') + ':':<20}{_human(value)}")


def _human(value: object) -> str:
    if isinstance(value, list):
        items = [" ".join(str(v) for v in x.values()) if isinstance(x, dict) else x for x in value]
        return ", ".join(str(x) for x in items) if items else "(none)"
    return "-" if value is None else str(value)


@cli.command("list")
@_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def list_(directory: Path, as_json: bool) -> None:
    """List issued identities with their expiry and revocation status."""
    ca = CertificateAuthority.open(directory)
    revoked = ca.revoked_serials()
    rows = [_row(item, item.serial in revoked) for item in ca.issued()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        click.echo(f"no certificates issued in {directory}")
    else:
        _echo_table(rows)


def _row(item: IssuedCertificate, revoked: bool) -> dict[str, object]:
    return {
        "name": item.identity.name,
        "role": item.identity.role,
        "cloud": item.identity.cloud or "-",
        "serial": format_serial(item.serial),
        "not_after": format_time(item.not_after),
        "expired": item.not_after < datetime.now(UTC),
        "revoked": revoked,
        "spiffe_id": item.identity.uri,
    }


def _echo_table(rows: list[dict[str, object]]) -> None:
    def cell(row: dict[str, object], key: str) -> str:
        value = row[key]
        return ("yes" if value else "no") if isinstance(value, bool) else str(value)

    keys = ["name", "role", "cloud", "not_after", "expired", "revoked", "spiffe_id"]
    widths = {k: max(len(k), *(len(cell(r, k)) for r in rows)) for k in keys}
    click.echo("  ".join(k.upper().ljust(widths[k]) for k in keys).rstrip())
    for row in rows:
        click.echo("  ".join(cell(row, k).ljust(widths[k]) for k in keys).rstrip())


@cli.command("k8s-secret")
@_dir_option
@click.argument("name")
@click.argument("more", nargs=-1)
@click.option("--namespace", default="skyfed", show_default=True)
@click.option("--secret-name", help="Secret's name  [default: skyfed-certs-NAME]")
def k8s_secret(
    directory: Path, name: str, more: tuple[str, ...], namespace: str, secret_name: str | None
) -> None:
    """Print NAME's certificates as a Kubernetes Secret (JSON) for `kubectl apply -f -`.

    ca.crt, NAME.crt and NAME.key (and crl.pem for the coordinator); never ca.key. Several
    names (coordinator replicas of one StatefulSet) share one Secret: give --secret-name.
    """
    from .kubernetes import secret_manifest

    ca = CertificateAuthority.open(directory)
    manifest = secret_manifest(ca, name, *more, secret_name=secret_name, namespace=namespace)
    click.echo(json.dumps(manifest, indent=2))


@cli.command()
@_dir_option
@click.argument("name")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory to write NAME's --certs files into.",
)
def bundle(directory: Path, name: str, out: Path) -> None:
    """Copy what NAME mounts as its --certs directory into OUT.

    ca.crt, NAME.crt and NAME.key (and crl.pem for the coordinator); never ca.key.
    """
    from .bundle import write_bundle

    for path in write_bundle(CertificateAuthority.open(directory), name, out):
        click.echo(f"  {path}")


def main() -> None:
    """Console entry point `certs`."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cli(prog_name="certs")
