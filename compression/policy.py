"""The link policy: which codec a link should use, from its measured RTT, loss and goodput.

Pure functions of a :class:`PolicyConfig`, a :class:`~skyfed.compression.monitor.LinkStats`
and the link's :class:`PolicyState`; the coordinator steps it once per measurement window
and applies its choice at the next round boundary.

- ``table`` mode: RTT below ``light_below_rtt_ms`` and low loss -> ``light`` (fp16);
  RTT up to ``heavy_above_rtt_ms`` or moderate loss -> ``medium`` (topk); beyond, or high
  loss -> ``heavy`` (ecsgd). A boundary at ``T`` is crossed upwards above ``T (1 + h)`` and
  downwards below ``T (1 - h)``, so a link whose RTT wanders around ``T`` stays put.
- ``cost`` mode: predict each codec's round time on the link,
  ``t = train + rtt + 2 * (bytes / goodput + encode + decode)`` (goodput rescaled to the
  current RTT, :func:`predict_exchange_s`), from the agent's measured
  local training time, measured link figures and each codec's measured
  :class:`CodecProfile`; take the least-compressing codec within ``cost_tie_pct`` of the
  fastest, among those allowed by the compression budget. Counting the training time is
  what keeps a light codec on a link whose rounds are compute-bound: saving a few
  milliseconds of a second-long round is not worth the compression error.
- Dwell, in both modes: heavier only after ``heavier_after_windows`` consecutive windows
  that all want heavier (to the lightest of what they want); lighter after
  ``lighter_after_windows`` consecutive windows that want the same lighter codec, so a
  window straddling a change does not cost a second switch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from skyfed.compression.feedback import ErrorFeedback
from skyfed.compression.monitor import LinkStats
from skyfed.compression.registry import (
    capabilities,
    codec_names,
    decode_add_payload,
    make_codec,
)
from skyfed.compression.schedule import DensityWarmup
from skyfed.config.checks import check_types, require

PolicyMode = Literal["table", "cost"]
"""``table``: the thresholds decide; ``cost``: the codec predicted fastest."""


# EC-SGD's clip (in block RMS) for momentum-corrected gradients, which are heavy-tailed
# where AdamW's updates are not. At the codec's 1.5 (2 bits) the clipped outliers wait in
# the residual while the velocity keeps pushing them, and training diverged; with the
# block's peak as scale one outlier coarsens its whole block (+7.7 % on one seed); 4 RMS
# clips only the outliers (docs/decisions/ecsgd-block-scale.md).
GRADIENT_ECSGD_CLIP = 4.0

# Top-k's density by exchange. Under ``delta`` a site sends the change over several AdamW
# steps, whose energy is spread evenly (the largest 1 % carries a quarter of it), so 1 %
# held most of each update back and ended 5.1 % above FP32; 5 % ended 3.0 % below it and
# reached the adaptive bench's target in 70-76 rounds against 91-96
# (docs/decisions/topk-density-under-delta.md). Raw gradients (``gradient``) concentrate
# their energy, and 1 % is Deep Gradient Compression's setting, within 0.2 % of FP32 there.
DELTA_TOPK_DENSITY = 0.05
GRADIENT_TOPK_DENSITY = 0.01

# EC-SGD's blocks on a link of long local phases (``long_phase_local_steps``). Blocks of
# 128 were chosen while every tensor was padded to whole blocks (1.2-1.3x fewer bytes
# than 1024 then). Since frame version 2 a ragged last block costs its own length, 1024
# costs 9 % fewer bytes than 128, and on fresh seeds fixed before the run it reached at
# least as often: digits 16/20 against 15/20, chargpt 6/10 against 3/10
# (docs/decisions/long-phases-policy.md). Said explicitly, so status shows the rule.
LONG_PHASE_ECSGD_BLOCK = 1024


@dataclass(kw_only=True, slots=True)
class PolicyConfig:
    """Thresholds, dwell and codec parameters of the link policy. TOML: ``[policy]``."""

    mode: PolicyMode = "table"
    """How a link's codec is picked: ``table`` (by this table's thresholds) or ``cost``
    (the codec predicted fastest)."""
    light: str = "fp16"
    """Codec of a near, clean link."""
    medium: str = "topk"
    """Codec of a far or somewhat lossy link."""
    heavy: str = "ecsgd"
    """Codec of a very far or lossy link."""
    light_below_rtt_ms: float = 50.0
    """RTT under which a link is near."""
    heavy_above_rtt_ms: float = 200.0
    """RTT over which a link is very far."""
    moderate_loss_pct: float = 1.0
    """One-way loss at which a link counts as somewhat lossy."""
    high_loss_pct: float = 5.0
    """One-way loss at which a link counts as lossy."""
    hysteresis_pct: float = 10.0
    """Dead band around every threshold, in percent of it."""
    heavier_after_windows: int = 3
    """Consecutive windows that must all call for heavier compression before it is used."""
    lighter_after_windows: int = 2
    """Consecutive windows of a recovered link before compression is lightened."""
    topk_density: float | None = None
    """Top-k: fraction of elements sent (unset: :data:`DELTA_TOPK_DENSITY`, 5 %; under
    ``exchange = "gradient"`` :data:`GRADIENT_TOPK_DENSITY`, 1 %)."""
    topk_values: Literal["int8", "fp16"] = "int8"
    """Top-k: ``int8`` (with a scale) or ``fp16`` values."""
    topk_bits: Literal[2, 3, 4, 8] = 8
    """Top-k: bits per kept value, 8 (INT8, one scale per tensor) or 2, 3 or 4 (sign and
    magnitude, a scale per block of 128 kept values: SparseLoCo's choice; ``int8``
    values only). Frames say their width, so both ends of a link need only agree on
    the codec (docs/codecs-performance.md)."""
    topk_warmup_rounds: int = 0
    """Top-k: rounds over which the density falls geometrically from
    ``topk_warmup_start`` to ``topk_density`` (Deep Gradient Compression's warm-up; 0:
    none), counted from round 0 and again from each round the policy switches a link to
    Top-k (the downlink: the round the heaviest link's codec becomes Top-k). After a
    stretch of FP16 the residual holds little more than FP16's rounding error, as at
    round 0; after EC-SGD it holds that codec's quantisation error. A reconnect, a late
    join or a coordinator restart does not restart it: the residuals outlive them."""
    topk_warmup_start: float = 0.25
    """Top-k: the density at round 0, and just after a switch to Top-k, when warming up."""
    ecsgd_bits: Literal[1, 2, 4] = 2
    """EC-SGD: bits per element (1, 2 or 4)."""
    ecsgd_block: int | None = None
    """EC-SGD: elements per block, each with its own float32 scale (unset: the codec's
    1024). Every tensor is coded in whole blocks, so a tensor smaller than a block (a
    bias, a norm) costs a whole one: smaller blocks waste less on a model of many small
    tensors, at 32 / block bits of scale per element (docs/outer-optimizer.md)."""
    ecsgd_clip: float | None = None
    """EC-SGD at 2 and 4 bits: each block's half-range in RMS of the block, 0 for the
    block's peak (unset: the codec's least-squares default for its width, 1.5 or 2.5;
    under gradient exchange :data:`GRADIENT_ECSGD_CLIP`). The 1-bit sign has no clip."""
    long_phase_local_steps: int = 64
    """A link whose agent runs at least this many local steps per round (its hello's
    ``local_steps``) gets the long-phase recipe: EC-SGD at ``ecsgd_bits`` (2) in blocks of
    :data:`LONG_PHASE_ECSGD_BLOCK` (1024) unless ``ecsgd_block`` is set, the bench's
    fewest bytes to the target loss (docs/outer-optimizer.md), and EC-SGD where the
    policy would give it Top-k (at 64 and 128 local steps Top-k reached the target on no
    seed of either task, EC-SGD on most). 0: never. Agents from before the field report
    none and keep the codec's blocks; under ``exchange = "gradient"`` a round is one step
    and the rule is off."""
    max_ratio: float = 0.0
    """Cost mode's compression budget: no codec compressing more than this (0: any)."""
    cost_tie_pct: float = 10.0
    """Cost mode: codecs predicted within this of the fastest count as fast; the least
    compressing of them wins."""

    def __post_init__(self) -> None:
        check_types(self, "policy")
        names = codec_names()
        for key in ("light", "medium", "heavy"):
            require(
                "policy", getattr(self, key) in names, key, getattr(self, key), f"one of {names}"
            )
        light, heavy = self.light_below_rtt_ms, self.heavy_above_rtt_ms
        require(
            "policy", 0 < light < heavy, "light_below_rtt_ms", light, "> 0 and < heavy_above_rtt_ms"
        )
        moderate, high = self.moderate_loss_pct, self.high_loss_pct
        require("policy", moderate > 0, "moderate_loss_pct", moderate, "> 0")
        require(
            "policy", moderate < high < 100, "high_loss_pct", high, "above moderate_loss_pct, < 100"
        )
        require(
            "policy",
            0 <= self.hysteresis_pct < 50,
            "hysteresis_pct",
            self.hysteresis_pct,
            "in [0, 50)",
        )
        for key in ("heavier_after_windows", "lighter_after_windows"):
            require("policy", getattr(self, key) >= 1, key, getattr(self, key), ">= 1")
        density = self.topk_density
        require("policy", density is None or 0 < density <= 1, "topk_density", density, "in (0, 1]")
        bits = self.topk_bits
        ok = bits == 8 or self.topk_values == "int8"
        require("policy", ok, "topk_bits", bits, "8 with fp16 values (low bits are integer levels)")
        warmup, start = self.topk_warmup_rounds, self.topk_warmup_start
        require("policy", warmup >= 0, "topk_warmup_rounds", warmup, ">= 0")
        require("policy", 0 < start <= 1, "topk_warmup_start", start, "in (0, 1]")
        block = self.ecsgd_block
        ok = block is None or (8 <= block <= 1 << 20 and block % 8 == 0)
        require("policy", ok, "ecsgd_block", block, "a multiple of 8 in [8, 1048576]")
        clip = self.ecsgd_clip
        ok = clip is None or clip == 0 or 1 <= clip <= 1e3
        require("policy", ok, "ecsgd_clip", clip, "0 (the peak) or in [1, 1000]")
        long = self.long_phase_local_steps
        require("policy", long >= 0, "long_phase_local_steps", long, ">= 0")
        require("policy", self.max_ratio >= 0, "max_ratio", self.max_ratio, ">= 0")
        require("policy", self.cost_tie_pct >= 0, "cost_tie_pct", self.cost_tie_pct, ">= 0")

    def for_gradient_exchange(self) -> PolicyConfig:
        """This policy with the defaults of the coordinator's ``exchange = "gradient"``
        (a copy): EC-SGD clips at :data:`GRADIENT_ECSGD_CLIP` RMS unless ``ecsgd_clip`` is
        set, Top-k keeps :data:`GRADIENT_TOPK_DENSITY` unless ``topk_density`` is, and the
        long-phase rule is off (a round is one step). (1 bit is refused there: the scaled
        sign holds back every element above the block's mean magnitude, and training
        diverged.)"""
        clip = GRADIENT_ECSGD_CLIP if self.ecsgd_clip is None else self.ecsgd_clip
        density = GRADIENT_TOPK_DENSITY if self.topk_density is None else self.topk_density
        return replace(self, ecsgd_clip=clip, topk_density=density, long_phase_local_steps=0)

    @property
    def ladder(self) -> tuple[str, str, str]:
        """The table's codecs, lightest compression first."""
        return (self.light, self.medium, self.heavy)

    def long_phase(self, local_steps: int) -> bool:
        """Whether an agent of ``local_steps`` per round (0: not said) gets the
        long-phase recipe on EC-SGD."""
        return 0 < self.long_phase_local_steps <= local_steps

    def phase_codec(self, codec: str, local_steps: int) -> str:
        """The codec a link the policy puts on ``codec`` runs for an agent of
        ``local_steps`` per round: EC-SGD instead of Top-k for long phases (Top-k holds a
        long phase's evenly spread update back in its residual for rounds a short run
        does not have: at 64-128 local steps it missed the target on every seed)."""
        return "ecsgd" if codec == "topk" and self.long_phase(local_steps) else codec

    def codec_params(
        self, name: str, round_: int | None = None, local_steps: int = 0
    ) -> dict[str, Any]:
        """Constructor parameters of ``name`` under this policy in the ``round_``-th round
        a link has used it (0 first; None: after any warm-up), for an agent of
        ``local_steps`` local steps per round (0: not said)."""
        if name == "topk":
            density = DELTA_TOPK_DENSITY if self.topk_density is None else self.topk_density
            if round_ is not None and self.topk_warmup_rounds:
                warmup = DensityWarmup(
                    final=density,
                    start=max(density, self.topk_warmup_start),
                    steps=self.topk_warmup_rounds,
                )
                density = warmup.density(round_)
            bits = {} if self.topk_bits == 8 else {"bits": self.topk_bits}
            return {"density": density, "values": self.topk_values, **bits}
        if name == "ecsgd":
            clip = {} if self.ecsgd_clip is None else {"clip": self.ecsgd_clip}
            block_size = self.ecsgd_block
            if block_size is None and self.long_phase(local_steps):
                block_size = LONG_PHASE_ECSGD_BLOCK
            block = {} if block_size is None else {"block": block_size}
            return {"bits": self.ecsgd_bits, **block, **clip}
        return {}


