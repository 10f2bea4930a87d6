"""A federation of N sites in one process: the product's own round, with no sockets.

Each simulated site is the agent's own :class:`~skyfed.agent.site.Site` (its local
trainer and its uplink with error feedback); the coordinator is its own
:class:`~skyfed.coordinator.model.Model` and :class:`~skyfed.coordinator.round.Round`
(weighting, clipping, the mean, the outer step, the downlink with its error feedback).
Payloads are handed over in memory in the order the network would deliver them, so a
simulated run gives the bits a federation of ``agent start`` processes gives for the
same configuration (``tests/test_simulation.py`` holds them side by side), as Flower's
simulation runs its real strategy. Benchmarks and research sweeps run this; none
carries a copy of the round.

What it leaves out is the network: every link runs the codec it is given (no monitor
chooses; a schedule may change it at round boundaries, as a policy's switches would),
every round closes with every site, and time is compute only. What it adds is what a
bench reads: the payload bytes each round put on the (absent) wire, both ways, and the
coordinator's own held-out evaluation of the canonical weights (:meth:`evaluate`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from skyfed.agent.launch import data_seed
from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalResult, LocalTrainer
from skyfed.certs.identity import Identity
from skyfed.compression import frame
from skyfed.compression.norms import all_finite
from skyfed.compression.spec import wire_spec
from skyfed.coordinator.downlink import Downlink
from skyfed.coordinator.evaluate import Evaluator
from skyfed.coordinator.links import CodecRun
from skyfed.coordinator.model import Model, RoundRules
from skyfed.fingerprint import model_spec
from skyfed.tasks import load_task
from skyfed.wire import Payload

log = logging.getLogger(__name__)

TRUST_DOMAIN = "skyfed.local"
"""The simulated sites' identities' trust domain (it orders nothing: every key shares it)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SimulatedSite:
    """One site: what its ``agent start`` would be told, and the codec its link runs."""

    cloud: str
    name: str = ""
    """Default ``<cloud>-1``, as the agent's."""
    local_steps: int = 4
    shard: int = 0
    num_shards: int = 1
    codec: str = "fp32"
    """The codec its link runs every round (the policy's parameters for it)."""

    @property
    def agent_name(self) -> str:
        return self.name or f"{self.cloud}-1"

    @property
    def key(self) -> str:
        """Its identity URI: the coordinator sums contributions in this order."""
        return Identity.agent(TRUST_DOMAIN, self.cloud, self.agent_name).uri


CLOUDS = ("aws", "gcp", "azure")
"""The clouds of the first sites :func:`sharded` makes (the demo's and the lab's)."""


def sharded(n: int, *, local_steps: int = 4, codec: str = "fp32") -> list[SimulatedSite]:
    """``n`` sites as the lab's federation starts its agents: site ``i`` on shard ``i``
    of ``n`` (clouds aws, gcp, azure, then site4, site5, ...)."""
    clouds = [CLOUDS[i] if i < len(CLOUDS) else f"site{i + 1}" for i in range(n)]
    return [
        SimulatedSite(cloud=c, local_steps=local_steps, shard=i, num_shards=n, codec=codec)
        for i, c in enumerate(clouds)
    ]


@dataclass(slots=True)
class RoundResult:
    """One simulated round: what crossed the (absent) wire and the sites' losses."""

    round: int
    bytes_up: int
    """Payload bytes of every site's contribution."""
    bytes_down: int
    """Payload bytes of the broadcast, times the sites it goes to."""
    losses: list[float] = field(default_factory=list)
    samples: int = 0
    framing: int = 0
    """Of ``bytes_up + bytes_down``, the frames' headers and codec parameters (fixed per
    tensor: what dominates a tiny model's sparse payloads)."""
    codecs: list[str] = field(default_factory=list)
    """Each site's uplink codec with its parameters, as its link told it (wire spec)."""
    downlink: str = ""
    """The broadcast's codec (the heaviest of the uplinks')."""
    uplinks: list[list[bytes]] = field(default_factory=list)
    """Each site's payloads, in tensor order (``round(keep=True)`` only)."""
    broadcast: list[bytes] = field(default_factory=list)
    """The broadcast's payloads, in tensor order (``round(keep=True)`` only)."""


Schedule = Callable[[int, int], str]
"""``schedule(site, round) -> codec``: the codec site ``site``'s link runs in round
``round`` (a policy's switches, replayed; the parameters are the policy's for the run of
that codec, ``CodecRun``, so Top-k's warm-up counts from each switch to it)."""


class Diverged(Exception):
    """A site's local phase ended in a non-finite loss or update (a federation would
    refuse it: its codecs and the coordinator's checks take finite values only)."""


Tamper = Callable[[int, LocalResult, list[Payload]], tuple[int, list[Payload]]]
"""``tamper(site, result, payloads) -> (samples, payloads)``: what site ``site`` claims
and sends instead of what it trained (an attacker in ``bench/robust.py``)."""


