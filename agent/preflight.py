"""What ``agent start`` checks before it starts ranks or dials: each mistake one line.

A key that does not match its certificate used to fail every TLS handshake and retry
every 5 s forever; a missing ``--report`` directory crashed after round 0; a task that
cannot be imported or a TP plan naming a module the model lacks was a traceback.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from skyfed.agent.config import AgentConfig
from skyfed.agent.trainer import check_batch
from skyfed.tasks import load_task
from skyfed.tasks.base import tp_plan_of
from skyfed.tasks.plans import check as check_plan


def check(config: AgentConfig) -> None:
    """Raise ValueError, naming the option and the fix, for the first mistake found."""
    check_certificates(config)
    if config.report is not None and not config.report.parent.is_dir():
        raise ValueError(
            f"--report {config.report}: directory {config.report.parent} does not exist"
        )
    task = load_task(config.task)  # TaskLoadError (a ValueError) says what is missing
    if config.tp > 1:
        check_plan(task.build_model(config.seed), tp_plan_of(task), config.tp)
    check_batch(task.batch_size(), config.dp)
    if config.state_dir is not None and config.state_dir.exists() and not config.state_dir.is_dir():
        raise ValueError(f"--state-dir {config.state_dir} is not a directory")


def check_certificates(config: AgentConfig) -> None:
    """The CA, the certificate and its own private key are there (a script's
    ``skyfed.Site`` checks this much too)."""
    for option in ("ca", "cert", "key"):
        path = getattr(config, option)
        if not path.is_file():
            hint = " (check --certs)" if config.certs is not None else ""
            raise ValueError(f"--{option} {path} does not exist{hint}")
    check_key_pair(config)


def check_key_pair(config: AgentConfig) -> None:
    """The private key must be the certificate's: else every handshake fails."""
    assert config.cert is not None and config.key is not None  # resolved on construction
    try:
        cert = x509.load_pem_x509_certificate(config.cert.read_bytes())
        key = serialization.load_pem_private_key(config.key.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"--cert {config.cert} / --key {config.key}: unreadable ({exc})") from exc
    ours = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    theirs = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if ours != theirs:
        raise ValueError(
            f"--key {config.key} is not the private key of --cert {config.cert}: use the "
            "pair `certs issue` wrote together"
        )
