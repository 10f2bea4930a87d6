"""The coordinator and a TP site run as the manifests run them: a read-only root filesystem
with only their volumes writable, health endpoints on the metrics port."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from skyfed.procs import command, wait_for_file

from .slurm_cluster import free_port
from .test_k8s_manifests import containers

pytestmark = pytest.mark.multiprocess

# Each process in its own mount namespace (root only): the directories the pod would have
# as volumes bound onto themselves (mounts of their own), then `/` remounted read-only.
WRAPPER = """set -e
mount --make-rprivate /
mount --bind / /
for dir in $WRITABLE; do mount --bind "$dir" "$dir"; done
mount -o remount,bind,ro /
exec "$@"
"""


def on_read_only_root(argv: list[str], writable: list[Path]) -> tuple[list[str], dict[str, str]]:
    """``argv`` wrapped to run on a read-only root; the environment the manifests set."""
    (_, agent), *_ = [(w, c) for w, c in containers("gcp") if c["name"] == "agent"]
    env = {e["name"]: e["value"] for e in agent["env"]}
    assert env["HOME"] == "/tmp", "the manifests' HOME is their writable /tmp"
    # This test's stand-in for the pod's /tmp volume, which torch needs (tempfile).
    env["HOME"] = env["TMPDIR"] = str(writable[0])
    env["WRITABLE"] = " ".join(str(d) for d in writable)
    return ["unshare", "--mount", "sh", "-c", WRAPPER, "sh", *argv], env


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_coordinator_and_tp_site_run_on_a_read_only_root(reaped, pki, tmp_path: Path):
    home, state = tmp_path / "home", tmp_path / "state"
    home.mkdir(), state.mkdir()
    argv, env = on_read_only_root(["touch", str(tmp_path / "elsewhere")], [home, state])
    denied = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr, denied

    metrics = free_port()
    coordinator = command(
        "coordinator",
        *("serve", "--certs", str(pki.directory), "--listen", "127.0.0.1:0"),
        *("--port-file", str(state / "port"), "--rounds", "2", "--min-agents", "1"),
        *("--checkpoint-dir", str(state / "checkpoints"), "--run-dir", str(state / "run")),
        *("--export", str(state / "final.pt"), "--metrics-listen", f"127.0.0.1:{metrics}"),
    )
    argv, env = on_read_only_root(coordinator, [home, state])
    port = int(wait_for_file(state / "port", 60, reaped.start("coordinator", argv, env)))
    deadline = time.monotonic() + 30
    while get(f"http://127.0.0.1:{metrics}/healthz") != 200:
        assert time.monotonic() < deadline, reaped.log("coordinator")[-3000:]
        time.sleep(0.2)
    assert get(f"http://127.0.0.1:{metrics}/metrics") == 200

    agent = command(
        "agent",
        *("start", "--cloud", "aws", "--coordinator", f"localhost:{port}"),
        *("--certs", str(pki.directory), "--tp", "2", "--local-steps", "1"),
    )
    argv, env = on_read_only_root(agent, [home, state])
    reaped.start("aws", argv, env)
    for name in ("aws", "coordinator"):
        code = reaped.procs[name].wait(timeout=240)
        assert code == 0, f"{name} exited {code}:\n{reaped.log(name)[-3000:]}"
    assert (state / "final.pt").is_file() and (state / "run" / "rounds.jsonl").is_file()
