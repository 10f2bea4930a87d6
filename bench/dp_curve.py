"""Per-step FP32 data-parallel's held-out evaluations around S, each printed: the window
``bench/convergence.py --to-target`` averages into its smoothed target (bench/targets.py's
``reference``), with its spread, to tell a seed's miss from the target's noise.

    python bench/dp_curve.py chargpt 8192 3,4      # task, S, seeds (2 processes)
"""

import argparse
import statistics
from concurrent.futures import ProcessPoolExecutor

import targets  # bench/, the script's own folder
import torch
from baseline import DataParallel

from skyfed.tasks import load_task


def curve(task_key: str, steps: int, seed: int) -> list[tuple[int, float]]:
    """One seed's (step, held-out loss) at S - 5e ... S + 5e, as ``targets.reference``
    trains and evaluates it."""
    sizes = targets.Sizes(steps=steps, cap=1.5, sites=2, seeds=(seed,))
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    dp = DataParallel(load_task(sizes.task(task_key)), seed, sizes.sites)
    e = sizes.eval_every
    out = []
    for step in range(1, steps + targets.SMOOTH * e + 1):
        dp.step()
        if abs(step - steps) <= targets.SMOOTH * e and (step - steps) % e == 0:
            out.append((step, dp.eval_loss()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=sorted(targets.TASKS))
    parser.add_argument("steps", type=int, help="S, the reference's steps")
    parser.add_argument("seeds", help="comma-separated, e.g. 3,4")
    args = parser.parse_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"seeds {args.seeds!r}: comma-separated integers")
    if args.steps < 1:
        parser.error("steps must be >= 1")
    task_key, steps = args.task, args.steps
    n = len(seeds)
    with ProcessPoolExecutor(2) as pool:
        curves = list(pool.map(curve, [task_key] * n, [steps] * n, seeds))
    for seed, c in zip(seeds, curves, strict=True):
        losses = [loss for _, loss in c]
        mean = statistics.fmean(losses)
        sd = statistics.stdev(losses)
        print(f"{task_key} seed {seed}: " + " ".join(f"{s}:{x:.4f}" for s, x in c))
        print(
            f"  at S {dict(c)[steps]:.4f}; mean {mean:.4f}; sd {sd:.4f}; "
            f"se of the mean {sd / len(losses) ** 0.5:.4f}"
        )


if __name__ == "__main__":
    main()