@dataclass(frozen=True, slots=True)
class PolicyState:
    """Where one link stands: its codec and the run of windows that want another."""

    codec: str
    want: str = ""
    """The codec the current run of windows calls for ("" when they agree with ``codec``)."""
    run: int = 0
    """How many consecutive windows called for a move in the same direction."""


@dataclass(frozen=True, slots=True)
class CodecProfile:
    """What one codec costs on this machine for a model's gradient, measured."""

    name: str
    ratio: float
    """Raw float32 bytes over payload bytes."""
    encode_s: float
    decode_s: float
    payload_bytes: int


def table_level(stats: LinkStats, config: PolicyConfig, current: int) -> int:
    """0, 1 or 2 (light, medium, heavy) by the table, with hysteresis around ``current``."""
    h = config.hysteresis_pct / 100.0

    def crossed(value: float, threshold: float, boundary: int) -> bool:
        if not math.isfinite(value):
            return current > boundary  # unknown: stay on whichever side we are
        if current > boundary:
            return value >= threshold * (1 - h)
        return value > threshold * (1 + h)

    rtt = stats.rtt_ms
    by_rtt = int(crossed(rtt, config.light_below_rtt_ms, 0)) + int(
        crossed(rtt, config.heavy_above_rtt_ms, 1)
    )
    loss = stats.loss_pct
    by_loss = int(crossed(loss, config.moderate_loss_pct, 0)) + int(
        crossed(loss, config.high_loss_pct, 1)
    )
    return max(by_rtt, by_loss)


