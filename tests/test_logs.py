"""Logs are for operators: one line per event, JSON on request, no traceback per message."""

from __future__ import annotations

import json
import logging

import grpc
import pytest

from skyfed.logs import JsonFormatter
from skyfed.proto import federation_pb2 as pb
from tests.conftest import credentials


def test_json_record_with_an_exception_is_one_line():
    try:
        raise ValueError("bad chunk\nsecond line")
    except ValueError:
        record = logging.LogRecord(
            "skyfed.x", logging.ERROR, __file__, 1, "failed %s", ("it",), None
        )
        import sys

        record.exc_info = sys.exc_info()
    line = JsonFormatter("coordinator").format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "failed it" and parsed["who"] == "coordinator"
    assert "ValueError: bad chunk" in parsed["error"]


def test_malformed_messages_write_one_throttled_line_and_no_traceback(serve, raw_agent, caplog):
    """Three bad sessions of one identity in a row: one line (the refusal log is
    throttled per identity, docs/security.md), never a traceback."""
    running = serve()
    caplog.set_level(logging.INFO, logger="skyfed")
    for _ in range(3):
        bad = raw_agent(running.port, "aws-1")
        bad._out.put(pb.AgentMessage(chunk=pb.Chunk(round=0)))
        code, _ = bad.ended()
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in refused]
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in caplog.records)


def test_a_refused_peer_writes_one_line(serve, pki, caplog):
    running = serve()
    pki.revoke("gcp-1")
    caplog.set_level(logging.INFO, logger="skyfed")
    creds = credentials(pki.directory, "gcp-1")
    with grpc.secure_channel(f"localhost:{running.port}", creds) as channel:
        stub = channel.stream_stream("/skyfed.v1.Federation/Session")
        with pytest.raises(grpc.RpcError) as err:
            list(stub(iter([pb.AgentMessage().SerializeToString()]), timeout=5))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    refused = [r for r in caplog.records if "is revoked" in r.getMessage()]
    assert len(refused) == 1 and "refused" in refused[0].getMessage()
    assert all(r.exc_info is None for r in caplog.records)
