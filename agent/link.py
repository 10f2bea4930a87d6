"""The agent's end of one session stream: mTLS channel, outbox, inbox, heartbeats, probe.

The agent's one edge to protobuf: messages go in and come out as ``skyfed.wire``
dataclasses, converted here by ``proto/serde.py``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import grpc

from skyfed.agent.config import AgentConfig
from skyfed.agent.probe import ProbeClient
from skyfed.agent.stripes import Stripes
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import serde
from skyfed.proto.outbox import Outbox
from skyfed.proto.stripes import Merge
from skyfed.wire import (
    AgentMessage,
    Announce,
    Chunk,
    ChunkKind,
    CoordinatorMessage,
    ExchangeTiming,
    Heartbeat,
    Receipt,
    RoundEnd,
    Welcome,
    printable,
)

log = logging.getLogger(__name__)

ENVELOPE_BYTES = 64 << 10
MAX_CHUNK_BYTES = 4 << 20
DEFAULT_MAX_HELD_BYTES = 256 << 20
"""What a striped session may hold out of order when the caller names no bound."""


class LinkClosed(Exception):
    """The stream ended; ``code`` is the gRPC status (OK when the coordinator ended it).
    ``details`` come from the other end: escaped, as every line that shows them.
    ``leader``: the HOST:PORT a standby coordinator replica named as the leader's."""

    def __init__(self, code: grpc.StatusCode, details: str, leader: str = "") -> None:
        details = printable(details)
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.leader = leader


@dataclass(frozen=True)
class _End:
    code: grpc.StatusCode
    details: str
    leader: str = ""


MAX_LEADER_CHARS = 300
"""A named leader's HOST:PORT is bounded like every peer string."""


def named_leader(error: grpc.RpcError) -> str:
    """The leader's HOST:PORT a standby replica put in its refusal's trailing metadata."""
    metadata = error.trailing_metadata() if isinstance(error, grpc.Call) else None
    for key, value in metadata or ():
        if key == serde.LEADER_METADATA and isinstance(value, str) and ":" in value:
            return value[:MAX_LEADER_CHARS]
    return ""


def channel_credentials(config: AgentConfig) -> grpc.ChannelCredentials:
    assert config.ca and config.cert and config.key  # checked by AgentConfig
    return grpc.ssl_channel_credentials(
        root_certificates=config.ca.read_bytes(),
        private_key=config.key.read_bytes(),
        certificate_chain=config.cert.read_bytes(),
    )


def open_channel(
    config: AgentConfig, address: str | None = None, *, own_connection: bool = False
) -> grpc.Channel:
    """A TLS channel to the coordinator at ``address`` (default: the first configured).
    ``own_connection``: on a TCP connection of its own, even next to another channel to
    the same target with the same arguments (gRPC shares one between such channels by
    default): a stripe of a session."""
    options: list[tuple[str, str | int]] = [
        ("grpc.max_receive_message_length", MAX_CHUNK_BYTES + ENVELOPE_BYTES),
        ("grpc.max_send_message_length", MAX_CHUNK_BYTES + ENVELOPE_BYTES),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # BDP probing grows HTTP/2 windows past a far link's bandwidth-delay product;
        # without it one stream is held to 64 KiB-ish windows (docs/wan.md#http2-windows).
        ("grpc.http2.bdp_probe", 1),
    ]
    if config.server_name:
        options.append(("grpc.ssl_target_name_override", config.server_name))
    if own_connection:
        options.append(("grpc.use_local_subchannel_pool", 1))
    target = address or config.coordinators[0]
    return grpc.secure_channel(target, channel_credentials(config), options=options)


CONNECT_TIMEOUT_S = 5.0
"""How long a dial may take to connect (TCP and TLS) before the next replica is tried: a
partitioned coordinator black-holes it, and gRPC's own bound is 20 s (docs/failover.md)."""


