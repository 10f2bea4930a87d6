"""The real commands as OS processes on loopback: training, and surviving kills."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from skyfed.coordinator import checkpoint
from skyfed.procs import Children, command, wait_for_file

pytestmark = pytest.mark.multiprocess

CLOUDS = ("aws", "gcp", "azure")


def start_coordinator(
    kids: Children, work: Path, *, rounds: int, listen: str = "127.0.0.1:0", **extra: object
) -> int:
    port_file = work / "port"
    port_file.unlink(missing_ok=True)
    flags = {
        "--certs": work / "certs",
        "--listen": listen,
        "--port-file": port_file,
        "--status-file": work / "status.json",
        "--rounds": rounds,
        "--min-agents": 3,
        "--checkpoint-dir": work / "ckpt",
        **extra,
    }
    argv = command("coordinator", "serve", *(str(x) for kv in flags.items() for x in kv))
    return int(wait_for_file(port_file, 60, kids.start("coordinator", argv)))


def start_agent(
    kids: Children,
    work: Path,
    port: int,
    cloud: str,
    shard: int,
    local_steps: int = 1,
    env: dict[str, str] | None = None,
) -> None:
    flags = {
        "--cloud": cloud,
        "--coordinator": f"localhost:{port}",
        "--certs": work / "certs",
        "--shard": shard,
        "--num-shards": 3,
        "--local-steps": local_steps,
        "--report": work / f"{cloud}.json",
        # A restarted coordinator is back within seconds: retrying at most every 0.5 s (not
        # the default 5) keeps the agents from sleeping past it in the tests that kill it.
        "--reconnect-max-s": 0.5,
    }
    argv = command("agent", "start", *(str(x) for kv in flags.items() for x in kv))
    kids.start(cloud, argv, env=env)


def report(work: Path, cloud: str) -> dict:
    path = work / f"{cloud}.json"
    return json.loads(path.read_text()) if path.exists() else {"round": -1}


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def finish(kids: Children, work: Path, timeout_s: float = 240) -> dict:
    for name in ("coordinator", *CLOUDS):
        code = kids.procs[name].wait(timeout=timeout_s)
        assert code == 0, f"{name} exited {code}:\n{kids.log(name)[-3000:]}"
    return json.loads((work / "status.json").read_text())


def assert_identical(work: Path, status: dict, rounds: int) -> None:
    for cloud in CLOUDS:
        rep = report(work, cloud)
        assert rep["round"] == rounds - 1, (cloud, rep)
        assert rep["weights_digest"] == status["weightsDigest"], cloud


@pytest.fixture
def work(tmp_path: Path, pki) -> Path:
    return tmp_path


def test_three_agent_processes_train_and_end_bit_identical(reaped, work):
    port = start_coordinator(reaped, work, rounds=8)
    for i, cloud in enumerate(CLOUDS):
        start_agent(reaped, work, port, cloud, i)
    status = finish(reaped, work)
    losses = [r["meanLoss"] for r in status["rounds"]]
    assert len(losses) == 8
    assert losses[-1] < losses[0] - 0.5, losses
    assert_identical(work, status, 8)


def test_gradient_exchange_with_topk_trains_and_ends_bit_identical(reaped, work):
    """DGC's exchange: one momentum-corrected gradient step per round, Top-k both ways."""
    port = start_coordinator(
        reaped, work, rounds=12, **{"--codec": "topk", "--exchange": "gradient"}
    )
    for i, cloud in enumerate(CLOUDS):
        start_agent(reaped, work, port, cloud, i)
    status = finish(reaped, work)
    losses = [r["meanLoss"] for r in status["rounds"]]
    assert losses[-1] < losses[0] - 0.5, losses
    assert {r["codec"] for r in (report(work, c) for c in CLOUDS)} == {"topk"}
    # The trainer itself took the welcome's settings (what it computes: tests/agent).
    assert all("[Agent.Exchange] gradient lr=0.1 momentum=0.9" in reaped.log(c) for c in CLOUDS)
    assert_identical(work, status, 12)


