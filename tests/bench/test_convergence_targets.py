"""``bench/convergence.py --to-target --quick``: the bytes-to-target table end to end."""

from __future__ import annotations

import importlib
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "convergence.py"
ROW = re.compile(r"^H=\d+ (sgd|nesterov) \S.*?\s+\d/2(\s|$)")
RATIO_STEPS = re.compile(r"([\d.]+)x ±\s*[\d.]+\s+([\d.]+)x ±\s*[\d.]+$")
LAST = re.compile(r"^best bytes-to-target ratio: \d+x \(H=\d+ \w+ .+\) at \d+\.\dx the steps$")


def _bench(*args: str, timeout: int, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``bench/convergence.py`` run as a user runs it, its output captured."""
    return subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def test_quick_to_target_prints_both_tasks_tables_and_the_best_ratio():
    out = _bench("--to-target", "--quick", "--jobs", "2", timeout=120, check=True).stdout
    lines = out.strip().splitlines()
    for task in ("chargpt", "digits"):
        header = next(i for i, line in enumerate(lines) if line.startswith(f"{task}: target"))
        assert "per-step FP32 data-parallel after S=16 steps" in lines[header]
        assert lines[header + 1].split()[:2] == ["configuration", "seeds"]
        rows = lines[header + 2 : header + 6]  # H=4 x (sgd, nesterov) x (fp32, topk 2-bit)
        assert all(ROW.match(r) for r in rows), rows
        assert [r.split()[1:3] for r in rows] == [
            ["sgd", "fp32"],
            ["sgd", "topk"],
            ["nesterov", "fp32"],
            ["nesterov", "topk"],
        ]
        # FP32 deltas send per round what data parallelism sends per step: four local
        # steps per round send a quarter of its bytes per step, to a target within 1.5x S
        ratio, steps = (float(x) for x in RATIO_STEPS.search(rows[0]).groups())
        assert rows[0].split()[3] == "2/2" and ratio * steps == pytest.approx(4, rel=0.2)
    assert LAST.match(lines[-1]), lines[-1]


def test_unknown_task_is_a_one_line_usage_error():
    done = _bench("--to-target", "--tasks", "mnist", timeout=60)
    assert done.returncode == 2
    assert "--tasks 'mnist': choose from chargpt, digits, llama" in done.stderr.splitlines()[-1]


def test_llama_example_runs_to_target_through_the_same_reading():
    """The Hugging Face Llama example (shrunk by ``--task-options``) gets its reference,
    its table and its per-seed line as the embedded tasks do; FP32 deltas of 2 local steps
    send per round what data-parallel sends per step, so the ratio times steps/S is 2."""
    out = _bench(
        *("--to-target", "--tasks", "llama", "--steps", "4", "--seeds", "0", "--cap", "4"),
        *("--configs", "H=2 sgd fp32", "--jobs", "1"),
        *("--task-options", "hidden=8&layers=1&heads=2&kv_heads=1&intermediate=16&block=8"),
        timeout=120,
        check=True,
    ).stdout
    lines = out.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("llama: target"))
    assert "after S=4 steps" in lines[header] and "task options hidden=8" in lines[header]
    row = lines[header + 2]
    assert row.startswith("H=2 sgd fp32 ") and row.split()[3] == "1/1", row
    ratio, steps = (float(x) for x in RATIO_STEPS.search(row).groups())
    assert ratio * steps == pytest.approx(2, rel=0.05)
    assert any(line.startswith("llama, point target: seeds reached within 4x S") for line in lines)


def test_configs_option_runs_only_the_named_configurations_at_the_given_sizes():
    out = _bench(
        "--to-target",
        "--tasks",
        "digits",
        "--steps",
        "4,digits=8",
        "--seeds",
        "0",
        "--cap",
        "2",
        "--configs",
        "H=4 sgd:lr=1.5 ecsgd 2-bit b128; H=2 nesterov:lr=0.3,m=0.8 topk 2% 2-bit; "
        "H=4,lr=4.5e-3 sgd fp32",
        timeout=120,
        check=True,
    ).stdout
    lines = out.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("digits: target"))
    assert "after S=8 steps" in lines[header] and "cap 2x S; seeds (0,)" in lines[header]
    rows = [line.split("  ")[0] for line in lines[header + 2 : header + 5]]
    assert rows == [
        "H=4 sgd:lr=1.5 ecsgd 2-bit b128",
        "H=2 nesterov:lr=0.3,m=0.8 topk 2% 2-bit",
        "H=4,lr=0.0045 sgd fp32",  # the local steps' own inner rate
    ]


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ("H=4 sgd zip", "codec 'zip'"),
        ("H=4 adam fp32", "outer_optimizer='adam'"),
        ("H=4 nesterov:lr=0.3,beta=2 fp32", "options are lr= and m="),
        ("sgd fp32", "'H=<local steps>[,lr=<inner lr>] <outer> <codec>'"),
        ("H=4,lr=0 sgd fp32", "the inner lr '0' must be a number > 0"),
    ],
)
def test_a_bad_configuration_is_a_one_line_usage_error(configs, message):
    done = _bench("--to-target", "--configs", configs, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr.splitlines()[-1]


def test_payloads_prints_each_codecs_bytes_with_its_framing_and_indices():
    out = _bench(
        "--to-target",
        "--payloads",
        "--tasks",
        "digits",
        "--configs",
        "H=1 sgd fp32; H=1 sgd topk 1% 2-bit; H=1 sgd ecsgd 2-bit b128",
        timeout=60,
        check=True,
    ).stdout
    rows = {line[:22].strip(): line[22:].split() for line in out.splitlines()[3:6]}
    assert list(rows) == ["fp32", "topk 1% 2-bit", "ecsgd 2-bit b128"]
    fp32, topk, ecsgd = rows.values()
    assert fp32[2] == fp32[5] == "0" and fp32[-1] == "1.0x"  # dense: no indices
    assert int(topk[2]) > 0 and int(topk[1]) < int(topk[0])  # indices and frames within
    assert ecsgd[0] == ecsgd[3] and ecsgd[2] == "0"  # the same codec both ways, no indices


@pytest.fixture(scope="module")
def targets():
    """``bench/targets.py`` as the bench imports it (beside ``convergence.py``)."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        return importlib.import_module("targets")
    finally:
        sys.path.remove(str(BENCH.parent))


def test_other_order_row_is_the_reference_from_the_same_weights_on_other_batches(
    targets, monkeypatch
):
    sizes = targets.Sizes(steps=8, cap=1.5, sites=2, seeds=(0,))
    ref = targets.reference("digits", 0, sizes)
    other = targets.reference_other_order("digits", 0, sizes, targets.OTHER_ORDER, -math.inf)
    at_s = next(e for e in other if e.steps == sizes.steps)
    assert [e.steps for e in other] == list(range(1, 13))  # every e (1 step here) to the cap
    assert at_s.bytes_up + at_s.bytes_down == ref.bytes  # FP32 both ways, every step
    assert at_s.loss != ref.target  # other batches: another draw of the curve
    # With no offset it is the reference's own training: the same initial weights and loop
    monkeypatch.setattr(targets, "ORDER_OFFSET", 0)
    same = targets.reference_other_order("digits", 0, sizes, targets.OTHER_ORDER, -math.inf)
    assert next(e.loss for e in same if e.steps == sizes.steps) == ref.target


def test_other_order_row_reaches_by_the_configurations_rule_and_is_never_the_best(targets):
    sizes = targets.Sizes(steps=8, cap=1.5, sites=2, seeds=(0,), other_order=True)
    assert sizes.grid()[-1] == targets.OTHER_ORDER and "seed+1000" in targets.label(
        targets.OTHER_ORDER
    )
    ref = targets.reference("digits", 0, sizes)
    run = targets.reference_other_order("digits", 0, sizes, targets.OTHER_ORDER, ref.target)
    reached = targets.first(run, ref.target)  # the rule every configuration is read by
    assert reached.reached == (run[-1].loss <= ref.target) and reached.steps == run[-1].steps
    assert not targets.reached_at_goal(ref, run)  # FP32 every step: ~1x, never 1000x
    summary = targets.Summary(1, 1, (5000.0, 0.0), (0.5, 0.0))
    assert "none" in targets.best({targets.OTHER_ORDER: [summary]})


def test_reference_order_other_prints_the_row_its_seeds_and_the_count_against_it():
    out = _bench(
        *("--to-target", "--tasks", "digits", "--steps", "8", "--seeds", "0,1", "--jobs", "2"),
        *("--configs", "H=4 sgd fp32", "--reference-order", "other"),
        timeout=120,
        check=True,
    ).stdout
    lines = out.strip().splitlines()
    row = next(line for line in lines if line.startswith("FP32 DP, batches of seed+1000 "))
    per_seed = next(i for i, line in enumerate(lines) if line.startswith("digits per seed"))
    seeds = next(line for line in lines[per_seed:] if line.startswith("FP32 DP, batches"))
    points = [cell.split(" / ")[0] for cell in re.split(r"\s{2,}", seeds.strip())[1:]]
    count = sum(p != "-" for p in points)
    assert row.split()[5] == f"{count}/2"  # the table's count is the per-seed cells'
    assert (
        f"digits, point target: seeds reached within 1.5x S: FP32 DP, batches of seed+1000 "
        f"{count}/2; H=4 sgd fp32 at >= 1000x 0/2"
    ) in lines