def predict_exchange_s(profile: CodecProfile, stats: LinkStats) -> float:
    """One round's exchange on this link: a round trip, the payload both ways, the codec
    both ways (the agent encodes and the coordinator decodes, then the other way round).

    Goodput is rescaled from the RTT it was measured at to the current one (window-limited
    TCP moves a window per round trip): when a link's RTT jumps, the codec in use (Top-k:
    a few kB, too little to time) may not measure its new goodput for a long while.
    """
    rate_bit_s = stats.goodput_mbit * 1e6
    if stats.goodput_rtt_ms > 0 and stats.rtt_ms > 0:  # both measured (nan compares False)
        rate_bit_s *= stats.goodput_rtt_ms / stats.rtt_ms
    transfer_s = 2 * profile.payload_bytes * 8 / rate_bit_s
    return stats.rtt_ms / 1000 + transfer_s + 2 * (profile.encode_s + profile.decode_s)


def cost_choice(
    stats: LinkStats,
    config: PolicyConfig,
    profiles: dict[str, CodecProfile],
    train_s: float = 0.0,
) -> str | None:
    """The least-compressing codec whose round (``train_s`` of local training plus the
    predicted exchange) is within ``cost_tie_pct`` of the fastest; None while RTT or
    goodput is unmeasured."""
    if not (math.isfinite(stats.rtt_ms) and stats.goodput_mbit > 0):
        return None
    allowed = [
        p for p in profiles.values() if not config.max_ratio or p.ratio <= config.max_ratio * 1.001
    ]
    if not allowed:
        return None
    times = {p.name: train_s + predict_exchange_s(p, stats) for p in allowed}
    fastest = min(times.values())
    fast = [p for p in allowed if times[p.name] <= fastest * (1 + config.cost_tie_pct / 100)]
    return min(fast, key=lambda p: p.ratio).name


