"""``skyfed.Site``: a user's own training loop as a site of a federation, beside
``agent start`` sites, bit-identical with them; its refusals, its close, its metrics."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import skyfed
from skyfed.fingerprint import weights_digest
from skyfed.procs import command
from skyfed.report import make_report
from skyfed.tasks import load_task
from tests.e2e.test_federation_processes import wait_until
from tests.metrics.test_metrics_endpoint import get

TASK = "skyfed.tasks.examples:mlp_task"
SCRIPT = Path(__file__).with_name("own_loop_script.py")
ROUNDS = 3


def start_agent_site(reaped, port: int, pki, tmp_path: Path, cloud: str = "gcp") -> None:
    flags = {
        "--cloud": cloud,
        "--coordinator": f"localhost:{port}",
        "--certs": pki.directory,
        "--task": TASK,
        "--local-steps": 2,
        "--report": tmp_path / f"{cloud}.json",
        "--reconnect-max-s": 0.5,
    }
    reaped.start(cloud, command("agent", "start", *(str(x) for f in flags.items() for x in f)))


def script_argv(port: int, pki, tmp_path: Path, layout: str = "one") -> list[str]:
    args = ["--cloud", "aws", "--coordinator", f"localhost:{port}", "--certs", str(pki.directory)]
    args += ["--local-steps", "2", "--layout", layout]
    args += ["--report", str(tmp_path / "aws.json"), "--out", str(tmp_path / "out.json")]
    if layout == "one":
        return [sys.executable, str(SCRIPT), *args]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*torchrun, "--nproc-per-node=2", str(SCRIPT), *args]


def finished_identical(reaped, running, tmp_path: Path) -> dict:
    """Both sites ended with the federation's final weights; the script's own view."""
    for name in ("aws", "gcp"):
        code = reaped.procs[name].wait(timeout=240)
        assert code == 0, f"{name} exited {code}:\n{reaped.log(name)[-3000:]}"
    digest = running.federation.model.weights_digest
    for cloud in ("aws", "gcp"):
        report = json.loads((tmp_path / f"{cloud}.json").read_text())
        assert (report["round"], report["weights_digest"]) == (ROUNDS - 1, digest), cloud
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["digest"] == digest, "the script's model does not hold the final weights"
    assert out["finished"] and out["steps"] == 2 * ROUNDS
    return out


pytestmark = pytest.mark.multiprocess


def test_a_script_site_trains_bit_identical_with_an_agent_start_site_and_its_metrics_reach_the_report(
    serve, reaped, pki, tmp_path
):
    run_dir = tmp_path / "run"
    running = serve(
        task=TASK,
        min_agents=2,
        rounds=ROUNDS,
        codec="topk",
        run_dir=run_dir,
        metrics_listen="127.0.0.1:0",
        eval_every=1,
    )
    start_agent_site(reaped, running.port, pki, tmp_path)
    reaped.start("aws", script_argv(running.port, pki, tmp_path))
    finished_identical(reaped, running, tmp_path)

    # The script's report({"accuracy": ..., "steps": ...}) after every second phase.
    status = running.federation.status(departed=True)
    aws = next(a for a in status.agents if a.name == "aws-1")
    assert set(aws.metrics) == {"accuracy", "steps"} and 0 <= aws.metrics["accuracy"] <= 1
    assert status.eval_metrics.keys() == {"loss"}  # the task has eval_loss alone
    _, text = get(running.metrics_port, "/metrics")
    assert 'skyfed_link_metric{agent="aws-1",name="accuracy"}' in text
    assert 'skyfed_eval_metric{name="loss"}' in text

    def recorded() -> list[dict]:
        path = run_dir / "rounds.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    wait_until(lambda: any(x["kind"] == "eval" for x in recorded()), 30, "an evaluation line")
    reported = [x for x in recorded() if "metrics" in x.get("links", {}).get("aws-1", {})]
    assert reported and reported[0]["links"]["aws-1"]["metrics"]["steps"] == 4.0
    page = make_report(run_dir).read_text()
    assert "aws-1 accuracy" in page and "metrics.png" in page


@pytest.mark.parametrize("layout", ["ddp", "fsdp", "tp"])
def test_a_torchrun_script_of_two_ranks_trains_bit_identical_with_an_agent_start_site(
    serve, reaped, pki, tmp_path, layout
):
    running = serve(task=TASK, min_agents=2, rounds=ROUNDS, codec="fp16")
    start_agent_site(reaped, running.port, pki, tmp_path)
    reaped.start("aws", script_argv(running.port, pki, tmp_path, layout))
    finished_identical(reaped, running, tmp_path)
    aws = next(a for a in running.federation.status(departed=True).agents if a.name == "aws-1")
    assert (aws.dp, aws.tp) == ((1, 2) if layout == "tp" else (2, 1))


# ---- in this process: the script is the test ------------------------------------------


def mlp(seed: int = 3, **options: object) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = load_task(TASK, **options).build_model(seed)
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def train(site: skyfed.Site, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> int:
    """The script's loop: ``steps`` optimizer steps, or until the federation finishes."""
    data = load_task(TASK).batches(0, 1, seed=5)
    for done in range(1, steps + 1):
        x, y = next(data)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if not site.step(loss, samples=len(x)):
            return done
    return steps


