"""A real federation watched the way an operator would: a real Prometheus server scrapes
it, the run report opens in a real Chromium, the exported model loads into the task's model."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import torch

from skyfed.certs.testing import make_federation
from skyfed.coordinator import history
from skyfed.procs import Children, command, terminate, wait_for_file
from skyfed.tasks import load_task
from tests.browser import Browser

pytestmark = pytest.mark.multiprocess

PROMETHEUS = "/usr/bin/prometheus"
CLOUDS = ("aws", "gcp", "azure")
ROUNDS = 12


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prometheus(work: Path, targets: list[str]) -> tuple[subprocess.Popen, str]:
    """Debian's Prometheus scraping ``targets`` every second; fails when it is missing."""
    assert Path(PROMETHEUS).exists(), f"{PROMETHEUS} is missing (Debian package prometheus)"
    config = work / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
        "  - job_name: skyfed\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(t) for t in targets)}]\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=open(work / "prometheus.log", "wb"),  # noqa: SIM115 - owned by the child
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as reply:
                if reply.status == 200:
                    return proc, url
        except OSError:
            pass
        assert proc.poll() is None, (work / "prometheus.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "prometheus did not become ready"
        time.sleep(0.3)


def promql(url: str, query: str) -> list[dict]:
    qs = urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(f"{url}/api/v1/query?{qs}", timeout=5) as reply:
        body = json.loads(reply.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for_series(url: str, query: str, timeout_s: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while not (result := promql(url, query)):
        assert time.monotonic() < deadline, f"no series for {query}"
        time.sleep(0.5)
    return result


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    """One 12-round federation (coordinator and three agents as processes) with every
    operator feature on, scraped by Prometheus; yields once it has finished."""
    work = tmp_path_factory.mktemp("observed")
    make_federation(work / "certs")
    metrics = {name: free_port() for name in ("coordinator", *CLOUDS)}
    prom, url = start_prometheus(work, [f"127.0.0.1:{p}" for p in metrics.values()])
    kids = Children(work / "logs")
    try:
        flags = {
            "--certs": work / "certs",
            "--listen": "127.0.0.1:0",
            "--port-file": work / "port",
            "--rounds": ROUNDS,
            "--min-agents": 3,
            "--eval-every": 4,
            "--checkpoint-dir": work / "ckpt",
            "--run-dir": work / "run",
            "--export": work / "model.pt",
            "--metrics-listen": f"127.0.0.1:{metrics['coordinator']}",
            "--log-format": "json",
        }
        argv = command("coordinator", "serve", *(str(x) for kv in flags.items() for x in kv))
        port = int(wait_for_file(work / "port", 60, kids.start("coordinator", argv)))
        for i, cloud in enumerate(CLOUDS):
            agent = {
                "--cloud": cloud,
                "--coordinator": f"localhost:{port}",
                "--certs": work / "certs",
                "--shard": i,
                "--num-shards": 3,
                "--local-steps": 1,
                "--metrics-listen": f"127.0.0.1:{metrics[cloud]}",
            }
            argv = command("agent", "start", *(str(x) for kv in agent.items() for x in kv))
            if cloud == CLOUDS[-1]:
                # Round 0 waits for all three: scraped now, two agents are in a session
                # and the coordinator says what it waits for.
                connected = wait_for_series(url, "skyfed_agent_connected == 1", timeout_s=180)
                wait_for_series(url, 'skyfed_agents{state="idle"} == 2', timeout_s=60)
            kids.start(cloud, argv)
        for name in ("coordinator", *CLOUDS):
            code = kids.procs[name].wait(timeout=240)
            assert code == 0, f"{name} exited {code}:\n{kids.log(name)[-3000:]}"
        targets = [f"127.0.0.1:{p}" for p in metrics.values()]
        yield {
            "work": work,
            "prometheus": url,
            "connected": connected,
            "metrics": metrics,
            "targets": targets,
        }
    finally:
        kids.stop_all()
        terminate(prom)


def test_prometheus_scrapes_rounds_links_and_agents(run):
    url = run["prometheus"]
    assert {
        s["metric"]["instance"] for s in promql(url, 'max_over_time(up{job="skyfed"}[10m]) == 1')
    } == set(run["targets"])
    rounds = promql(url, "max(last_over_time(skyfed_rounds_total[10m]))")
    assert float(rounds[0]["value"][1]) >= 1
    for kind in ("wire", "raw"):
        q = f'last_over_time(skyfed_link_bytes_total{{direction="up",kind="{kind}"}}[10m])'
        up = promql(url, q)
        assert {s["metric"]["agent"] for s in up} == {"aws-1", "gcp-1", "azure-1"}, kind
        assert all(float(s["value"][1]) > 0 for s in up)
    checkpoints = promql(url, "max(last_over_time(skyfed_checkpoints_total[10m]))")
    assert float(checkpoints[0]["value"][1]) >= 1
    codec = promql(url, "last_over_time(skyfed_link_codec[10m]) == 1")
    assert {s["metric"]["agent"] for s in codec} == {"aws-1", "gcp-1", "azure-1"}
    histogram = promql(url, "max(last_over_time(skyfed_round_duration_seconds_count[10m]))")
    assert float(histogram[0]["value"][1]) >= 1
    ratio = promql(url, "last_over_time(skyfed_link_exchange_floor_ratio[10m])")
    # A link's ratio is exported once its RTT and rate are known (NaN is left out): on a
    # loaded host a link may not have both by the last scrape, so at least one, none alien.
    timed = {s["metric"]["agent"] for s in ratio}
    assert timed and timed <= {"aws-1", "gcp-1", "azure-1"}, ratio
    assert all(float(s["value"][1]) > 0 for s in ratio), ratio
    streams = promql(url, "max_over_time(skyfed_link_streams[10m])")
    assert {s["metric"]["agent"] for s in streams} == {"aws-1", "gcp-1", "azure-1"}
    agents = {f"127.0.0.1:{run['metrics'][c]}" for c in CLOUDS}
    assert {s["metric"]["instance"] for s in run["connected"]} <= agents


def test_held_out_loss_is_recorded_and_scraped(run):
    lines = [json.loads(x) for x in (run["work"] / "run" / "rounds.jsonl").read_text().splitlines()]
    # One line per closed round; the links' timings, known a round later, on their own lines
    assert sorted(x["round"] for x in lines if x["kind"] == "round") == list(range(ROUNDS))
    folded = history.rounds(lines)
    rounds = [folded[k] for k in sorted(folded)]
    evals = [x for x in lines if x["kind"] == "eval"]
    assert [r["round"] for r in rounds] == list(range(ROUNDS))
    # Each agent times a round's exchange in its next contribution: all rounds but the last.
    for r in rounds[:-1]:
        for name, link in r["links"].items():
            assert link["exchange_s"] > 0 and "ratio" in link, (r["round"], name, link)
    assert rounds[-2]["floor_s"] > 0, rounds[-2]  # the links' RTTs and rates are known by then
    assert all(link["ratio"] > 0 for link in rounds[-2]["links"].values()), rounds[-2]
    assert {e["round"] for e in evals} >= {ROUNDS - 1}, evals  # the final weights
    assert all(0 < e["eval_loss"] < 10 for e in evals)
    assert set(rounds[-1]["links"]) == {"aws-1", "gcp-1", "azure-1"}
    assert all(link["raw_bytes_down"] > 0 for link in rounds[-1]["links"].values())
    status = json.loads((run["work"] / "run" / "status.json").read_text())
    assert int(status["evalRound"]) == ROUNDS - 1 and status["evalLoss"] == evals[-1]["eval_loss"]
    assert int(status["checkpoints"]) == ROUNDS


def test_exported_model_loads_into_the_tasks_model(run):
    work = run["work"]
    meta = json.loads((work / "model.json").read_text())
    status = json.loads((work / "run" / "status.json").read_text())
    assert meta["round"] == ROUNDS - 1 and meta["task"] == "chargpt"
    assert meta["weights_digest"] == status["weightsDigest"]
    model = load_task("chargpt").build_model(0)
    model.load_state_dict(torch.load(work / "model.pt", weights_only=True))  # strict
    again = work / "again.pt"
    argv = command(
        "coordinator", "export", "--checkpoint-dir", str(work / "ckpt"), "--out", str(again)
    )
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    assert json.loads((work / "again.json").read_text())["weights_digest"] == meta["weights_digest"]


def test_coordinator_json_logs_are_one_object_per_line(run):
    lines = (run["work"] / "logs" / "coordinator.log").read_text().splitlines()
    records = [json.loads(x) for x in lines if x.startswith("{")]
    assert any("[Coordinator.Round]" in r["message"] for r in records)
    waits = [r["message"] for r in records if "[Coordinator.Wait]" in r["message"]]
    assert "waiting for 3 agents, 2 connected: aws-1, gcp-1" in waits[-1], waits
    assert all({"ts", "level", "logger", "message"} <= set(r) for r in records)


def test_report_page_shows_every_plot_in_chromium(run, tmp_path):
    run_dir = run["work"] / "run"
    result = subprocess.run(
        [sys.executable, "-m", "skyfed", "report", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    page = run_dir / "report.html"
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(page.as_uri())
        images = browser.images()
        browser.screenshot(tmp_path / "report.png")
    finally:
        browser.close()
    assert sorted(src for src, _ in images) == [
        "bytes.png", "efficiency.png", "links.png", "loss.png", "time.png"
    ]  # fmt: skip
    assert all(width > 0 for _, width in images), images
    assert (tmp_path / "report.png").stat().st_size > 10_000
