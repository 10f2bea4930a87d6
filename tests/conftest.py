"""Fixtures shared by the suite: real certificates, real in-process servers, reaped children."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from skyfed.certs.authority import CertificateAuthority
from skyfed.certs.testing import make_federation
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.server import Running, run_server
from skyfed.procs import Children
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import federation_pb2_grpc as pb_grpc

FUZZ_CASES = 1000
FUZZ_LONG_CASES = 20000


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz-long",
        action="store_true",
        help=f"run the protocol fuzz test with {FUZZ_LONG_CASES} cases (default {FUZZ_CASES})",
    )


@pytest.fixture
def fuzz_cases(request: pytest.FixtureRequest) -> int:
    """How many fuzzed sessions the protocol fuzz test sends (``--fuzz-long``: 20,000)."""
    return FUZZ_LONG_CASES if request.config.getoption("--fuzz-long") else FUZZ_CASES


@pytest.fixture
def pki(tmp_path: Path) -> CertificateAuthority:
    """A federation CA with a coordinator and agents aws-1, gcp-1, azure-1."""
    return make_federation(tmp_path / "certs")


@pytest.fixture
def serve(pki: CertificateAuthority) -> Iterator[Callable[..., Running]]:
    """Start an in-process coordinator on a free port: ``serve(quorum=2, ...)``."""
    with contextlib.ExitStack() as stack:

        def start(**overrides: object) -> Running:
            options = {"listen": "127.0.0.1:0", "certs": pki.directory, "codec": "fp32"}
            options.update(overrides)
            return stack.enter_context(run_server(CoordinatorConfig.from_flat(**options)))

        yield start


@pytest.fixture
def reaped(tmp_path: Path) -> Iterator[Children]:
    """Child processes that are stopped whatever the test's outcome."""
    kids = Children(tmp_path / "logs")
    try:
        yield kids
    finally:
        kids.stop_all()


def credentials(certs: Path, name: str, *, ca: Path | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=(ca or certs / "ca.crt").read_bytes(),
        private_key=(certs / f"{name}.key").read_bytes(),
        certificate_chain=(certs / f"{name}.crt").read_bytes(),
    )


class RawAgent:
    """A hand-made client: sends exactly the messages a test gives it, nothing else."""

    def __init__(self, port: int, creds: grpc.ChannelCredentials) -> None:
        self.channel = grpc.secure_channel(f"localhost:{port}", creds)
        self._out: queue.Queue = queue.Queue()
        self.inbox: queue.Queue = queue.Queue()
        self.call = pb_grpc.FederationStub(self.channel).Session(iter(self._out.get, None))
        self.echo_delay_s: float | None = None
        """Echo the coordinator's heartbeats after this long, as an agent does at once (the
        coordinator's own round trip of the link, which bounds its claims); None: never."""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for message in self.call:
                self._echo(message)
                self.inbox.put(message)
        except grpc.RpcError:
            pass
        self.inbox.put(None)

    def _echo(self, message: pb.CoordinatorMessage) -> None:
        beat = message.heartbeat if message.HasField("heartbeat") else None
        if self.echo_delay_s is None or beat is None or not beat.echo_ns:
            return
        echo = pb.Heartbeat(echo_ns=beat.sent_ns)
        timer = threading.Timer(self.echo_delay_s, lambda: self.send(heartbeat=echo))
        timer.daemon = True
        timer.start()

    def send(self, **body: object) -> None:
        self._out.put(pb.AgentMessage(**body))

    def expect(
        self, kind: str, timeout: float = 10.0, skip: tuple[str, ...] = ("heartbeat", "chunk")
    ) -> pb.CoordinatorMessage:
        """The next message of ``kind``, skipping those in ``skip``; fails on anything else."""
        while True:
            message = self.inbox.get(timeout=timeout)
            assert message is not None, (
                f"stream ended ({self.call.code()}: {self.call.details()}) before {kind}"
            )
            got = message.WhichOneof("body")
            if got == kind:
                return message
            assert got in skip, f"expected {kind}, got {got}: {str(message)[:300]}"

    def ended(self, timeout: float = 10.0) -> tuple[grpc.StatusCode, str]:
        """Wait for the stream to end; its status code and details."""
        while self.inbox.get(timeout=timeout) is not None:
            pass
        return self.call.code(), self.call.details()

    def close(self) -> None:
        self._out.put(None)
        self.call.cancel()
        self.channel.close()


@pytest.fixture
def raw_agent(pki: CertificateAuthority) -> Iterator[Callable[..., RawAgent]]:
    """``raw_agent(port, "aws-1")`` opens a session with that identity's certificate."""
    opened: list[RawAgent] = []

    def open_(port: int, name: str, creds: grpc.ChannelCredentials | None = None) -> RawAgent:
        agent = RawAgent(port, creds or credentials(pki.directory, name))
        opened.append(agent)
        return agent

    yield open_
    for agent in opened:
        agent.close()
