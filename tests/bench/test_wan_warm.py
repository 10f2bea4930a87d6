"""``bench/wan.py``'s warm TCP column: the median it takes and the mTLS request-response
rounds it times (``python -m skyfed.lab.probe tls-rounds``), over real sockets and TLS, on
every agent's link at once, each round answered once all are in."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skyfed.certs.testing import make_federation
from tests.bench import bench_module

PROBE = [sys.executable, "-m", "skyfed.lab.probe"]


@pytest.fixture(scope="module")
def wan():
    """``bench/wan.py`` as it runs (its helpers beside it on the path)."""
    return bench_module("wan")


def test_timed_median_skips_the_warm_up_rounds(wan) -> None:
    assert wan.timed_median([9.0, 5.0, 1.0, 3.0, 2.0], warmup=2) == 2.0
    assert wan.timed_median([9.0, 1.0, 3.0], warmup=1) == 2.0  # even count: the mean of two


def test_timed_median_of_no_timed_round_is_nan(wan) -> None:
    assert math.isnan(wan.timed_median([1.0, 2.0], warmup=2))


def _respond(certs: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """``tls-respond`` on a free port (0: it picks one, and says which)."""
    server = subprocess.Popen(
        [*PROBE, "tls-respond", "--bind", "127.0.0.1", "--port", "0", *args]
        + ["--certs", str(certs), "--name", "coordinator", "--duration-s", "20"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    line = server.stdout.readline()
    if not line.startswith("ready "):
        server.kill()
        server.wait()
        raise AssertionError(f"tls-respond said {line!r}, not ready PORT")
    return server, int(line.split()[1])


def _rounds(certs: Path, client: str, **kw: int) -> subprocess.CompletedProcess:
    server, port = _respond(certs)
    try:
        args = [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
        return subprocess.run(
            [*PROBE, "tls-rounds", "--to", "127.0.0.1", "--port", str(port)]
            + ["--certs", str(certs), "--name", client, "--duration-s", "20", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        server.kill()
        server.wait()


def test_tls_rounds_time_every_round_of_the_full_answer(tmp_path: Path) -> None:
    make_federation(tmp_path)
    out = _rounds(tmp_path, "aws-1", up=300_001, down=700_003, rounds=3, warmup=1)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["warmup"] == 1 and len(result["seconds"]) == 4
    assert all(0 < s < 10 for s in result["seconds"])


def test_tls_rounds_refuse_a_client_without_a_certificate_of_the_ca(tmp_path: Path) -> None:
    make_federation(tmp_path / "ours")
    make_federation(tmp_path / "theirs")
    for name in ("aws-1.crt", "aws-1.key"):  # another CA's agent, trusting ours
        (tmp_path / "ours" / f"x{name}").write_bytes((tmp_path / "theirs" / name).read_bytes())
    out = _rounds(tmp_path / "ours", "xaws-1", up=10, down=10, rounds=1, warmup=0)
    assert out.returncode != 0


def test_the_answers_wait_for_every_peers_request(tmp_path: Path) -> None:
    """With ``--peers 2`` the coordinator's end answers nobody's round before both requests
    are in, as a broadcast waits for every upload: a client that starts 1.5 s before the
    other times its first round at the wait, later rounds in step."""
    make_federation(tmp_path)
    server, port = _respond(tmp_path, "--peers", "2")
    clients = []
    try:
        for client, delay in (("aws-1", 0.0), ("gcp-1", 1.5)):
            time.sleep(delay)
            clients.append(
                subprocess.Popen(
                    [*PROBE, "tls-rounds", "--to", "127.0.0.1", "--port", str(port)]
                    + ["--certs", str(tmp_path), "--name", client, "--duration-s", "20"]
                    + ["--up=1000", "--down=2000", "--rounds=2", "--warmup=0", "--idle-s=0.1"],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        early, late = (json.loads(c.communicate(timeout=30)[0].splitlines()[-1]) for c in clients)
    finally:
        for proc in (*clients, server):
            proc.kill()
            proc.wait()
    assert early["seconds"][0] > 1.0 > late["seconds"][0]  # the first waited for the second
    assert max(early["seconds"][1:] + late["seconds"][1:]) < 1.0


def test_overlapped_runs_alone_name_no_worst_exchange_and_no_ratio(wan) -> None:
    """Without a run that does not overlap, a round has no exchange of its own to set
    against its floor or to bound the overlapped round: the table and the last line say
    so, not NaN or a figure of the overlapped round's."""
    row = wan.Row("transpacific", "topk", "bbr", "monitor", "on", default_n=True)
    row.train_s, row.round_s, row.floor_s, row.exchange_s = 1.1, 2.4, 0.73, 1.3
    assert wan.worst_line([row]).startswith("worst exchange/floor: none measured")
    assert wan.table([row])[-1].endswith("| (no overlap-off row in this run) |")
    off = wan.Row("transpacific", "topk", "bbr", "monitor", "off", default_n=True)
    off.train_s, off.round_s, off.floor_s, off.exchange_s = 1.0, 2.6, 0.73, 1.6
    assert wan.worst_line([row, off]) == (
        "worst exchange/floor: 2.19x (transpacific, topk, bbr, N=monitor, overlap off)"
    )
    assert wan.table([off, row])[-1].endswith(f"| {2.4 / 1.6:.2f}x |")