def step(
    state: PolicyState,
    stats: LinkStats,
    config: PolicyConfig,
    profiles: dict[str, CodecProfile] | None = None,
    train_s: float = 0.0,
) -> PolicyState:
    """Advance one window: the link's next state (``.codec`` changes only after dwell).

    ``train_s`` is the agent's local training time per round (cost mode only)."""
    order = _order(config, profiles)
    target = _target(state, stats, config, profiles, order, train_s)
    current = order.index(state.codec) if state.codec in order else 0
    goal = order.index(target)
    if goal == current:
        return PolicyState(state.codec)
    heavier = goal > current
    run = 1
    if state.run and heavier and order.index(state.want) > current:
        goal = min(goal, order.index(state.want))  # as far as all windows of the run agree
        run = state.run + 1
    elif state.run and not heavier and order[goal] == state.want:
        run = state.run + 1  # lighter: the same codec, window after window
    need = config.heavier_after_windows if heavier else config.lighter_after_windows
    if run >= need:
        return PolicyState(order[goal])
    return replace(state, want=order[goal], run=run)


def _target(
    state: PolicyState,
    stats: LinkStats,
    config: PolicyConfig,
    profiles: dict[str, CodecProfile] | None,
    order: list[str],
    train_s: float,
) -> str:
    if config.mode == "cost" and profiles:
        choice = cost_choice(stats, config, profiles, train_s)
        if choice is not None:
            return choice
    ladder = config.ladder
    current = ladder.index(state.codec) if state.codec in ladder else _nearest(state, order, ladder)
    return ladder[table_level(stats, config, current)]