def test_an_ecsgd_run_repeats_bit_for_bit_from_its_seed(reaped, work):
    """EC-SGD rounds at random; each sender seeds its rounding per round from the
    federation's seed and its name, so a rerun of a seed ends on the same weights."""
    digests = []
    for run in ("first", "again"):
        (work / run).mkdir()
        (work / run / "certs").symlink_to(work / "certs")
        port = start_coordinator(reaped, work / run, rounds=5, **{"--codec": "ecsgd"})
        for i, cloud in enumerate(CLOUDS):
            start_agent(reaped, work / run, port, cloud, i)
        status = finish(reaped, work / run)
        assert {r["codec"] for r in (report(work / run, c) for c in CLOUDS)} == {"ecsgd"}
        assert_identical(work / run, status, 5)
        digests.append(status["weightsDigest"])
    assert digests[0] == digests[1]


def test_uplinks_staged_on_disk_end_on_the_same_weights_as_in_memory(reaped, work):
    """Past ``stage_memory`` the coordinator stages uplinks in an unlinked file, each put
    together there as its chunks arrive (4 KiB chunks: the larger tensors' payloads come
    in several), and reads them back at the close: the same sums, so the same weights, as
    staged in memory."""
    digests = []
    for run, memory in (("memory", "inf"), ("disk", "0")):
        (work / run).mkdir()
        (work / run / "certs").symlink_to(work / "certs")
        flags = {
            "--codec": "fp16",
            "--stage-memory": memory,
            "--stage-dir": work / run,
            "--max-chunk-bytes": 4096,
        }
        port = start_coordinator(reaped, work / run, rounds=4, **flags)
        for i, cloud in enumerate(CLOUDS):
            start_agent(reaped, work / run, port, cloud, i)
        status = finish(reaped, work / run)
        assert_identical(work / run, status, 4)
        digests.append(status["weightsDigest"])
        spilled = "[Coordinator.Stage] round=3 uplinks" in reaped.log("coordinator")
        assert spilled == (memory == "0"), reaped.log("coordinator")[-2000:]
    assert digests[0] == digests[1]


def test_killed_agent_restarts_rejoins_and_ends_identical(reaped, work):
    # Slow enough rounds (4 local steps) that the others are still training when gcp is back.
    rounds = 30
    port = start_coordinator(reaped, work, rounds=rounds, **{"--round-deadline-s": 1.0})
    for i, cloud in enumerate(CLOUDS):
        start_agent(reaped, work, port, cloud, i, local_steps=4)
    wait_until(lambda: report(work, "gcp")["round"] >= 2, 120, "gcp to apply round 2")
    reaped.stop("gcp", signal.SIGKILL)
    killed_at = report(work, "gcp")["round"]
    wait_until(lambda: report(work, "aws")["round"] >= killed_at + 2, 120, "rounds without gcp")
    assert report(work, "aws")["round"] < rounds - 15, "the federation ran out of rounds too soon"
    start_agent(reaped, work, port, "gcp", 1, local_steps=4)
    status = finish(reaped, work)
    assert_identical(work, status, rounds)
    assert "weights of round" in reaped.log("gcp"), "the restarted agent should have resynced"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_stopped_coordinator_resumes_from_checkpoint_and_loses_no_round(reaped, work, sig):
    rounds = 12
    port = start_coordinator(reaped, work, rounds=rounds)
    for i, cloud in enumerate(CLOUDS):
        start_agent(reaped, work, port, cloud, i)
    wait_until(lambda: min(report(work, c)["round"] for c in CLOUDS) >= 3, 120, "round 3")
    code = reaped.stop("coordinator", sig)
    if sig == signal.SIGTERM:
        assert code == 0, reaped.log("coordinator")[-2000:]  # drained, not killed
    saved = checkpoint.load(work / "ckpt")
    acknowledged = max(report(work, c)["round"] for c in CLOUDS)
    assert saved is not None and saved.round >= acknowledged, (saved and saved.round, acknowledged)
    start_coordinator(reaped, work, rounds=rounds, listen=f"127.0.0.1:{port}")
    status = finish(reaped, work)
    assert f"[Coordinator.Resume] round={saved.round + 1}" in reaped.log("coordinator")
    assert_identical(work, status, rounds)
