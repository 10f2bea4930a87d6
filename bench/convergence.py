"""Convergence benchmark: the embedded task trained with each codec, loss relative to FP32.

    python bench/convergence.py               # default: 3 workers, 150 steps (~5 min, 2 cores)
    python bench/convergence.py --steps 2000  # longer, closer to the asymptote

N simulated workers in one process each compress their gradient with their own error
feedback (``p = g + e; c = C(p); e = p - D(c)``); the coordinator averages the decoded
gradients and, like the real one, compresses the average back with its own error feedback
(DoubleSqueeze) before every worker applies it. Top-k without error feedback shows what the
residual is for. Held-out loss at the end is compared with the FP32 run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from skyfed.compression import Codec, ErrorFeedback, decode_payload, make_codec
from skyfed.compression.schedule import DensityWarmup
from skyfed.tasks import load_task

CodecAt = Callable[[int], Codec]  # step -> the codec used at that step


@dataclass(frozen=True, slots=True)
class Run:
    label: str
    codec_at: CodecAt
    feedback: bool = True
    goal: float | None = None  # allowed loss increase over FP32, as a fraction


def runs(warmup_steps: int) -> list[Run]:
    fixed = {
        name: make_codec(name, **params)
        for name, params in [("fp32", {}), ("fp16", {}), ("bf16", {})]
    }
    warm = DensityWarmup(final=0.001, start=0.25, steps=warmup_steps)
    topk1 = make_codec("topk", density=0.01)
    return [
        Run("fp32", lambda _: fixed["fp32"]),
        Run("fp16", lambda _: fixed["fp16"], goal=0.005),
        Run("bf16", lambda _: fixed["bf16"]),
        Run("topk 1% + EF", lambda _: topk1, goal=0.01),
        Run(
            "topk 0.1% + EF + warm-up",
            lambda t: make_codec("topk", density=warm.density(t)),
            goal=0.03,
        ),
        Run("topk 1%, no EF", lambda _: topk1, feedback=False),
        Run("ecsgd 2-bit + EF", _seeded_ecsgd(2), goal=0.03),
        Run("ecsgd 1-bit + EF", _seeded_ecsgd(1), goal=0.03),
    ]


def _seeded_ecsgd(bits: int) -> CodecAt:
    codec = make_codec("ecsgd", bits=bits, seed=0)
    return lambda _: codec


class Exchange:
    """One round trip of every parameter's gradient: N uplinks, the average, the downlink."""

    def __init__(self, workers: int, feedback: bool, dense_below: int) -> None:
        self.uplinks = [ErrorFeedback() for _ in range(workers)]
        self.downlink = ErrorFeedback()
        self.feedback = feedback
        self.dense_below = dense_below
        self.dense = make_codec("fp32")

    def send(self, ef: ErrorFeedback, key: str, codec: Codec, g: torch.Tensor) -> torch.Tensor:
        if g.numel() < self.dense_below:
            codec = self.dense
        payload = ef.encode(key, codec, g)[0] if self.feedback else codec.encode(g)
        return decode_payload(payload)

    def average(
        self, codec: Codec, grads: list[dict[str, torch.Tensor]]
    ) -> dict[str, torch.Tensor]:
        mean = {}
        for key in grads[0]:
            total = sum(
                self.send(ef, key, codec, g[key]) for ef, g in zip(self.uplinks, grads, strict=True)
            )
            mean[key] = self.send(self.downlink, key, codec, total / len(grads))
        return mean


def worker_grads(task, model: nn.Module, batch: object) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    task.loss(model, batch).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def train(task, run: Run, steps: int, workers: int, seed: int, dense_below: int = 0) -> float:
    """Held-out loss after ``steps`` rounds of compressed data-parallel training."""
    model = task.build_model(seed)
    optimizer = task.make_optimizer(model.parameters())
    streams = [task.batches(shard, workers, seed) for shard in range(workers)]
    exchange = Exchange(workers, run.feedback, dense_below)
    params = dict(model.named_parameters())
    for step in range(steps):
        grads = [worker_grads(task, model, next(stream)) for stream in streams]
        for name, g in exchange.average(run.codec_at(step), grads).items():
            params[name].grad = g
        optimizer.step()
    return task.eval_loss(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="rounds per codec")
    parser.add_argument("--workers", type=int, default=3, help="simulated sites")
    parser.add_argument("--warmup", type=int, default=None, help="density warm-up rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dense-below",
        type=int,
        default=0,
        help="send tensors with fewer elements uncompressed (DGC leaves biases and norms dense)",
    )
    parser.add_argument("--only", default="", help="comma-separated labels to run (and fp32)")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    task = load_task("chargpt")
    warmup = args.warmup if args.warmup is not None else max(1, args.steps // 5)
    selected = [
        r
        for r in runs(warmup)
        if not args.only
        or r.label == "fp32"
        or any(s.strip() in r.label for s in args.only.split(","))
    ]
    print(f"chargpt, {args.workers} workers, {args.steps} steps, warm-up {warmup} steps")
    print(f"{'codec':<28}{'eval loss':>10}{'vs fp32':>10}{'goal':>8}{'':>6}{'time s':>8}")
    reference = None
    for run in selected:
        start = time.perf_counter()
        loss = train(task, run, args.steps, args.workers, args.seed, args.dense_below)
        reference = loss if reference is None else reference
        delta = loss / reference - 1
        verdict = "" if run.goal is None else ("PASS" if delta <= run.goal else "FAIL")
        goal = "" if run.goal is None else f"{run.goal:.1%}"
        print(
            f"{run.label:<28}{loss:>10.4f}{delta:>+10.2%}{goal:>8}{verdict:>6}"
            f"{time.perf_counter() - start:>8.1f}"
        )


if __name__ == "__main__":
    main()
