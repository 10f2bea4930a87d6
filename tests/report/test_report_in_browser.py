"""The run report in a real browser (headless Chromium): it says what was run, shows
every figure, the links' efficiency among them, and one wall time."""

from __future__ import annotations

from skyfed.coordinator import runinfo
from skyfed.coordinator.admin import summary_table
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.report import make_report
from skyfed.report.data import load
from tests.browser import Browser
from tests.report.test_report import record_run

FIGURES = ["bytes.png", "efficiency.png", "links.png", "loss.png", "time.png"]


def table(browser: Browser, table_id: str) -> dict[str, str]:
    return dict(
        browser.evaluate(
            f"[...document.querySelectorAll('#{table_id} tr')]"
            ".map(r => [r.querySelector('th').textContent, r.querySelector('td').textContent])"
        )
    )


def test_the_report_says_what_was_run_and_shows_every_figure(pki, tmp_path):
    run_dir = tmp_path / "run"
    record_run(run_dir, timed=True)
    config = CoordinatorConfig.from_flat(
        certs=pki.directory, codec="auto", rounds=8, run_dir=run_dir
    )
    runinfo.write(run_dir, config)
    page = make_report(run_dir)
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(page.as_uri())
        images = browser.images()
        run, totals = table(browser, "run"), table(browser, "totals")
        options = browser.evaluate("document.querySelector('#configuration').textContent")
        browser.screenshot(tmp_path / "report.png")
    finally:
        browser.close()
    assert sorted(src for src, _ in images) == FIGURES
    assert all(width > 0 for _, width in images), images
    assert run["task"] == "chargpt"
    assert run["codec"] == "auto (the links used: fp16, topk)"
    assert run["started"].startswith(runinfo.describe(config)["started"][:10])  # the date
    assert "torch 2.13.0" in run["versions"] and "skyfed " in run["versions"]
    assert "streams.max_streams" in options and "round_deadline_s" in options
    # The report's wall time is the run summary's: the coordinator's start to the last close.
    summary = summary_table({**to_snapshot(run_dir), "weights_digest": ""})
    assert totals["wall time"].startswith("9.0 s")
    assert "8 in 9.0 s wall" in [str(c) for c in summary.columns[1]._cells]


def to_snapshot(run_dir) -> dict:
    """The run's rounds as a status snapshot holds them (what the run summary reads)."""
    rounds = [
        {k: r[k] for k in ("round", "duration_s", "train_s", "wall_s", "mean_loss")}
        | {k: r[k] for k in ("bytes_up", "bytes_down", "raw_bytes_up", "raw_bytes_down")}
        for r in load(run_dir).rounds
    ]
    return {"rounds": rounds, "eval_round": -1, "eval_loss": float("nan")}