class Simulation:
    """N sites and the coordinator's round in one process; :meth:`round` runs one."""

    def __init__(
        self,
        task: str,
        sites: Sequence[SimulatedSite],
        rules: RoundRules,
        *,
        seed: int = 0,
        exchange: Literal["delta", "gradient"] = "delta",
        sgd_lr: float = 0.1,
        sgd_momentum: float = 0.9,
        overlap: bool = False,
        tamper: Tamper | None = None,
        schedule: Schedule | None = None,
    ) -> None:
        """``task``, ``seed``, ``exchange``, ``sgd_*``, ``overlap``: as the coordinator's
        configuration says them (every site runs the federation's task and seed).
        ``schedule``: each site's codec by round instead of its ``codec``."""
        self.task = load_task(task)
        model = self.task.build_model(seed)
        named = list(model.named_parameters())
        weights = [p.detach().float().contiguous() for _, p in named]
        self.model = Model(model_spec(named), weights, rules)
        del model, named
        self.specs = list(sites)
        self.sites: list[Site] = []
        for s in self.specs:
            trainer = LocalTrainer(
                load_task(task),
                seed=seed,
                shard=s.shard,
                num_shards=s.num_shards,
                local_steps=s.local_steps,
                data_seed=data_seed(seed, s.agent_name, s.num_shards),
            )
            site = Site(trainer, sender=s.agent_name)
            site.set_exchange(exchange, sgd_lr, sgd_momentum)
            self.sites.append(site)
        self._runs = [CodecRun() for _ in self.specs]
        self.overlap = overlap
        self.tamper = tamper
        self.schedule = schedule
        self.bytes_up = self.bytes_down = self.framing = 0
        """Payload bytes of every round so far, both ways (as :class:`RoundResult`)."""
        self.steps = 0
        """Local steps each site has trained (the fewest of any site)."""
        self.evaluator = Evaluator(self.task, every=1)
        self._pending: list[bytes] | None = None
        """Overlap: the last round's broadcast, applied after the next local steps."""
        for site in self.sites:  # a joining agent whose weights differ loads the federation's
            if site.digest() != self.model.weights_digest:
                site.load(self.model.weights_payloads())

    def round(self, *, keep: bool = False) -> RoundResult:
        """Every site's local phase and contribution, the close, every site's apply (with
        overlap: the previous round's apply, after the local phase). ``keep``: the
        result holds the round's payloads. :class:`Diverged` if a site's phase did."""
        round_ = self.model.open()
        number = round_.number
        result = RoundResult(number, 0, 0)
        for i, (site, spec) in enumerate(zip(self.sites, self.specs, strict=True)):
            trained = site.train()
            _check_finite(i, number, trained)
            if self._pending is not None:  # overlap: the aggregate arrives after the steps
                site.apply(number - 1, self._pending)
            codec = self._uplink_spec(i, number)
            result.codecs.append(codec)
            payloads = list(site.stream_contribution(number, codec))
            samples = trained.samples
            if self.tamper is not None:
                samples, payloads = self.tamper(i, trained, payloads)
            contribution = round_.begin(spec.key, samples)
            for payload in payloads:
                round_.receive(contribution, payload)
                result.bytes_up += len(payload.data)
                result.framing += frame.header_length(payload.data)
            if keep:
                result.uplinks.append([bytes(p.data) for p in payloads])
            round_.commit(contribution)
            site.acked(number)
            result.losses.append(trained.loss)
            result.samples += trained.samples
        result.downlink = Downlink.codec_for(c.split(":", 1)[0] for c in result.codecs)
        fewest = min(s.local_steps for s in self.specs)
        down = [bytes(p.data) for p in round_.close(result.downlink, fewest)]
        result.bytes_down = sum(len(d) for d in down) * len(self.sites)
        result.framing += sum(frame.header_length(d) for d in down) * len(self.sites)
        if keep:
            result.broadcast = down
        self.bytes_up += result.bytes_up
        self.bytes_down += result.bytes_down
        self.framing += result.framing
        self.steps += fewest
        if self.overlap:
            self._pending = down
        else:
            for site in self.sites:
                site.apply(number, down)
        return result

    def finish(self) -> None:
        """With overlap, the last broadcast applied (the sites' weights are then the
        coordinator's)."""
        if self._pending is not None:
            for site in self.sites:
                site.apply(self.model.round - 1, self._pending)
            self._pending = None

    def evaluate(self) -> float:
        """The coordinator's held-out evaluation (``coordinator/evaluate.py``, the task's
        ``eval_loss``) of the canonical weights after the last closed round."""
        return self.evaluator.evaluate(self.model.round - 1, self.model.weights).loss

    def digests(self) -> list[str]:
        """Each site's weights digest (every one equals ``model.weights_digest`` once the
        last broadcast is applied)."""
        return [site.digest() for site in self.sites]

    def _uplink_spec(self, i: int, round_: int) -> str:
        """Site ``i``'s codec in ``round_`` with the policy's parameters, as its link's
        (``Links.codec_params``) would tell it."""
        spec = self.specs[i]
        name = spec.codec if self.schedule is None else self.schedule(i, round_)
        self._runs[i] = run = self._runs[i].at(name, round_)
        params = run.params(self.model.rules.policy, round_, spec.local_steps)
        return wire_spec(name, json.dumps(params, sort_keys=True) if params else "")


def _check_finite(site: int, round_: int, trained: LocalResult) -> None:
    """:class:`Diverged` for a site whose local phase left a non-finite loss or update."""
    finite = math.isfinite(trained.loss) and all(d is None or all_finite(d) for d in trained.delta)
    if not finite:
        raise Diverged(f"site {site} diverged in round {round_} (loss {trained.loss})")