def wait_connected(channel: grpc.Channel, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Return once ``channel``'s first attempt to connect has an answer (connected, or
    refused: the session's call then fails at once with gRPC's own reason); ``LinkClosed``
    (UNAVAILABLE) if none comes within ``timeout_s``."""
    settled = threading.Event()

    def watch(state: grpc.ChannelConnectivity) -> None:
        if state in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE):
            settled.set()

    channel.subscribe(watch, try_to_connect=True)
    try:
        settled.wait(timeout_s)
    finally:
        channel.unsubscribe(watch)
    if not settled.is_set():
        raise LinkClosed(grpc.StatusCode.UNAVAILABLE, f"no connection within {timeout_s:g} s")


class Link:
    """A live session: messages go out through an outbox gRPC drains (heartbeats first), and
    come in on a queue."""

    def __init__(
        self,
        channel: grpc.Channel,
        heartbeat_s: float = 1.0,
        *,
        coordinator: str = "",
        dial: Callable[[], grpc.Channel] | None = None,
        max_held_bytes: int = DEFAULT_MAX_HELD_BYTES,
    ) -> None:
        self.coordinator = coordinator
        """HOST:PORT dialled; the loss probe goes to HOST (no probe when empty)."""
        self._welcome: Welcome | None = None
        self.probe: ProbeClient | None = None
        self._outbox = Outbox()
        self._inbox: queue.Queue = queue.Queue()
        self._merge: Merge[pb.CoordinatorMessage] = Merge(
            self._deliver, max_held_bytes=max_held_bytes
        )
        self._dial = dial
        """Opens a stripe's channel; None: this link never stripes."""
        self.stripes: Stripes | None = None
        self._clock = _ExchangeClock()
        self._call = serde.agent_stream(channel, "Session")(iter(self._outbox))
        self._reader = threading.Thread(target=self._read, name="link-read", daemon=True)
        self._reader.start()
        self.rtt_ms = 0.0
        self.heartbeat_s = heartbeat_s
        self._stop = threading.Event()
        self._beater = threading.Thread(target=self._beat, name="link-beat", daemon=True)
        self.bytes_up = 0

    def answered(self, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Return once the session call has the coordinator's headers (it reached a
        serving coordinator, which sends them at once) or has ended; ``LinkClosed``
        (UNAVAILABLE) if neither within ``timeout_s``. A call can be left unanswered on a
        connection to a replica's port at the moment its standby gives way to its leader,
        while that connection answers keep-alives (docs/failover.md)."""
        done = threading.Event()

        def headers() -> None:
            with contextlib.suppress(grpc.RpcError):
                self._call.initial_metadata()
            done.set()

        threading.Thread(target=headers, name="link-headers", daemon=True).start()
        if not done.wait(timeout_s):
            raise LinkClosed(
                grpc.StatusCode.UNAVAILABLE, f"the session had no answer within {timeout_s:g} s"
            )

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

    @property
    def streams(self) -> int:
        """TCP connections the session runs on now."""
        return self.stripes.streams if self.stripes is not None else 1

    def send(self, message: AgentMessage) -> None:
        if isinstance(message, Chunk):
            self.bytes_up += len(message.data)
            self._outbox.put(serde.serialized_agent_chunk(message))  # no message built
            return
        if isinstance(message, Announce):
            if self.stripes is not None:  # lanes of the last resize: connected first
                self.stripes.wait_ready()
            message = replace(message, timing=self._clock.sent(message.round, self.streams))
        self._outbox.put(serde.agent_message_to_proto(message))

    def encoded(self, round_: int, seconds: float) -> None:
        """The contribution of ``round_`` took ``seconds`` to encode (its exchange's codec time)."""
        self._clock.encoded(round_, seconds)

    def recv(self, timeout: float | None = None) -> CoordinatorMessage | None:
        """The next message; None on timeout; raises LinkClosed when the stream ended."""
        try:
            item = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, _End):
            self._inbox.put(item)  # stay closed for later calls
            raise LinkClosed(item.code, item.details, item.leader)
        return item

    def drain(self, timeout: float) -> None:
        """Send what is queued and end the stream, waiting up to ``timeout`` for the
        coordinator to end its side (a ``Leave`` then reaches it before :meth:`close`)."""
        self._outbox.close()
        self._reader.join(timeout)

    def close(self) -> None:
        self._stop.set()
        if self.probe is not None:
            self.probe.close()
        if self.stripes is not None:
            self.stripes.close()
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
                        echo = Heartbeat(
                            echo_ns=message.heartbeat.sent_ns, received=self._merge.received
                        )
                        self._outbox.put(serde.agent_message_to_proto(echo))
                    self._outbox.acked(message.heartbeat.received)
                    continue
                self._merge.add(message.order, message, message.ByteSize())
            self._inbox.put(_End(grpc.StatusCode.OK, "the coordinator ended the session"))
        except grpc.RpcError as exc:
            self._inbox.put(_End(exc.code(), exc.details() or "", named_leader(exc)))
        except Exception as exc:  # a stream this agent cannot follow: end the session
            log.warning("[Agent.Link] %s", exc)
            self._fail(grpc.StatusCode.INTERNAL, str(exc))

    def _deliver(self, message: pb.CoordinatorMessage) -> None:
        """One message of the session, in order, from whichever connection carried it."""
        ours = serde.coordinator_message_from_proto(message)
        if ours is None:
            return  # a newer coordinator's message this agent does not know
        self._clock.arrived(ours)
        if isinstance(ours, Welcome):
            self._welcome = ours  # read by start_heartbeats: the probe
            self._stripe(ours)
        elif isinstance(ours, RoundEnd) and ours.streams and self.stripes is not None:
            self.stripes.resize(ours.streams)
        self._inbox.put(ours)

    def _stripe(self, welcome: Welcome) -> None:
        """A welcome with a join token: number what we send from now on, open the stripes."""
        if not welcome.stripe_token or self._dial is None:
            return
        self._outbox.start_striping()
        self.stripes = Stripes(
            self._dial, self._outbox.stripe, self._merge, welcome.stripe_token, self._fail
        )
        self.stripes.resize(welcome.streams)

    def _fail(self, code: grpc.StatusCode, details: str) -> None:
        self._inbox.put(_End(code, details))

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
                received=self._merge.received,
            )
            self._outbox.put(serde.agent_message_to_proto(beat))


