"""A real ``coordinator status``: a failed call is one line, ``--json`` has numbers as
numbers, and output into a pipe is not cut to a terminal's width."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from skyfed.procs import command
from tests.coordinator.test_bad_input import join

pytestmark = pytest.mark.multiprocess


def status(address: str, certs, *args: str) -> subprocess.CompletedProcess:
    argv = command("coordinator", "status", "--coordinator", address, "--certs", str(certs), *args)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_one_line(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_status_from_an_address_where_nothing_listens_is_one_line(pki):
    done = status(f"localhost:{free_port()}", pki.directory)
    assert_one_line(done, "UNAVAILABLE", "is the coordinator running there")


def test_status_with_an_agents_certificate_is_one_line(serve, pki):
    running = serve()
    done = status(f"localhost:{running.port}", pki.directory, "--as", "aws-1")
    assert_one_line(done, "PERMISSION_DENIED", "operator certificate")


def test_status_as_an_identity_without_a_key_pair_is_a_usage_error(serve, pki):
    running = serve()
    done = status(f"localhost:{running.port}", pki.directory, "--as", "nobody")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "--as nobody" in done.stderr and "nobody.key" in done.stderr


def test_status_json_gives_numbers_as_numbers(serve, raw_agent, pki):
    running = serve()
    join(raw_agent(running.port, "aws-1"), "aws", "aws-1")
    done = status(f"localhost:{running.port}", pki.directory, "--json")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["round"] == 0 and reply["roundsPlanned"] == 0  # int64 fields
    (agent,) = reply["agents"]
    assert agent["lastRound"] == -1
    assert isinstance(agent["bytesDown"], int) and agent["bytesDown"] > 0  # uint64


def test_status_into_a_pipe_keeps_every_row_whole(serve, raw_agent, pki):
    name = "aws-agent-with-a-name-as-long-as-a-site-may-have-0123456789-abc"
    pki.issue_agent("aws", name)
    running = serve()
    join(raw_agent(running.port, name), "aws", name)
    done = status(f"localhost:{running.port}", pki.directory)
    assert done.returncode == 0, done.stderr
    assert name in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) > 80
