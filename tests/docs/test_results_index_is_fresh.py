"""docs/results.md is exactly what ``python bench/results_index.py`` writes today."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _index():
    spec = importlib.util.spec_from_file_location(
        "results_index", ROOT / "bench" / "results_index.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_results_page_lists_every_run_as_the_generator_writes_it():
    index = _index()
    fresh = index.render(index.find_runs())
    assert index.OUTPUT.read_text() == fresh, (
        f"{index.OUTPUT} is stale: run `make docs` (python bench/results_index.py)"
    )


def test_every_run_is_named_for_its_date_and_bench(tmp_path):
    index = _index()
    (tmp_path / "2026-12-04-wan-far-links.md").write_text(
        "# Far links\n\n- command: `python bench/wan.py --rounds 6` (as root)\n"
    )
    (run,) = index.find_runs(tmp_path)
    assert (run.date, run.bench, run.title, run.command) == (
        "2026-12-04",
        "wan",
        "Far links",
        "python bench/wan.py --rounds 6",
    )
