"""The round lifecycle: open, close, broadcast; the driver loop; each round's figures.

Round r opens; every live member may contribute once; the round closes when all live
members have committed, or when a quorum has and the deadline has passed. Closing takes
the weighted mean, applies the outer step, encodes the update once for every link
(``coordinator/downlink.py``), checkpoints, and only then broadcasts: so every agent
applies the same bytes, and no acknowledged round is ever lost.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from skyfed.coordinator.aggregate import RoundAggregate
from skyfed.coordinator.status import RoundStats
from skyfed.fingerprint import weights_digest
from skyfed.proto.chunks import cut_all
from skyfed.wire import ChunkKind, Payload, RoundEnd, raw_bytes

if TYPE_CHECKING:
    from skyfed.coordinator.federation import Federation

log = logging.getLogger(__name__)


class Rounds:
    """Drives ``fed``'s rounds; every method but :meth:`run` and :meth:`stop` is called
    with the lock held."""

    def __init__(self, fed: Federation) -> None:
        self.fed = fed
        self._first = True
        self._losses: list[float] = []
        self._train_s: list[float] = []

    def run(self) -> None:
        """Drive rounds until the configured count or :meth:`stop`; meant for its own thread."""
        fed = self.fed
        with fed.cond:
            while not fed.stopping and not fed.finished:
                fed.admission.expire_silent()
                if not fed.round_open:
                    self.maybe_open()
                elif self._should_close():
                    self.close()
                fed.cond.wait(timeout=0.05)
            # Agents close their streams once they have applied the final round. Until
            # then its broadcast may still be crossing a slow link: closing at once (the
            # server stopping right behind) cut a lossy link's final round off mid-transfer
            # and left that agent reconnecting to nothing.
            # Members that contributed but were down at the end may reconnect and fetch the
            # final weights (admission sends them, marked final) within the same wait.
            deadline = time.monotonic() + fed.config.final_wait_s
            while not fed.stopping and self._owed() and time.monotonic() < deadline:
                fed.cond.wait(timeout=0.05)
            for s in fed.sessions.values():
                s.close()  # after the queued final messages

    def _owed(self) -> bool:
        """Someone may still need the final weights: a stream still open, or a member
        that contributed and has not had them."""
        fed = self.fed
        return bool(fed.sessions) or bool(fed.contributors - fed.final_delivered)

    def stop(self) -> None:
        with self.fed.cond:
            self.fed.stopping = True
            self.fed.cond.notify_all()

    def contributed(self, loss: float, train_s: float) -> None:
        """A contribution was committed: its loss and compute time count in the round's."""
        self._losses.append(loss)
        self._train_s.append(train_s)

    def maybe_open(self) -> None:
        """Round 0, and the first round after a restart, wait for ``min_agents``."""
        fed = self.fed
        needed = fed.config.min_agents if self._first else 1
        if len(fed.sessions) < needed:
            return
        self._first = False
        fed.round_open = True
        fed.stats = RoundStats(fed.round, time.monotonic())
        log.info("[Coordinator.Round] round=%d opened agents=%d", fed.round, len(fed.sessions))

    def _should_close(self) -> bool:
        fed = self.fed
        committed = fed.aggregate.committed
        if committed < max(1, fed.config.quorum):  # a minimum, even when all have sent
            return False
        if all(key in fed.contributed for key in fed.sessions):
            return True
        late = time.monotonic() - fed.stats.opened_at >= fed.config.round_deadline_s
        return late and committed >= fed.config.quorum

    def close(self) -> None:
        """Close the open round: the mean, the outer step, the downlink, the checkpoint,
        the broadcast, the next round."""
        fed = self.fed
        fed.intake.withdraw_all()
        update = fed.outer.step(fed.aggregate.mean())
        codec_name = fed.downlink.codec_for(
            [s.codec for s in fed.sessions.values()] or [fed.links.start_codec]
        )
        contributors = fed.aggregate.committed
        payloads = fed.downlink.encode(fed.weights, update, codec_name, contributors, fed.round)
        fed.weights_digest = weights_digest(fed.weights)
        final = fed.config.rounds > 0 and fed.round + 1 >= fed.config.rounds
        fed.checkpoint()
        self._record(codec_name, contributors)
        self._broadcast(payloads, contributors, final)
        fed.write_status()
        fed.round += 1
        fed.finished = final
        fed.aggregate = RoundAggregate(fed.spec)
        fed.contributed = set()
        fed.round_open = False
        if not final:
            self.maybe_open()

    def _broadcast(self, payloads: list[Payload], contributors: int, final: bool) -> None:
        fed = self.fed
        chunks = cut_all(
            payloads,
            kind=ChunkKind.AGGREGATE,
            round=fed.round,
            max_chunk_bytes=fed.config.max_chunk_bytes,
        )
        for s in list(fed.sessions.values()):
            if final:
                fed.final_delivered.add(s.key)
            before = s.bytes_down
            for chunk in chunks:
                s.send(chunk)
            fed.links.boundary(s, fed.round + 1)
            s.send(
                RoundEnd(
                    round=fed.round,
                    chunks=len(chunks),
                    weights_digest=fed.weights_digest,
                    contributors=contributors,
                    mean_loss=fed.stats.mean_loss,
                    codec=s.codec,
                    codec_params=fed.links.codec_params(s, fed.round + 1),
                    final=final,
                )
            )
            fed.stats.bytes_down += s.bytes_down - before

    def _record(self, codec_name: str, contributors: int) -> None:
        """Close the round's stats; ``bytes_down`` is added by the broadcast that follows."""
        fed = self.fed
        st = fed.stats
        st.duration_s = time.monotonic() - st.opened_at
        st.contributors = contributors
        st.mean_loss = sum(self._losses) / len(self._losses) if self._losses else float("nan")
        # The slowest contributor's compute is the round's critical path; the rest is exchange.
        st.train_s = max(self._train_s, default=0.0)
        st.raw_bytes_down = raw_bytes(fed.spec) * len(fed.sessions)
        st.downlink_codec = codec_name
        fed.history.append(st)
        self._losses, self._train_s = [], []
        log.info(
            "[Coordinator.Round] round=%d closed agents=%d loss=%.4f duration_s=%.3f down=%s",
            st.round,
            contributors,
            st.mean_loss,
            st.duration_s,
            codec_name,
        )
