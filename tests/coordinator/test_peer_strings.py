"""Every string a peer sends is a printable token (free text where it must be): one with a
newline, ESC or another control character is refused with INVALID_ARGUMENT and a one-line
reason, and no log line shows it raw (docs/security.md, "Bounded messages")."""

from __future__ import annotations

import logging

import grpc
import pytest

from skyfed.errors import ProtocolError
from skyfed.proto import federation_pb2 as pb
from skyfed.proto import serde
from tests.coordinator import test_bad_input as bad_input
from tests.coordinator.test_bad_input import contribution, deltas, join

FORGED = "x\n[Coordinator.Round] round=999"
"""What a forged log line looks like: a newline, then a line of our own format."""
CONTROLS = [FORGED, "fp\x1b[31m32", "a\tb", "bbr\r", "x\u202ey", "x\x00y"]


def hello(**changes: object) -> pb.Hello:
    """aws-1's hello, every field right, then ``changes``."""
    message = bad_input.hello("aws", "aws-1", exchanges=("delta",), congestion_control="bbr")
    for field, value in changes.items():
        if field.startswith("tensors."):
            setattr(message.tensors[0], field.removeprefix("tensors."), value)
        elif isinstance(value, list):
            getattr(message, field).extend(value)
        else:
            setattr(message, field, value)
    return message


FIELDS = [
    "cloud",
    "name",
    "task",
    "weights_digest",
    "congestion_control",
    "codecs",
    "exchanges",
    "tensors.name",
    "tensors.dtype",
]


def assert_one_clean_line(details: str, caplog: pytest.LogCaptureFixture) -> None:
    assert "\n" not in details and "\x1b" not in details
    for record in caplog.records:
        message = record.getMessage()
        assert "\n" not in message and "\x1b" not in message and "\t" not in message, message


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("bad", CONTROLS, ids=["newline", "esc", "tab", "cr", "bidi", "nul"])
def test_a_control_character_in_any_hello_string_is_invalid_argument(
    serve, raw_agent, caplog, field, bad
):
    running = serve()
    agent = raw_agent(running.port, "aws-1")
    value = [bad] if field in ("codecs", "exchanges") else bad
    with caplog.at_level(logging.DEBUG):
        agent.send(hello=hello(**{field: value}))
        code, details = agent.ended()
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert f"hello.{field}=" in details
    assert "printable" in details
    assert_one_clean_line(details, caplog)


@pytest.mark.parametrize("bad", CONTROLS[:2], ids=["newline", "esc"])
def test_a_control_character_in_a_chunks_codec_is_invalid_argument(serve, raw_agent, caplog, bad):
    running = serve()
    agent = raw_agent(running.port, "aws-1")
    join(agent, "aws", "aws-1")
    header, chunks = contribution(deltas(1))
    chunks[0].codec = bad
    with caplog.at_level(logging.DEBUG):
        agent.send(contribution=header)
        agent.send(chunk=chunks[0])
        code, details = agent.ended()
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "chunk.codec=" in details
    assert_one_clean_line(details, caplog)


def test_a_task_may_hold_spaces_but_a_name_may_not(serve, raw_agent):
    running = serve()
    agent = raw_agent(running.port, "aws-1")
    agent.send(hello=hello(congestion_control="b br"))
    code, details = agent.ended()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "hello.congestion_control=" in details

    agent = raw_agent(running.port, "aws-1")
    agent.send(hello=hello(task="my task"))  # free text: a reference, not a token
    assert agent.expect("welcome").welcome.round == 0


@pytest.mark.parametrize(
    "message",
    [
        pb.CoordinatorMessage(receipt=pb.Receipt(round=0, message=FORGED)),
        pb.CoordinatorMessage(welcome=pb.Welcome(codec="fp\x1b[0m16", identity="spiffe://a/b")),
        pb.CoordinatorMessage(welcome=pb.Welcome(codec="fp16", identity="spiffe://a/b\n")),
        pb.CoordinatorMessage(round_end=pb.RoundEnd(codec="fp16", codec_params="{}\n")),
        pb.CoordinatorMessage(weights_end=pb.WeightsEnd(weights_digest="crc\x07")),
    ],
    ids=["receipt", "welcome-codec", "welcome-identity", "round-end", "weights-end"],
)
def test_an_agent_refuses_a_coordinators_control_characters(message):
    with pytest.raises(ProtocolError, match="printable") as refused:
        serde.coordinator_message_from_proto(message)
    assert "\n" not in str(refused.value) and "\x1b" not in str(refused.value)