def _nearest(state: PolicyState, order: list[str], ladder: tuple[str, ...]) -> int:
    """The table level of a codec outside the table (a cost-mode choice)."""
    weight = order.index(state.codec) if state.codec in order else 0
    return max((i for i, n in enumerate(ladder) if order.index(n) <= weight), default=0)


def heaviness(name: str) -> int:
    """``name``'s place among the codecs, lightest compression first (its
    ``Capabilities.heaviness``, the one ranking of codecs: the policy's ladder follows it
    where no measured ratio orders two codecs, and the downlink takes the heaviest); 0 for
    a codec this build does not know."""
    try:
        return capabilities(name).heaviness
    except ValueError:
        return 0


def heaviest(names: Iterable[str]) -> str:
    """The most compressing of ``names`` (the first of equals)."""
    return max(names, key=heaviness)


def _order(config: PolicyConfig, profiles: dict[str, CodecProfile] | None) -> list[str]:
    """Every codec the policy may pick, lightest compression first."""
    names = set(config.ladder) | set(profiles or {})
    ratio = {p.name: p.ratio for p in (profiles or {}).values()}
    return sorted(names, key=lambda n: (ratio.get(n, 0.0), heaviness(n), n))


def profile_codecs(
    names: list[str], config: PolicyConfig, sizes: list[int], *, repeats: int = 3
) -> dict[str, CodecProfile]:
    """Measure each codec as a link runs it (best of ``repeats``): gradient-like tensors
    of the model's ``sizes`` (elements per tensor) through error feedback, planned
    together, then every payload decoded into an accumulator.

    One flat tensor of the model's size timed Top-k at 1.3 + 0.5 ms (encode + decode)
    where the lab's near rounds measured it ~45 ms slower than FP16's (docs/decisions/cost-profile-flat-tensor.md):
    the per-tensor work (the plan, one payload per tensor, the residual) is most of a
    small model's codec time, and a flat tensor has none of it.
    """
    generator = torch.Generator().manual_seed(0)
    tensors = {str(i): torch.randn(n, generator=generator) * 1e-3 for i, n in enumerate(sizes)}
    raw_bytes = 4 * sum(sizes)
    accumulators = {key: torch.zeros_like(t) for key, t in tensors.items()}
    out = {}
    for name in names:
        codec = make_codec(name, **config.codec_params(name))
        enc = dec = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            sent = dict(ErrorFeedback().encode(codec, tensors.items()))
            t1 = time.perf_counter()
            for key, payload in sent.items():
                decode_add_payload(payload, accumulators[key])  # as the coordinator does
            t2 = time.perf_counter()
            enc, dec = min(enc, t1 - t0), min(dec, t2 - t1)
        payload_bytes = sum(len(payload) for payload in sent.values())  # same every repeat
        out[name] = CodecProfile(name, raw_bytes / payload_bytes, enc, dec, payload_bytes)
    return out
