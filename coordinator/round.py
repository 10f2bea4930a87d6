"""One round: its contributions in, the update every member applies out.

The weighting, the norm clipping, the mean, the outer step and the downlink's encode of a
round are this one piece of code. The coordinator runs it over the network (its intake
checks and stages what arrives, ``coordinator/inbound.py``; its driver streams what the
close yields, ``coordinator/rounds.py``), and the in-process simulation
(``skyfed/simulate.py``) runs it with payloads handed over in memory, so a simulated
round and a federation's round give the same bits.

    w_i = min(samples_i, max_samples)                    (weight)
    f_i = min(1, bound / |u_i|)                          (clipping, coordinator/robust.py)
    g   = sum_i w_i f_i D(u_i) / sum_i w_i               (mean, in agent order)
    s   = outer(g)                                        (the outer step)
    w  -= D(C(s + e)),  e = s + e - D(C(s + e))          (downlink, error feedback)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from skyfed import failpoints
from skyfed.coordinator.aggregate import Checked, Contribution, RoundAggregate
from skyfed.errors import AlreadyContributedError
from skyfed.fingerprint import DigestStream
from skyfed.wire import Payload

if TYPE_CHECKING:
    from skyfed.coordinator.model import Model

log = logging.getLogger(__name__)


class Round:
    """Round ``model.round``: contributions begin, arrive payload by payload, commit; the
    close turns the committed ones into the update, applied to ``model.weights``."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.number = model.round
        rules = model.rules
        self.aggregate = RoundAggregate(
            model.spec, memory_bytes=model.stage_memory_bytes, spill_dir=rules.spill_dir
        )
        self._norms: dict[str, float] = {}
        """Each committed contribution's update norm, by agent (before clipping)."""
        self._numbers: dict[Contribution, int] = {}
        """Each contribution begun, numbered in the order it began: how a standby replica
        is told which one a forwarded payload belongs to (docs/failover.md)."""
        self._arrivals: list[tuple[Contribution, int, int]] = []
        """Every staged payload as (contribution, tensor, its place in the staged list), in
        the order it was staged: a norm is a float sum in that order, so a standby that
        joins mid-round is sent them in it. Places, not payloads: a withdrawn
        contribution's memory goes with it."""
        self.closed = False
        self.mean_s = 0.0
        """Seconds its close spent on the mean and the outer step (its phase marks)."""

    @property
    def committed(self) -> int:
        return self.aggregate.committed

    def has(self, key: str) -> bool:
        """Whether ``key``'s contribution to this round is already committed."""
        return key in self._norms

    def begin(self, key: str, samples: int) -> Contribution:
        """Open ``key``'s contribution of ``samples`` samples; its weight in the mean is
        capped at ``max_samples``. ``AlreadyContributedError`` if ``key`` has one."""
        if self.has(key):
            raise AlreadyContributedError(
                f"an earlier session of {key} already contributed to round {self.number}; "
                "drop this work, it would count the same data twice"
            )
        cap = self.model.rules.max_samples
        if samples > cap:
            log.warning(
                "[Coordinator.Weight] agent=%s samples=%d capped to max_samples=%d",
                key,
                samples,
                cap,
            )
        contribution = self.aggregate.begin(min(samples, cap), key)
        self._numbers[contribution] = len(self._numbers)
        return contribution

    def receive(self, contribution: Contribution, payload: Payload) -> Checked:
        """Check one whole payload and stage it (the coordinator checks outside its lock
        and stages under it, calling :meth:`stage` itself)."""
        checked = contribution.check(payload)
        self.stage(contribution, checked)
        return checked

    def stage(self, contribution: Contribution, checked: Checked) -> Payload | None:
        """Hold a checked payload until the close; the payload as held (in memory or
        spilled), or None where its contribution was withdrawn meanwhile."""
        if contribution.done:
            contribution.stage(checked)  # lets what its check held go
            return None
        contribution.stage(checked)
        tensor = checked.payload.tensor
        held = contribution.staged[tensor]
        self._arrivals.append((contribution, tensor, len(held) - 1))
        return held[-1]

    def contribution_number(self, contribution: Contribution) -> int:
        """``contribution``'s number in this round (the order contributions began)."""
        return self._numbers[contribution]

    def staged(self) -> Iterator[tuple[Contribution, Payload]]:
        """Every payload held now, in the order it was staged (withdrawn contributions'
        left out): what a standby that joins mid-round is sent."""
        for contribution, tensor, place in self._arrivals:
            held = contribution.staged.get(tensor)
            if held:
                yield contribution, held[place]

    def committed_numbers(self) -> list[int]:
        """The committed contributions' numbers, in the order they committed."""
        return [self._numbers[c] for c in self.aggregate.contributions]

    def commit(self, contribution: Contribution) -> None:
        """Count ``contribution`` (every payload of it staged)."""
        contribution.commit()
        self._norms[contribution.key] = math.sqrt(contribution.squares)

    def close(self, codec: str, local_steps: int = 0) -> Iterator[Payload]:
        """The round's update, encoded once with ``codec`` for every member: each
        tensor's payload as soon as it is made, its weights already updated (the caller
        may hand out tensor ``i``'s final state when its payload is yielded). Exhaust it:
        the weights' digest and the round counter move on at its end. ``local_steps``:
        the fewest any member runs per round (the policy's long-phase rule; 0: unknown)."""
        if self.closed:
            raise RuntimeError(f"round {self.number} is already closed")
        self.closed = True
        self._arrivals = []  # the payloads go as the close takes each tensor
        model = self.model
        factors = model.norms.clip(self._norms)
        for contribution in self.aggregate.contributions:
            contribution.scale(factors[contribution.key])
        payloads = model.downlink.encode(
            model.weights, self._update, codec, self.committed, self.number, local_steps
        )
        digest = DigestStream("weights")
        for i, payload in enumerate(payloads):
            assert payload.tensor == i, "the downlink yields the model's tensors in order"
            digest.add(model.weights[payload.tensor])  # final: hashed while the next encodes
            yield payload
        model.weights_digest = digest.hexdigest()
        model.round = self.number + 1

    def _update(self, tensor: int, out: torch.Tensor) -> torch.Tensor:
        """Tensor ``tensor``'s update into ``out``: the outer step on the weighted mean;
        its staged payloads are dropped as soon as it is taken."""
        started = time.perf_counter()
        self.aggregate.mean_into(tensor, out)
        self.aggregate.release(tensor)
        failpoints.reached("mean", self.number)
        update = self.model.outer.step_into(tensor, out, len(self.model.spec))
        self.mean_s += time.perf_counter() - started
        return update
