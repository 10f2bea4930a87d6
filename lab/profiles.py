"""Link profiles and schedules: what a shaped link should look like, loaded from TOML."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

DOWN = "down"
"""The profile name of a partitioned link: every packet is dropped."""
CONGESTION_CONTROLS = ("cubic", "bbr")
"""TCP congestion controls a profile may ask for; ``NAME+bbr`` is any profile with BBR."""


@dataclass(kw_only=True, slots=True, frozen=True)
class LinkProfile:
    """One direction-symmetric link: each direction gets all of these figures."""

    name: str
    """Name the profile is known by (``cross-region``)."""
    rtt_ms: float
    """Round-trip propagation delay; each direction waits half of it."""
    jitter_ms: float = 0.0
    """Standard deviation of the one-way delay; packets are never reordered."""
    loss_pct: float = 0.0
    """Probability, in percent, that a packet is dropped in each direction."""
    rate_mbit: float = 0.0
    """Bottleneck rate of each direction in Mbit/s; 0 means unlimited."""
    queue_ms: float = 50.0
    """Bottleneck queue, in milliseconds at ``rate_mbit``; packets beyond it are tail-dropped."""
    down: bool = False
    """A partitioned link drops every packet."""
    congestion: str = "cubic"
    """TCP congestion control of every connection over the link, both ends (the lab sets
    it per route, ``ip route ... congctl``; docs/wan.md)."""

    def __post_init__(self) -> None:
        _check(self.name != "", "name", self.name)
        _check(self.congestion in CONGESTION_CONTROLS, "congestion", self.congestion)
        for fname in ("rtt_ms", "jitter_ms", "rate_mbit"):
            value = getattr(self, fname)
            _check(math.isfinite(value) and value >= 0, fname, value)
        _check(0.0 <= self.loss_pct < 100.0, "loss_pct", self.loss_pct)
        _check(math.isfinite(self.queue_ms) and self.queue_ms > 0, "queue_ms", self.queue_ms)

    @property
    def delay_ms(self) -> float:
        """One-way delay."""
        return self.rtt_ms / 2.0

    @property
    def loss(self) -> float:
        """One-way loss as a probability."""
        return 1.0 if self.down else self.loss_pct / 100.0

    def as_down(self) -> LinkProfile:
        """The same link, partitioned."""
        return replace(self, down=True)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (for the forwarder's control channel and reports)."""
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(kw_only=True, slots=True, frozen=True)
class ScheduleStep:
    """Hold one profile (or a partition) for a while."""

    profile: str
    """Profile name, or ``down`` for a partition."""
    hold_s: float
    """How long this step lasts before the next one starts."""

    def __post_init__(self) -> None:
        _check(self.profile != "", "profile", self.profile)
        _check(math.isfinite(self.hold_s) and self.hold_s > 0, "hold_s", self.hold_s)


@dataclass(kw_only=True, slots=True, frozen=True)
class Schedule:
    """A sequence of steps applied to one link; the last step holds until the run ends."""

    name: str
    """Name the schedule is known by."""
    steps: tuple[ScheduleStep, ...]
    """Steps in order."""

    def __post_init__(self) -> None:
        _check(len(self.steps) > 0, "steps", self.steps)

    @classmethod
    def partition(cls, base: str, down_s: float, *, before_s: float = 0.01) -> Schedule:
        """A link that goes down for ``down_s`` seconds after ``before_s``, then comes back."""
        steps = (
            ScheduleStep(profile=base, hold_s=before_s),
            ScheduleStep(profile=DOWN, hold_s=down_s),
            ScheduleStep(profile=base, hold_s=1.0),
        )
        return cls(name=f"partition-{base}-{down_s:g}s", steps=steps)


@dataclass(kw_only=True, slots=True)
class Catalog:
    """All profiles and schedules known to a lab."""

    profiles: dict[str, LinkProfile] = field(default_factory=dict)
    """Profiles by name."""
    schedules: dict[str, Schedule] = field(default_factory=dict)
    """Schedules by name."""

    def __post_init__(self) -> None:
        _check(DOWN not in self.profiles, "profiles", DOWN)
        for schedule in self.schedules.values():
            for step in schedule.steps:
                _check(step.profile == DOWN or step.profile in self.profiles, "steps", step)

    def profile(self, name: str) -> LinkProfile:
        """The named profile; ``NAME+CC`` is profile NAME with congestion control CC
        (``cross-region+bbr``). ``KeyError`` lists the known names."""
        base, _, cc = name.partition("+")
        try:
            if cc:
                if cc not in CONGESTION_CONTROLS:
                    raise KeyError(name)
                return replace(self.profiles[base], name=name, congestion=cc)
            return self.profiles[name]
        except KeyError:
            raise KeyError(
                f"unknown link profile {name!r}; known: {sorted(self.profiles)}, each also "
                f"as NAME+CC with CC one of {', '.join(CONGESTION_CONTROLS)}"
            ) from None

    def resolve(self, step: ScheduleStep, base: LinkProfile) -> LinkProfile:
        """The profile a schedule step stands for (``down`` partitions ``base``)."""
        if step.profile == DOWN:
            return base.as_down()
        if step.profile == base.name:
            return base
        return self.profile(step.profile)


def default_profiles_path() -> Path:
    """The profiles file shipped with the package."""
    return Path(str(resources.files("skyfed.lab").joinpath("profiles.toml")))


def load_catalog(path: Path | None = None) -> Catalog:
    """Read profiles and schedules from ``path`` (default: the shipped ``profiles.toml``)."""
    data = tomllib.loads((path or default_profiles_path()).read_text())
    profiles = {
        name: LinkProfile(name=name, **values) for name, values in data.get("profiles", {}).items()
    }
    schedules = {
        name: Schedule(name=name, steps=tuple(ScheduleStep(**step) for step in body["steps"]))
        for name, body in data.get("schedules", {}).items()
    }
    return Catalog(profiles=profiles, schedules=schedules)


def _check(ok: bool, fname: str, value: object) -> None:
    if not ok:
        raise ValueError(f"invalid {fname}: {value!r}")
