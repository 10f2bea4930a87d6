"""Fuzzed sessions against a real coordinator: sequences of valid, mutated and garbage
``AgentMessage``s over real mTLS. Every stream ends with a deliberate status (never
INTERNAL or UNKNOWN), and afterwards a real agent process still trains, its weights
digest equal to the coordinator's (docs/security.md, "Fuzzing")."""

from __future__ import annotations

import collections
import contextlib
import json
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skyfed.compression import frame
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.server import run_server
from skyfed.fingerprint import weights_digest
from skyfed.procs import Children, command, wait_for_file
from skyfed.proto import federation_pb2 as pb
from skyfed.proto.serde import specs_to_proto
from tests.conftest import credentials
from tests.coordinator.test_bad_input import contribution, deltas, model_and_spec

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")

SESSION = "/skyfed.v1.Federation/Session"
IDENTITIES = (("aws", "aws-1"), ("gcp", "gcp-1"), ("azure", "azure-1"))
DELIBERATE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}

_INTS = {
    FieldDescriptor.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_UINT64: (0, (1 << 64) - 1),
    FieldDescriptor.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_UINT32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_FIXED32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_ENUM: (0, 8),
}


def _scalar(field: FieldDescriptor) -> st.SearchStrategy:
    """Values of ``field``'s wire type, extremes included."""
    if field.type in _INTS:
        lo, hi = _INTS[field.type]
        return st.one_of(st.sampled_from([lo, hi, 0, 1, -1 if lo < 0 else 2]), st.integers(lo, hi))
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        width = 32 if field.type == FieldDescriptor.TYPE_FLOAT else 64
        return st.floats(width=width, allow_nan=True, allow_infinity=True)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.text(max_size=40), st.just("x" * 5000))
    return st.binary(max_size=64)


@st.composite
def mutated(draw: st.DrawFn, message):
    """``message`` (a copy) with one to three scalar fields set to drawn values."""
    out = type(message)()
    out.CopyFrom(message)
    body = getattr(out, out.WhichOneof("body"))
    scalars = [
        f
        for f in body.DESCRIPTOR.fields
        if f.type != FieldDescriptor.TYPE_MESSAGE and not f.is_repeated
    ]
    for field in draw(st.lists(st.sampled_from(scalars), min_size=1, max_size=3)):
        value = draw(_scalar(field))
        with contextlib.suppress(ValueError, TypeError):  # a value protobuf cannot hold
            setattr(body, field.name, value)
    return out.SerializeToString()


@st.composite
def garbage(draw: st.DrawFn, valid: bytes):
    """Random bytes, or a valid message with bytes flipped or cut."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=200))
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data) - 1))
        data[i] ^= draw(st.integers(1, 255))
    return bytes(data[: draw(st.integers(1, len(data)))])


def _messages(hello: pb.AgentMessage) -> st.SearchStrategy:
    """A session's worth of messages: an optional hello, then valid and mutated ones."""
    header, chunks = contribution(deltas(3))
    valid = [
        pb.AgentMessage(contribution=header),
        *(pb.AgentMessage(chunk=c) for c in chunks[:4]),
        pb.AgentMessage(heartbeat=pb.Heartbeat(sent_ns=1, rtt_ms=20.0)),
    ]
    everything = [hello, *valid]
    pick = st.integers(0, len(valid) - 1)
    whole = [m.SerializeToString() for m in valid[:1]]
    whole += [pb.AgentMessage(chunk=c).SerializeToString() for c in chunks]
    body = st.one_of(
        st.just(whole),  # a complete valid contribution: the round may close
        pick.map(lambda i: [valid[i].SerializeToString()]),
        pick.flatmap(lambda i: mutated(valid[i])).map(lambda b: [b]),
        st.integers(0, len(valid))
        .flatmap(lambda i: garbage(everything[i].SerializeToString()))
        .map(lambda b: [b]),
        mutated(hello).map(lambda b: [b]),
    )
    first = st.one_of(
        st.just([hello.SerializeToString()]), st.just([]), mutated(hello).map(lambda b: [b])
    )
    return st.tuples(first, st.lists(body, max_size=6)).map(
        lambda t: t[0] + [m for part in t[1] for m in part]
    )


def _hello(cloud: str, name: str) -> pb.AgentMessage:
    weights, spec = model_and_spec()
    return pb.AgentMessage(
        hello=pb.Hello(
            frame_version=frame.VERSION,
            cloud=cloud,
            name=name,
            task="chargpt",
            tensors=specs_to_proto(spec),
            codecs=["fp32"],
            last_round=-1,
            weights_digest=weights_digest(weights),
        )
    )


def _session(channel: grpc.Channel, messages: list[bytes]) -> grpc.StatusCode:
    call = channel.stream_stream(SESSION, request_serializer=None, response_deserializer=None)
    replies = call(iter(messages), timeout=20)
    try:
        for _ in replies:
            pass
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_fuzzed_sessions_leave_the_coordinator_serving_a_good_agent(pki, tmp_path, fuzz_cases):
    config = CoordinatorConfig.from_flat(
        listen="127.0.0.1:0",
        certs=pki.directory,
        codec="fp32",
        round_deadline_s=0.2,
        hello_timeout_s=5,
        max_streams_per_identity=8,
    )
    codes: collections.Counter = collections.Counter()
    with run_server(config) as running:
        address = f"localhost:{running.port}"
        channels = [
            grpc.secure_channel(address, credentials(pki.directory, name)) for _, name in IDENTITIES
        ]
        hellos = [_hello(c, n) for c, n in IDENTITIES]
        strategies = [_messages(h) for h in hellos]
        started = time.monotonic()

        @settings(
            max_examples=fuzz_cases,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.data())
        def one_session(data: st.DataObject) -> None:
            who = data.draw(st.integers(0, len(IDENTITIES) - 1))
            code = _session(channels[who], data.draw(strategies[who]))
            codes[code.name] += 1
            assert code in DELIBERATE, code
            assert running.driver.is_alive()

        one_session()
        elapsed_s = time.monotonic() - started
        for channel in channels:
            channel.close()
        digest = _good_agent_trains(address, pki.directory, tmp_path)
        assert running.driver.is_alive()
        assert digest == running.federation.model.weights_digest
    summary = {"cases": sum(codes.values()), "seconds": round(elapsed_s, 1), "codes": dict(codes)}
    print(f"fuzz summary: {json.dumps(summary)}")


def _good_agent_trains(address: str, certs: Path, work: Path) -> str:
    """A real ``agent start`` process applies one round; its report's weights digest."""
    kids = Children(work / "logs")
    report = work / "agent.json"
    argv = command(
        "agent",
        "start",
        *("--cloud", "aws", "--coordinator", address, "--certs", str(certs)),
        *("--rounds", "1", "--report", str(report)),
    )
    try:
        proc = kids.start("aws", argv)
        text = wait_for_file(report, 120, None)
        proc.wait(timeout=60)
    except Exception:
        pytest.fail(f"the good agent did not train:\n{kids.log('aws')[-3000:]}")
    finally:
        kids.stop_all()
    return json.loads(text)["weights_digest"]