def test_the_model_holds_the_federations_weights_once_the_site_has_joined(serve, pki):
    running = serve(task=TASK, rounds=2)
    model, optimizer = mlp(seed=3)  # not the federation's seed: its weights are replaced
    site = skyfed.Site(model, optimizer, cloud="aws", certs=pki.directory,
                       coordinator=f"localhost:{running.port}", local_steps=3)  # fmt: skip
    with site:
        federation = load_task(TASK).build_model(0)
        for mine, theirs in zip(model.parameters(), federation.parameters(), strict=True):
            assert torch.equal(mine, theirs)
        params = [id(p) for p in model.parameters()]
        assert train(site, model, optimizer, steps=100) == 6  # 2 rounds of 3 steps
        assert site.finished and not site.step()
    assert [id(p) for p in model.parameters()] == params  # updated in place
    assert weights_digest(p.detach() for p in model.parameters()) == (
        running.federation.model.weights_digest
    )


def test_with_overlap_a_script_trains_the_next_phase_while_its_round_is_in_flight(serve, pki):
    """The aggregate of round r is applied at the boundary after phase r+1 (as
    ``agent start`` does); the last phase's steps, past the final round, are dropped."""
    running = serve(task=TASK, rounds=3, overlap=True)
    model, optimizer = mlp()
    with skyfed.Site(model, optimizer, cloud="aws", certs=pki.directory,
                     coordinator=f"localhost:{running.port}", local_steps=2) as site:  # fmt: skip
        assert train(site, model, optimizer, steps=100) == 2 * (3 + 1)
    assert weights_digest(p.detach() for p in model.parameters()) == (
        running.federation.model.weights_digest
    )


def test_a_phase_whose_script_told_no_loss_leaves_the_rounds_loss_unsaid(serve, pki):
    running = serve(task=TASK, rounds=1)
    model, optimizer = mlp()
    with skyfed.Site(model, optimizer, cloud="aws", certs=pki.directory,
                     coordinator=f"localhost:{running.port}", local_steps=2) as site:  # fmt: skip
        while site.step():  # no loss, no samples: each step counts samples_per_step
            pass
    (stats,) = running.federation.status().rounds
    assert stats.contributors == 1 and math.isnan(stats.mean_loss)


def test_a_script_site_whose_model_differs_is_refused_in_one_line(serve, pki):
    running = serve(task=TASK)
    model, optimizer = mlp(d_hidden=64)
    with pytest.raises(skyfed.SiteError, match="refused by the coordinator: .*fingerprint"):
        skyfed.Site(model, optimizer, cloud="aws", certs=pki.directory,
                    coordinator=f"localhost:{running.port}")  # fmt: skip


def test_a_gradient_exchange_federation_refuses_a_script_site_in_one_line(serve, pki):
    """The script's optimizer moves the weights: a site of its own offers ``delta`` only."""
    running = serve(task=TASK, exchange="gradient")
    model, optimizer = mlp()
    with pytest.raises(skyfed.SiteError, match="exchanges 'gradient'; the agent offers"):
        skyfed.Site(model, optimizer, cloud="aws", certs=pki.directory,
                    coordinator=f"localhost:{running.port}")  # fmt: skip


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"tp": 2}, "option 'tp' is the script's own"),
        ({"no_such": 1}, "has no option 'no_such'"),
        ({"local_steps": 0}, "local_steps=0 must be in 1.."),
        ({"samples_per_step": 0}, "samples_per_step=0 must be >= 1"),
        ({"key": "{certs}/gcp-1.key"}, "is not the private key of --cert"),
    ],
)
def test_a_script_site_option_out_of_bounds_is_refused_before_it_dials(pki, options, words):
    model, optimizer = mlp()
    options = {
        k: v.format(certs=pki.directory) if isinstance(v, str) else v for k, v in options.items()
    }
    with pytest.raises(ValueError, match=words):
        skyfed.Site(model, optimizer, cloud="aws", certs=pki.directory,
                    coordinator="localhost:9", **options)  # fmt: skip


