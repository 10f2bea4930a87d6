"""The report's figures: matplotlib, headless, sized and labelled for a paper's column."""

from __future__ import annotations

import math
from itertools import groupby
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: the report is made on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator  # noqa: E402

from skyfed.compression import capabilities  # noqa: E402
from skyfed.report.data import RunData  # noqa: E402

STYLE: dict[Any, Any] = {  # matplotlib types its keys as a Literal of every rc name
    "font.size": 8,
    "axes.titlesize": 9,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "lines.linewidth": 1.2,
    "legend.frameon": False,
    "savefig.dpi": 150,
}
# Okabe-Ito: distinguishable in colour-blind vision and in greyscale print.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000")
LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v")
WIDTH_IN = 7.0  # a two-column figure's width, in inches


def all_plots(data: RunData, out: Path) -> dict[str, Path]:
    """Write every figure into ``out``; name -> PNG path, in the page's order."""
    figures = {
        "loss": _loss,
        "time": _time_split,
        "bytes": _bytes,
        "efficiency": _efficiency,
        "links": _links,
    }
    if data.metrics():
        figures["metrics"] = _metrics
    paths = {}
    with plt.rc_context(STYLE):
        for name, draw in figures.items():
            fig = draw(data)
            for ax in fig.get_axes():
                if ax.get_xlabel() == "round":
                    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
            path = out / f"{name}.png"
            fig.savefig(path, bbox_inches="tight")
            plt.close(fig)
            paths[name] = path
    return paths


def series_style(i: int, n: int) -> dict[str, Any]:
    """How the ``i``-th of ``n`` series on one axes is drawn, so that series that coincide
    (links on one codec carry the same bytes) all stay visible: each has its own colour,
    dash and marker; earlier series are drawn wider and lower, so a later one runs inside
    them; and each puts its markers on other rounds (``markevery`` with its own phase)."""
    return {
        "color": PALETTE[i % len(PALETTE)],
        "ls": LINESTYLES[i % len(LINESTYLES)],
        "marker": MARKERS[i % len(MARKERS)],
        "lw": 1.0 + 1.2 * (n - 1 - i),
        "ms": 3.5 + 1.0 * (n - 1 - i),
        "markevery": (i % max(1, n), max(1, n)),
        "zorder": 2 + i,
    }


def _loss(data: RunData) -> plt.Figure:
    fig, (by_round, by_wall) = plt.subplots(1, 2, figsize=(WIDTH_IN, 2.6), sharey=True)
    rounds, wall, train = data.column("round"), data.column("wall_s"), data.column("mean_loss")
    ev_rounds = [e["round"] for e in data.evals if math.isfinite(e["eval_loss"])]
    ev_loss = [e["eval_loss"] for e in data.evals if math.isfinite(e["eval_loss"])]
    ev_wall = [data.wall_at(r) for r in ev_rounds]
    for ax, x, ex in ((by_round, rounds, ev_rounds), (by_wall, wall, ev_wall)):
        ax.plot(x, train, color=PALETTE[0], label="training (mean of contributors)")
        if ev_loss:
            ax.plot(ex, ev_loss, "o-", color=PALETTE[3], ms=3, label="held-out (canonical weights)")
    _failovers(by_round, [f["round"] - 0.5 for f in data.failovers])
    _failovers(by_wall, [f.get("wall_s", math.nan) for f in data.failovers])
    by_round.set(xlabel="round", ylabel="loss", title="Loss by round")
    by_wall.set(xlabel="wall time since the coordinator started (s)", title="Loss by wall time")
    by_round.legend(loc="upper right")
    fig.tight_layout()
    return fig


METRIC_PANELS = 6
"""Named metrics drawn at most (one panel each); the totals table lists every one."""


def _metrics(data: RunData) -> plt.Figure:
    """One panel per named metric: the held-out evaluation's and each site's reports."""
    named = list(data.metrics().items())[:METRIC_PANELS]
    cols = min(3, len(named))
    rows = -(-len(named) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(WIDTH_IN, 2.3 * rows), squeeze=False)
    for ax, (name, sources) in zip(axes.flat, named, strict=False):
        for i, (source, (rounds, values)) in enumerate(sources.items()):
            style = series_style(i, len(sources))
            ax.plot(rounds, values, label=source, **style)
        ax.set(xlabel="round", title=name)
        ax.legend(loc="best")
    for ax in list(axes.flat)[len(named) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def _time_split(data: RunData) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 2.4))
    rounds, train = data.column("round"), data.column("train_s")
    exchange = data.column("exchange_s")
    width = 0.8 if len(rounds) < 80 else 1.0
    ax.bar(rounds, train, width, color=PALETTE[0], label="training (slowest contributor)")
    ax.bar(rounds, exchange, width, bottom=train, color=PALETTE[1], label="exchange")
    # The fastest each round could have been: its training, then its slowest link's
    # exchange floor (one RTT and its bytes at the link's rate, docs/striping.md).
    # A mark across each bar, where its top would be with no time lost on the links.
    floor = [t + f for t, f in zip(train, data.column("floor_s"), strict=True)]
    if any(math.isfinite(f) for f in floor):
        left, right = [r - width / 2 for r in rounds], [r + width / 2 for r in rounds]
        ax.hlines(floor, left, right, color="black", lw=1.2, label="training + exchange floor")
    _failovers(ax, [f["round"] - 0.5 for f in data.failovers])
    ax.set(xlabel="round", ylabel="seconds", title="Round time: training and exchange")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.2)  # headroom for the legend over the bars
    ax.legend(loc="upper right", ncol=3)
    fig.tight_layout()
    return fig


