"""deploy/grafana/skyfed.json asks only for metrics the exporters serve, in valid PromQL."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from skyfed.metrics.agent import AgentCollector
from skyfed.metrics.coordinator import CoordinatorCollector
from tests.metrics.test_metrics_endpoint import get

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "skyfed.json"
PROMTOOL = "/usr/bin/promtool"
NAME = re.compile(r"\bskyfed_[a-z0-9_]+")
SERIES = re.compile(r"^(skyfed_[a-z0-9_]+)", re.M)


def queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p["targets"]]


def served_names(text: str) -> set[str]:
    """Series names as Prometheus stores them (``_total``, ``_bucket``, ... included)."""
    return set(SERIES.findall(text))


def agent_exposition() -> str:
    registry = CollectorRegistry()
    snap = {"name": "aws-1", "cloud": "aws", "connected": True, "round": 0, "loss": 1.0}
    gpu = {"rank": 0, "host": "node-a", "index": 0, "utilization": 0.9, "temperature_c": 70.0}
    gpu |= {"memory_used_bytes": 1 << 30, "memory_total_bytes": 80 << 30, "power_w": 600.0}
    snap |= {"dp": 2, "tp": 1, "gpus": [gpu], "metrics": {"accuracy": 0.5}}
    registry.register(AgentCollector(lambda: snap))
    return generate_latest(registry).decode()


def full_coordinator_exposition() -> str:
    """Every optional coordinator field filled, so every family has a sample."""
    agent = {"name": "aws-1", "state": "idle", "codec": "fp16", "bytes_up": 1, "bytes_down": 1}
    agent.update(raw_bytes_up=2, raw_bytes_down=2, streams=2, efficiency={"ratio": 1.5})
    agent.update(metrics={"accuracy": 0.5}, metrics_round=0)
    rnd = {"round": 0, "duration_s": 1.0, "train_s": 0.5, "contributors": 1, "mean_loss": 2.0}
    rnd.update(bytes_up=1, bytes_down=1, raw_bytes_up=2, raw_bytes_down=2)
    snap = {
        "round": 1,
        "rounds": [rnd],
        "agents": [agent],
        "min_agents": 1,
        "eval_round": 0,
        "eval_loss": 2.0,
        "eval_metrics": {"loss": 2.0, "accuracy": 0.5},
        "refusals": {"ABORTED": 1},
        "checkpoints": 1,
        "checkpoint_s": 0.1,
        "replicas": {
            "term": 7,
            "leader": "a",
            "leading": True,
            "alone": False,
            "members": [{"name": "a", "lag": 0}, {"name": "b", "lag": 1}],
            "failovers": [{"cause": "lease expired", "duration_s": 3.2}],
        },
    }
    registry = CollectorRegistry()
    registry.register(CoordinatorCollector(lambda: snap))
    return generate_latest(registry).decode()


def test_every_panel_query_names_a_metric_the_exporters_serve(serve):
    running = serve(metrics_listen="127.0.0.1:0")
    _, live = get(running.metrics_port, "/metrics")  # the real port, before any round
    served = served_names(live) | served_names(full_coordinator_exposition())
    served |= served_names(agent_exposition())
    asked = {name for q in queries() for name in NAME.findall(q)}
    assert asked, "the dashboard has no queries"
    assert asked <= served, f"not served: {sorted(asked - served)}"


def test_every_metric_family_has_a_panel():
    from skyfed.metrics.catalog import METRICS

    asked = " ".join(queries())
    informational = {"skyfed_build_info", "skyfed_agent_info", "skyfed_uptime_seconds"}
    missing = [m.name for m in METRICS if m.name not in asked and m.name not in informational]
    # A few series are read through another's panel (finished: Round; last_round: agents).
    assert set(missing) <= {
        "skyfed_finished",
        "skyfed_link_last_round",
        "skyfed_round_contributors",
        "skyfed_eval_round",
        "skyfed_agent_rounds_total",
        "skyfed_agent_training_loss",
        "skyfed_agent_codec",
    }, missing


def test_every_panel_query_is_valid_promql(tmp_path):
    assert Path(PROMTOOL).exists(), f"{PROMTOOL} is missing (Debian package prometheus)"
    rules = {"groups": [{"name": "dashboard", "rules": []}]}
    for i, expr in enumerate(queries()):
        rules["groups"][0]["rules"].append({"record": f"skyfed:panel_{i}", "expr": expr})
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
