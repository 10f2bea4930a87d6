"""The agent's end of one session stream: mTLS channel, outbox, inbox, heartbeats, probe.

The agent's one edge to protobuf: messages go in and come out as ``skyfed.wire``
dataclasses, converted here by ``proto/serde.py``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

import grpc

from skyfed.agent.config import AgentConfig
from skyfed.agent.probe import ProbeClient
from skyfed.proto import federation_pb2_grpc as pb_grpc
from skyfed.proto import serde
from skyfed.proto.outbox import Outbox
from skyfed.wire import AgentMessage, Chunk, CoordinatorMessage, Heartbeat, Welcome

log = logging.getLogger(__name__)

ENVELOPE_BYTES = 64 << 10
MAX_CHUNK_BYTES = 4 << 20


class LinkClosed(Exception):
    """The stream ended; ``code`` is the gRPC status (OK when the coordinator ended it)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


@dataclass(frozen=True)
class _End:
    code: grpc.StatusCode
    details: str


def channel_credentials(config: AgentConfig) -> grpc.ChannelCredentials:
    assert config.ca and config.cert and config.key  # checked by AgentConfig
    return grpc.ssl_channel_credentials(
        root_certificates=config.ca.read_bytes(),
        private_key=config.key.read_bytes(),
        certificate_chain=config.cert.read_bytes(),
    )


def open_channel(config: AgentConfig) -> grpc.Channel:
    options = [
        ("grpc.max_receive_message_length", MAX_CHUNK_BYTES + ENVELOPE_BYTES),
        ("grpc.max_send_message_length", MAX_CHUNK_BYTES + ENVELOPE_BYTES),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
    ]
    if config.server_name:
        options.append(("grpc.ssl_target_name_override", config.server_name))
    return grpc.secure_channel(config.coordinator, channel_credentials(config), options=options)


class Link:
    """A live session: messages go out through an outbox gRPC drains (heartbeats first), and
    come in on a queue."""

    def __init__(
        self, channel: grpc.Channel, heartbeat_s: float = 1.0, *, coordinator: str = ""
    ) -> None:
        self.coordinator = coordinator
        """HOST:PORT dialled; the loss probe goes to HOST (no probe when empty)."""
        self._welcome: Welcome | None = None
        self.probe: ProbeClient | None = None
        self._outbox = Outbox()
        self._inbox: queue.Queue = queue.Queue()
        self._call = pb_grpc.FederationStub(channel).Session(iter(self._outbox))
        self._reader = threading.Thread(target=self._read, name="link-read", daemon=True)
        self._reader.start()
        self.rtt_ms = 0.0
        self.heartbeat_s = heartbeat_s
        self._stop = threading.Event()
        self._beater = threading.Thread(target=self._beat, name="link-beat", daemon=True)
        self.bytes_up = 0

    def start_heartbeats(self, interval_s: float) -> None:
        """Heartbeats every ``interval_s``; and the loss probe, if the welcome offered one."""
        self.heartbeat_s = interval_s
        self._start_probe()
        self._beater.start()

    def _start_probe(self) -> None:
        offer = self._welcome.probe if self._welcome is not None else None
        if offer is None or not offer.port or not offer.key or not self.coordinator:
            return
        host = self.coordinator.rsplit(":", 1)[0].strip("[]")
        interval_s = (offer.interval_ms or 50) / 1000
        try:
            self.probe = ProbeClient(host, offer.port, offer.probe_id, offer.key, interval_s)
        except OSError as exc:
            log.warning("[Agent.Probe] no loss probe to %s:%d: %s", host, offer.port, exc)
            return
        self.probe.start()
        log.info("[Agent.Probe] to=%s:%d interval_ms=%d", host, offer.port, interval_s * 1000)

    def send(self, message: AgentMessage) -> None:
        if isinstance(message, Chunk):
            self.bytes_up += len(message.data)
        self._outbox.put(serde.agent_message_to_proto(message))

    def recv(self, timeout: float | None = None) -> CoordinatorMessage | None:
        """The next message; None on timeout; raises LinkClosed when the stream ended."""
        try:
            item = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, _End):
            self._inbox.put(item)  # stay closed for later calls
            raise LinkClosed(item.code, item.details)
        return item

    def close(self) -> None:
        self._stop.set()
        if self.probe is not None:
            self.probe.close()
        self._outbox.close()
        self._call.cancel()

    def _read(self) -> None:
        try:
            for message in self._call:
                if message.HasField("heartbeat"):
                    # Timed here, on arrival, not when the training loop gets to it.
                    if message.heartbeat.echo_ns:
                        self.rtt_ms = (time.monotonic_ns() - message.heartbeat.echo_ns) / 1e6
                        # Echo the coordinator's stamp at once: its own round trip of this
                        # link bounds what our figures may claim (coordinator/observed.py).
                        echo = Heartbeat(echo_ns=message.heartbeat.sent_ns)
                        self._outbox.put(serde.agent_message_to_proto(echo))
                    continue
                ours = serde.coordinator_message_from_proto(message)
                if ours is None:
                    continue  # a newer coordinator's message this agent does not know
                if isinstance(ours, Welcome):
                    self._welcome = ours  # read by start_heartbeats: the probe
                self._inbox.put(ours)
            self._inbox.put(_End(grpc.StatusCode.OK, "the coordinator ended the session"))
        except grpc.RpcError as exc:
            self._inbox.put(_End(exc.code(), exc.details() or ""))

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            settled = lost = 0
            if self.probe is not None:
                report = self.probe.take()
                settled, lost = report.settled, report.lost
            beat = Heartbeat(
                sent_ns=time.monotonic_ns(),
                rtt_ms=self.rtt_ms,
                probes_settled=settled,
                probes_lost=lost,
            )
            self._outbox.put(serde.agent_message_to_proto(beat))
