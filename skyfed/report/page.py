"""``report.html``: the run's figures with a short table of its totals."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from skyfed.coordinator.snapshot import run_wall_s
from skyfed.report.data import RunData, load
from skyfed.report.plots import all_plots

REPORT = "report.html"
CAPTIONS = {
    "loss": "Training loss (mean over the round's contributors) and held-out loss of the "
    "coordinator's canonical weights, by round and by wall time since the coordinator started.",
    "time": "Each round's wall time, split into the slowest contributor's local training and "
    "the rest (upload, aggregation, broadcast): the exchange.",
    "bytes": "Chunk bytes each link carried per round, on the wire, against the same tensors "
    "as fp32 (dotted); log scale. Links that carried the same bytes coincide: the first is "
    "drawn widest, each puts its markers on other rounds.",
    "efficiency": "Each link's exchange in each round against its physical floor, one RTT "
    "plus its bytes at the link's rate (1x: as fast as the link allows; docs/striping.md), "
    "as its agent timed it; log scale.",
    "links": "Each link's codec over the rounds (the band), under its smoothed round-trip time "
    "and probe loss as the coordinator measured them when the round closed.",
    "metrics": "Named metrics by round: the held-out evaluation of the canonical weights "
    "(the task's eval_metrics) and what each site's own script reported with its "
    "contribution to that round (skyfed.Site.report; docs/own-loop.md).",
}


def make_report(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Write the PNGs and ``report.html`` into ``out_dir`` (default ``run_dir``)."""
    data = load(run_dir)
    out_dir = out_dir or run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = all_plots(data, out_dir)
    page = out_dir / REPORT
    page.write_text(_page(run_dir, data, plots))
    return page


def _rows(pairs: list[tuple[str, str]]) -> str:
    return "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in pairs)


def _page(run_dir: Path, data: RunData, plots: dict[str, Path]) -> str:
    rows = _rows(_totals(data))
    options = _flat((data.run or {}).get("configuration", {}))
    configuration = (
        f'<details id="configuration"><summary>every option ({len(options)})</summary>'
        f"<table>{_rows(options)}</table></details>"
        if options
        else ""
    )
    figures = "".join(
        f'<figure><img src="{p.name}" alt="{name}"><figcaption>{CAPTIONS[name]}</figcaption>'
        "</figure>"
        for name, p in plots.items()
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>skyfed run report</title>
<style>
body {{ font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
th, td {{ text-align: left; padding: 0.2em 1em 0.2em 0; border-bottom: 1px solid #ddd; }}
figure {{ margin: 0 0 2em 0; }} img {{ max-width: 100%; }}
figcaption {{ font-size: 0.9em; color: #555; }}
details {{ margin-bottom: 1.5em; }}
</style></head><body>
<h1>skyfed run report</h1><p>{html.escape(str(run_dir))}</p>
<h2>What was run</h2>
<table id="run">{_rows(_what_was_run(data))}</table>
{configuration}
<h2>Totals</h2>
<table id="totals">{rows}</table>
{figures}
</body></html>
"""


def _what_was_run(data: RunData) -> list[tuple[str, str]]:
    """The run's identity (``run.json``) and the codecs its links ran on."""
    used = sorted({c for link in data.links.values() for c in link.codec if c})
    run = data.run
    if run is None:
        return [("recorded", "no run.json: a coordinator from before it was written")] + (
            [("codecs the links used", ", ".join(used))] if used else []
        )
    config = run.get("configuration", {})
    versions = ", ".join(f"{k} {v}" for k, v in run.get("versions", {}).items())
    rows = [
        ("started", f"{run.get('started', '?')} on {run.get('host', '?')}"),
        ("task", str(run.get("task", "?"))),
        ("codec", f"{run.get('codec', '?')} (the links used: {', '.join(used) or 'none'})"),
        ("exchange", str(run.get("exchange", "?"))),
        ("outer optimizer", str(config.get("outer_optimizer", "?"))),
        ("rounds planned", str(config.get("rounds", "?"))),
        (
            "agents",
            f"min_agents {config.get('min_agents', '?')}, quorum {config.get('quorum', '?')}",
        ),
        ("versions", versions),
    ]
    return rows


def _flat(config: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """``[("streams.max_streams", "16"), ...]``: every option, nested ones by their path."""
    rows = []
    for key, value in config.items():
        if isinstance(value, dict):
            rows += _flat(value, f"{prefix}{key}.")
        else:
            rows.append((prefix + key, json.dumps(value)))
    return rows


def _totals(data: RunData) -> list[tuple[str, str]]:
    rounds = data.rounds
    if not rounds:
        return [("rounds", "none closed")]
    up, raw_up = sum(r["bytes_up"] for r in rounds), sum(r["raw_bytes_up"] for r in rounds)
    down = sum(r["bytes_down"] for r in rounds)
    raw_down = sum(r["raw_bytes_down"] for r in rounds)
    mean_s = sum(r["duration_s"] for r in rounds) / len(rounds)
    train_s = sum(r["train_s"] for r in rounds) / len(rounds)
    rows = [
        ("rounds", f"{len(rounds)} (rounds {rounds[0]['round']}-{rounds[-1]['round']})"),
        (
            "wall time",
            f"{run_wall_s(rounds):.1f} s, the coordinator's start to round "
            f"{rounds[-1]['round']}'s close",
        ),
        (
            "per round",
            f"{mean_s:.3f} s (training {train_s:.3f} s, exchange {mean_s - train_s:.3f} s)",
        ),
        ("uplink", f"{up / 1e6:.2f} MB on the wire, {raw_up / max(1, up):.1f}x less than fp32"),
        (
            "downlink",
            f"{down / 1e6:.2f} MB on the wire, {raw_down / max(1, down):.1f}x less than fp32",
        ),
        ("training loss", f"{rounds[0]['mean_loss']:.4f} -> {rounds[-1]['mean_loss']:.4f}"),
    ]
    finite = [e for e in data.evals if math.isfinite(e["eval_loss"])]
    if finite:
        rows.append(
            ("held-out loss", f"{finite[-1]['eval_loss']:.4f} (round {finite[-1]['round']})")
        )
    for name, sources in data.metrics().items():
        for source, (at, values) in sources.items():
            rows.append((f"{source} {name}", f"{values[-1]:.4g} (round {at[-1]})"))
    if data.status is not None:
        digest = data.status.get("weightsDigest") or data.status.get("weights_digest", "")
        rows.append(("weights digest", digest[:16]))
    return rows