class _ExchangeClock:
    """Times each round's exchange on the agent's clock, from arrivals as the link reads
    them (not when the training loop gets to them): contribution sent to receipt, first
    aggregate chunk to round end (``docs/striping.md``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: dict[int, tuple[float, int]] = {}  # round -> (when, connections)
        self._streams: dict[int, int] = {}
        self._up_s: dict[int, float] = {}
        self._down_from: dict[int, float] = {}
        self._codec_s: dict[int, float] = {}
        self._done: ExchangeTiming | None = None

    def encoded(self, round_: int, seconds: float) -> None:
        with self._lock:
            self._codec_s[round_] = seconds

    def sent(self, round_: int, streams: int) -> ExchangeTiming | None:
        """A contribution for ``round_`` leaves now over ``streams`` connections; the last
        exchange's timing, to go with it."""
        with self._lock:
            self._sent[round_] = (time.monotonic(), streams)
            done, self._done = self._done, None
            return done

    def arrived(self, message: CoordinatorMessage) -> None:
        now = time.monotonic()
        with self._lock:
            if isinstance(message, Receipt) and message.round in self._sent:
                at, self._streams[message.round] = self._sent.pop(message.round)
                self._up_s[message.round] = now - at
            elif isinstance(message, Chunk) and message.kind == ChunkKind.AGGREGATE:
                self._down_from.setdefault(message.round, now)
            elif isinstance(message, RoundEnd):
                r = message.round
                up_s, start = self._up_s.pop(r, None), self._down_from.pop(r, now)
                if up_s is not None:
                    codec_s, streams = self._codec_s.pop(r, 0.0), self._streams.pop(r, 1)
                    self._done = ExchangeTiming(r, up_s, now - start, codec_s, streams)
                for old in [k for k in self._codec_s if k <= r]:
                    del self._codec_s[old]