def _failovers(ax: plt.Axes, xs: list[float]) -> None:
    """A dashed line where a coordinator replica took over (docs/failover.md), labelled
    once in the legend."""
    label = "failover (new leader)"
    for x in xs:
        if math.isfinite(x):
            ax.axvline(x, color=PALETTE[6], ls="--", lw=0.8, label=label)
            label = "_nolegend_"


def _bytes(data: RunData) -> plt.Figure:
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH_IN, 2.6), sharey=True)
    rounds = data.column("round")
    # Every link receives the whole model each round: its fp32 size is the raw reference.
    links_per_round = [max(1, len(r.get("links", {}))) for r in data.rounds]
    raw = [r / n / 1e6 for r, n in zip(data.column("raw_bytes_down"), links_per_round, strict=True)]
    for ax, direction in ((axes[0], "up"), (axes[1], "down")):
        for i, (name, link) in enumerate(data.links.items()):
            sent = [b / 1e6 if b > 0 else math.nan for b in getattr(link, f"bytes_{direction}")]
            ax.plot(link.rounds, sent, label=name, **series_style(i, len(data.links)))
        ax.plot(rounds, raw, color="grey", ls=":", lw=1, label="fp32 (uncompressed)")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        label = "agent → coordinator" if direction == "up" else "coordinator → agent"
        ax.set(xlabel="round", title=f"{'Uplink' if direction == 'up' else 'Downlink'}: {label}")
    axes[0].set_ylabel("MB per round per link (log)")
    axes[1].legend(loc="best")
    fig.tight_layout()
    return fig


def _efficiency(data: RunData) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 2.4))
    timed = {n: s for n, s in data.links.items() if any(math.isfinite(r) for r in s.ratio)}
    for i, (name, link) in enumerate(timed.items()):
        ax.plot(link.rounds, link.ratio, label=name, **series_style(i, len(timed)))
    if timed:
        ax.axhline(1.0, color="grey", ls=":", lw=1, label="the floor (RTT + bytes / rate)")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.legend(loc="best")
    else:
        ax.text(0.5, 0.5, "no link's exchange was timed", ha="center", va="center")
    ax.set(
        xlabel="round", ylabel="exchange / floor", title="Each link's exchange against its floor"
    )
    fig.tight_layout()
    return fig


def _links(data: RunData) -> plt.Figure:
    names = list(data.links) or ["(no links)"]
    fig = plt.figure(figsize=(WIDTH_IN, 1.9 * len(names) + 0.4), layout="constrained")
    rows = fig.subfigures(len(names), 1, squeeze=False)[:, 0]
    span = data.column("round")
    xlim = (min(span, default=0) - 0.6, max(span, default=1) + 0.6)
    for i, (row, name) in enumerate(zip(rows, names, strict=True)):
        strip, ax = row.subplots(2, 1, sharex=True, height_ratios=[1, 5])
        ax.set_xlim(*xlim)
        row.suptitle(f"{name}", x=0.01, ha="left", fontsize=9, fontweight="bold")
        link = data.links.get(name)
        if link is not None:
            _codec_strip(strip, link.rounds, link.codec)
            rtt = [v if v > 0 else math.nan for v in link.rtt_ms]  # 0: not measured yet
            ax.plot(link.rounds, rtt, color=PALETTE[0], marker=".", ms=3)
            twin = ax.twinx()
            twin.plot(link.rounds, link.loss_pct, color=PALETTE[3], ls="--")
            twin.set_ylabel("probe loss (%)", color=PALETTE[3])
            finite = [v for v in link.loss_pct if math.isfinite(v)]
            twin.set_ylim(0, max(1.0, 1.2 * max(finite, default=0.0)))
            twin.grid(False)
            twin.spines["right"].set_visible(True)
        ax.set_ylabel("RTT (ms)", color=PALETTE[0])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("round")  # every row's: it marks the axis as one of rounds
        if i < len(names) - 1:
            ax.xaxis.label.set_visible(False)
    used = sorted({c for s in data.links.values() for c in s.codec}, key=codec_style)
    fig.legend(
        handles=[Patch(color=codec_style(c)[1], label=c) for c in used],
        loc="outside upper right",
        ncol=max(1, len(used)),
        title="codec (band)",
        fontsize=7,
    )
    return fig


def codec_style(name: str) -> tuple[float, str]:
    """A codec's place in a legend and its colour, from its capabilities (lightest
    compression first); a codec this build does not know (a history recorded by
    another) comes last, in black."""
    try:
        each = capabilities(name)
    except ValueError:
        return math.inf, "black"
    return each.heaviness, each.color


def _codec_strip(ax: plt.Axes, rounds: list[int], codecs: list[str]) -> None:
    """Each run of one codec as a coloured band over the rounds it covered."""
    i = 0
    for codec, run in groupby(codecs):
        n = len(list(run))
        start, end = rounds[i] - 0.5, rounds[i + n - 1] + 0.5
        ax.broken_barh([(start, end - start)], (0, 1), color=codec_style(codec)[1])
        if n >= max(2, len(rounds) // 12):
            ax.text((start + end) / 2, 0.5, codec, ha="center", va="center", fontsize=6)
        i += n
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.tick_params(bottom=False, labelbottom=False)
    ax.grid(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
