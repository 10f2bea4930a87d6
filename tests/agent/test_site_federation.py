"""Sites of any layout in one federation, as real agent processes on real Gloo groups: a
2 x 2 site trains what a 1 x 1 site trains (fp32), and sites of four layouts stay
bit-identical round after round under a lossy codec."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from skyfed.coordinator.server import Running
from skyfed.procs import Children, command

pytestmark = pytest.mark.multiprocess

TASK = "skyfed.tasks.examples:mlp_task"


def agent_argv(certs: Path, port: int, cloud: str, dp: int, tp: int, *extra: object) -> list[str]:
    flags = {
        "--cloud": cloud,
        "--coordinator": f"localhost:{port}",
        "--certs": certs,
        "--task": TASK,
        "--local-steps": 2,
        "--dp": dp,
        "--tp": tp,
        "--device": "cpu",
    }
    words = [str(x) for kv in flags.items() for x in kv]
    return command("agent", "start", *words, *(str(x) for x in extra))


def run_federation(
    serve: Callable[..., Running],
    kids: Children,
    certs: Path,
    layouts: dict[str, tuple[int, int, str]],
    *,
    codec: str,
    rounds: int,
    tag: str,
    reports: Path,
) -> Running:
    """A federation whose sites run the given (dp, tp, dp_mode), to its last round."""
    running = serve(
        min_agents=len(layouts), quorum=len(layouts), rounds=rounds, codec=codec, task=TASK
    )
    for cloud, (dp, tp, mode) in layouts.items():
        argv = agent_argv(
            certs, running.port, cloud, dp, tp, "--dp-mode", mode,
            "--report", reports / f"{tag}-{cloud}.json",
        )  # fmt: skip
        kids.start(f"{tag}-{cloud}", argv)
    for cloud in layouts:
        code = kids.procs[f"{tag}-{cloud}"].wait(timeout=240)
        assert code == 0, f"{cloud} exited {code}:\n{kids.log(f'{tag}-{cloud}')[-3000:]}"
    deadline = time.monotonic() + 10
    while not running.federation.rounds.finished:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return running


def test_a_2x2_fsdp_site_trains_what_a_1x1_site_trains_under_fp32(serve, reaped, pki, tmp_path):
    ran = {}
    for tag, layout in (("one", (1, 1, "auto")), ("four", (2, 2, "fsdp"))):
        running = run_federation(
            serve, reaped, pki.directory, {"aws": layout},
            codec="fp32", rounds=3, tag=tag, reports=tmp_path,
        )  # fmt: skip
        ran[tag] = [w.clone() for w in running.federation.model.weights]
    for one, four in zip(ran["one"], ran["four"], strict=True):
        torch.testing.assert_close(four, one, rtol=1e-5, atol=1e-6)
    assert "[Agent.Ranks] dp=2 tp=2" in reaped.log("four-aws")
    report = json.loads((tmp_path / "four-aws.json").read_text())
    assert report["layout"] == {"dp": 2, "tp": 2}


def test_a_mixed_federation_trains_what_an_all_1x1_one_trains_under_fp32(
    serve, reaped, pki, tmp_path
):
    """The mean over sites of different layouts (each with its own data) is the mean over
    1 x 1 sites, to float tolerance."""
    ran = {}
    for tag, layouts in (
        ("ones", {"aws": (1, 1, "auto"), "gcp": (1, 1, "auto")}),
        ("mixed", {"aws": (1, 2, "auto"), "gcp": (2, 1, "ddp")}),
    ):
        running = run_federation(
            serve, reaped, pki.directory, layouts, codec="fp32", rounds=3, tag=tag, reports=tmp_path
        )
        ran[tag] = [w.clone() for w in running.federation.model.weights]
    for one, mixed in zip(ran["ones"], ran["mixed"], strict=True):
        torch.testing.assert_close(mixed, one, rtol=1e-5, atol=1e-6)


def test_sites_of_four_layouts_stay_bit_identical_under_a_lossy_codec(serve, reaped, pki, tmp_path):
    pki.issue_agent("hpc", "hpc-1")
    layouts = {
        "aws": (1, 1, "auto"),
        "gcp": (2, 1, "ddp"),
        "azure": (1, 2, "auto"),
        "hpc": (2, 2, "fsdp"),
    }
    running = run_federation(
        serve, reaped, pki.directory, layouts,
        codec="fp16", rounds=3, tag="mixed", reports=tmp_path,
    )  # fmt: skip
    digest = running.federation.model.weights_digest
    for cloud in layouts:
        log = reaped.log(f"mixed-{cloud}")
        assert "[Agent.Resync]" not in log, f"{cloud}: every round's digest must have matched"
        report = json.loads((tmp_path / f"mixed-{cloud}.json").read_text())
        assert report["rounds_applied"] == 3
        assert report["weights_digest"] == digest, cloud
    status = {a.name: a for a in running.federation.status(departed=True).agents}
    assert (status["hpc-1"].dp, status["hpc-1"].tp) == (2, 2)