def test_a_closed_site_leaves_with_its_residuals_kept_and_a_failed_script_says_why(
    serve, pki, tmp_path
):
    running = serve(task=TASK, codec="topk")  # until stopped
    model, optimizer = mlp()
    state = tmp_path / "state"
    with skyfed.Site(model, optimizer, cloud="aws", certs=pki.directory, state_dir=state,
                     coordinator=f"localhost:{running.port}", local_steps=2) as site:  # fmt: skip
        assert train(site, model, optimizer, steps=5) == 5  # two boundaries and a step
        site.report({"accuracy": 0.5})
    with pytest.raises(skyfed.SiteError, match="after close"):
        site.step()
    assert (state / "site-state.pt").exists()  # top-k's unsent residuals, for the next start
    aws = next(a for a in running.federation.status(departed=True).agents if a.name == "aws-1")
    assert aws.state != "down" and not aws.last_error  # a plain close is no failure

    model, optimizer = mlp()
    again = skyfed.Site(model, optimizer, cloud="aws", certs=pki.directory,
                        coordinator=f"localhost:{running.port}", local_steps=2)  # fmt: skip
    with pytest.raises(RuntimeError, match="boom"), again:
        train(again, model, optimizer, steps=3)
        raise RuntimeError("boom")

    def down() -> str:
        agents = running.federation.status(departed=True).agents
        return next((a.last_error for a in agents if a.name == "aws-1" and a.state == "down"), "")

    wait_until(lambda: "its script failed: RuntimeError: boom" in down(), 10, "aws-1 down")


def test_metrics_a_script_reports_are_held_to_the_wires_rules(serve, pki):
    running = serve(task=TASK)
    model, optimizer = mlp()
    with skyfed.Site(model, optimizer, cloud="aws", certs=pki.directory,
                     coordinator=f"localhost:{running.port}") as site:  # fmt: skip
        with pytest.raises(ValueError, match="must be printable with no space"):
            site.report({"top 1": 0.5})
        with pytest.raises(ValueError, match="must be finite"):
            site.report({"loss": float("nan")})
        with pytest.raises(ValueError, match="at most 16"):
            site.report({f"m{i}": 1.0 for i in range(17)})
        site.report({"accuracy": torch.tensor(0.75)})  # a one-element tensor is a number


def test_a_sites_gpu_summary_rides_on_its_contributions_beside_the_scripts_metrics(
    serve, pki, tmp_path
):
    """GPU telemetry reaches the coordinator's status, rounds.jsonl and the run report as
    the site's named metrics; a script's own metric reported once stays beside it. The
    readings are set on the site's board (this host has no GPU; NVML itself is read on a
    lent GPU by scripts/gpu_check.py)."""
    from skyfed.agent.gpus import GpuReading

    run_dir = tmp_path / "run"
    running = serve(task=TASK, rounds=3, run_dir=run_dir)
    model, optimizer = mlp()
    hot = GpuReading(0, "node-a", 0, "NVIDIA H100", 0.5, 20 << 30, 80 << 30, 71.0, 400.0)
    with skyfed.Site(model, optimizer, cloud="aws", certs=pki.directory,
                     coordinator=f"localhost:{running.port}", local_steps=2) as site:  # fmt: skip
        site._site.gpus.update([hot], "")
        site.report({"accuracy": 0.5})
        train(site, model, optimizer, steps=100)
    aws = next(a for a in running.federation.status(departed=True).agents if a.name == "aws-1")
    assert aws.metrics == {
        "accuracy": 0.5,
        "gpu_util_pct": 50.0,
        "gpu_memory_pct": 25.0,
        "gpu_temperature_c": 71.0,
        "gpu_power_w": 400.0,
    }

    def carried() -> list[dict]:
        text = (run_dir / "rounds.jsonl").read_text().splitlines()
        return [
            x["links"]["aws-1"]["metrics"] for x in map(json.loads, text) if x["kind"] == "round"
        ]

    wait_until(lambda: len(carried()) == 3, 10, "three round lines")  # written as rounds close
    assert all(m["gpu_temperature_c"] == 71.0 for m in carried())
    assert "aws-1 gpu_temperature_c" in make_report(run_dir).read_text()


def test_a_sites_gpu_summary_gives_way_to_the_scripts_own_metrics():
    from skyfed.agent.gpus import GpuBoard, GpuReading
    from skyfed.coordinator.inbound import latest_metrics
    from skyfed.wire import MAX_METRICS

    board = GpuBoard()
    assert board.summary() == {}  # a CPU site sends none
    board.update([GpuReading(r, "n", r, "g", 0.25 * r, 1, 4, 60.0 + r, 300.0) for r in (1, 3)], "")
    assert board.summary() == {
        "gpu_util_pct": 50.0,
        "gpu_memory_pct": 25.0,
        "gpu_temperature_c": 63.0,
        "gpu_power_w": 600.0,
    }
    full = {f"m{i}": float(i) for i in range(MAX_METRICS)}
    held = latest_metrics(board.summary(), full)
    assert held == full  # a full report of the script's own leaves no room
    assert latest_metrics(held, {"m0": 9.0})["m0"] == 9.0
