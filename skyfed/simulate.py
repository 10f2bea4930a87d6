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
chooses), every round closes with every site, and time is compute only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from skyfed.agent.launch import data_seed
from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalResult, LocalTrainer
from skyfed.certs.identity import Identity
from skyfed.compression.spec import wire_spec
from skyfed.coordinator.downlink import Downlink
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
    ) -> None:
        """``task``, ``seed``, ``exchange``, ``sgd_*``, ``overlap``: as the coordinator's
        configuration says them (every site runs the federation's task and seed)."""
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
        self._pending: list[bytes] | None = None
        """Overlap: the last round's broadcast, applied after the next local steps."""
        for site in self.sites:  # a joining agent whose weights differ loads the federation's
            if site.digest() != self.model.weights_digest:
                site.load(self.model.weights_payloads())

    def round(self) -> RoundResult:
        """Every site's local phase and contribution, the close, every site's apply (with
        overlap: the previous round's apply, after the local phase)."""
        round_ = self.model.open()
        number = round_.number
        result = RoundResult(number, 0, 0)
        specs = []
        for i, (site, spec) in enumerate(zip(self.sites, self.specs, strict=True)):
            trained = site.train()
            if self._pending is not None:  # overlap: the aggregate arrives after the steps
                site.apply(number - 1, self._pending)
            codec = self._uplink_spec(i, number)
            specs.append(codec)
            payloads = list(site.stream_contribution(number, codec))
            samples = trained.samples
            if self.tamper is not None:
                samples, payloads = self.tamper(i, trained, payloads)
            contribution = round_.begin(spec.key, samples)
            for payload in payloads:
                round_.receive(contribution, payload)
                result.bytes_up += len(payload.data)
            round_.commit(contribution)
            site.acked(number)
            result.losses.append(trained.loss)
            result.samples += trained.samples
        codec = Downlink.codec_for(spec.split(":", 1)[0] for spec in specs)
        fewest = min(s.local_steps for s in self.specs)
        down = [bytes(p.data) for p in round_.close(codec, fewest)]
        result.bytes_down = sum(len(d) for d in down) * len(self.sites)
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

    def digests(self) -> list[str]:
        """Each site's weights digest (every one equals ``model.weights_digest`` once the
        last broadcast is applied)."""
        return [site.digest() for site in self.sites]

    def _uplink_spec(self, i: int, round_: int) -> str:
        """Site ``i``'s codec in ``round_`` with the policy's parameters, as its link's
        (``Links.codec_params``) would tell it."""
        spec = self.specs[i]
        self._runs[i] = run = self._runs[i].at(spec.codec, round_)
        params = run.params(self.model.rules.policy, round_, spec.local_steps)
        return wire_spec(spec.codec, json.dumps(params, sort_keys=True) if params else "")
