"""Contributions in flight: one object per contribution, from its header to its receipt.

A contribution is announced, then arrives chunk by chunk; each whole payload is checked
outside the lock and staged in the round's aggregate under it (held encoded until the
close, ``coordinator/aggregate.py``); the last chunk (the header's count) or its
``ContributionEnd`` (a streamed one, whose count comes last) commits it and earns an
accepted receipt. A refused one (late, already counted) gets a refused receipt and its
chunks are counted off and discarded; one the round closes under is withdrawn, so the sum
is as if it never came. A coordinator replica that leads forwards each payload to its
standbys as it is staged (``coordinator/replicas/followers.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from skyfed import allocator, failpoints
from skyfed.coordinator.aggregate import Contribution
from skyfed.coordinator.status_codes import status_code
from skyfed.errors import (
    AlreadyContributedError,
    FederationError,
    LateContributionError,
    ProtocolError,
)
from skyfed.logs import Phases
from skyfed.proto.chunks import Assembler
from skyfed.wire import (
    MAX_CHUNKS,
    MAX_METRICS,
    Announce,
    Chunk,
    ChunkKind,
    ContributionEnd,
    Receipt,
)

if TYPE_CHECKING:
    from skyfed.coordinator.federation import Federation
    from skyfed.coordinator.round import Round
    from skyfed.coordinator.session import Session

log = logging.getLogger(__name__)
phase = Phases("Coordinator", log)

TRANSFERS_KEPT = 4
"""Rounds of a session's exchange bytes kept until its agent reports their timing."""


@dataclass(eq=False, slots=True)
class Inbound:
    """One contribution arriving on one session. Without an ``entry`` it was refused:
    its ``expected`` chunks of ``round`` are counted off and discarded (a streamed one's,
    ``expected`` None, up to its ``ContributionEnd``)."""

    round: int
    expected: int | None
    """Chunks announced; None: streamed, counted by its ``ContributionEnd``."""
    entry: Contribution | None = None
    """Its entry in the round's aggregate."""
    assembler: Assembler | None = None
    seen: int = 0
    loss: float | None = None
    train_s: float = 0.0
    owner: Round | None = None
    """The round its entry belongs to (the one it commits to)."""

    @property
    def open(self) -> bool:
        """Accepted and still arriving: its payloads so far are staged in the aggregate."""
        return self.entry is not None and not self.entry.done

    @property
    def left(self) -> int | None:
        """Chunks still to come (None: streamed, until its end)."""
        return None if self.expected is None else self.expected - self.seen

    @property
    def discarding(self) -> bool:
        """Refused, and chunks of it may still come."""
        return self.entry is None and (self.expected is None or self.seen < self.expected)

    def discards(self, chunk: Chunk) -> bool:
        """True, counting it off, for a chunk of this refused contribution."""
        if self.discarding and chunk.round == self.round:
            self.seen += 1
            return True
        return False

    def withdraw(self) -> None:
        """Drop what it staged (if it is still open): the sum is as if it never came."""
        if self.open:
            assert self.entry is not None  # open: accepted
            self.entry.withdraw()


class Intake:
    """Receives every session's contributions into ``fed``'s round aggregate."""

    def __init__(self, fed: Federation) -> None:
        self.fed = fed

    def begin(self, session: Session, header: Announce) -> None:
        """Open a contribution; a late one is refused in-band and its chunks discarded."""
        fed = self.fed
        with fed.cond:
            fed.admission.require_member(session)
            if header.timing is not None:
                self._timed(session, header)
            if header.metrics:  # the site's own evaluation: shown whether or not it is late
                session.metrics = latest_metrics(session.metrics, header.metrics)
                session.metrics_round = header.round
            if session.inbound is not None and session.inbound.open:
                raise ProtocolError("a contribution was announced before the previous one ended")
            round_ = fed.rounds.round
            _check(header, round_.number)
            # A contribution for the round not yet open (waiting for min_agents) is early,
            # not late: it is summed and counts once the round opens.
            if header.round < round_.number:
                late = LateContributionError(
                    f"round {header.round} closed before this contribution arrived; round "
                    f"{round_.number} is open (keep it in the error-feedback residual)"
                )
                self.refuse(session, header.round, header.chunks or None, late)
                return
            if session.last_round == round_.number:
                raise ProtocolError(f"a second contribution for round {round_.number}")
            if round_.committed == 0 and not self._arriving():
                # The round's first upload: the last broadcast's chunk buffers, sent by
                # now, go back before this round's payloads take memory, and payload
                # buffers the last round did not use are let go (docs/scale.md).
                allocator.trim()
                let_go = fed.payloads.sweep()
                log.debug(
                    "[Coordinator.Payloads] round=%d kept_bytes=%d let_go_bytes=%d",
                    round_.number,
                    fed.payloads.nbytes,
                    let_go,
                )
            try:  # a restarted agent, already counted, is refused
                entry = round_.begin(session.key, header.samples)
            except AlreadyContributedError as again:
                self.refuse(session, header.round, header.chunks or None, again)
                return
            session.inbound = Inbound(
                round=header.round,
                expected=header.chunks or None,
                entry=entry,
                owner=round_,
                assembler=Assembler(
                    kind=ChunkKind.GRADIENT,
                    round=header.round,
                    num_tensors=len(fed.model.spec),
                    max_chunk_bytes=fed.config.transport.max_chunk_bytes,
                    max_payload_bytes=fed.max_payload,
                    memory=entry.memory(fed.payloads.take),
                ),
                loss=header.loss,
                train_s=header.train_s,
            )
            session.state = "sending"
            fed.links.of(session).upload_begins(session.bytes_up, time.monotonic())
            fed.rounds.stats.raw_bytes_up += header.raw_bytes
            session.raw_bytes_up += header.raw_bytes

    def _arriving(self) -> bool:
        """Some contribution is arriving now (the caller holds the lock)."""
        sessions = self.fed.admission.sessions.values()
        return any(s.inbound is not None and s.inbound.open for s in sessions)

    def _timed(self, session: Session, header: Announce) -> None:
        """The agent's timing of its last exchange: the link's efficiency in that round
        (status and the round's history). The caller holds the lock."""
        assert header.timing is not None
        e = self.fed.links.timed(session, header.timing, self.fed.config.transport.link_rate_mbit)
        if e is None:
            return
        session.efficiency = e
        for stats in self.fed.rounds.history:
            if stats.round == e.round:
                stats.links.append(e)
        log.info(
            "[Coordinator.Efficiency] agent=%s round=%d exchange_s=%.3f floor_s=%.3f ratio=%.2f "
            "streams=%d limit=%s",
            session.key,
            e.round,
            e.exchange_s,
            e.floor_s,
            e.ratio,
            e.streams,
            e.limit or "-",
        )

    def refuse(
        self, session: Session, round_: int, chunks: int | None, err: FederationError
    ) -> None:
        """Refuse a contribution in-band: the session goes on, its ``chunks`` are
        discarded (None: every chunk up to its ``ContributionEnd``). The caller holds the
        lock."""
        session.inbound = Inbound(round=round_, expected=chunks)
        session.refused += 1
        log.info(
            "[Coordinator.Refuse] agent=%s round=%d open=%d: %s",
            session.key,
            round_,
            self.fed.rounds.round.number,
            err,
        )
        code = status_code(err)
        self.fed.refusals[code.name] += 1
        session.send(Receipt(round=round_, accepted=False, code=code.value[0], message=str(err)))

    def chunk(self, session: Session, chunk: Chunk) -> None:
        """Validate and add one chunk; completes the contribution on its last chunk.

        Runs on the session's reader thread: decoding and checks happen outside the lock,
        only staging the checked payload happens under it.
        """
        fed = self.fed
        session.bytes_up += len(chunk.data)
        with fed.cond:
            fed.rounds.stats.bytes_up += len(chunk.data)
            inbound = session.inbound
            if inbound is not None and inbound.discards(chunk):
                return
        if inbound is None or inbound.entry is None or inbound.assembler is None:
            raise ProtocolError("a chunk arrived outside an announced contribution")
        payload = inbound.assembler.add(chunk)
        inbound.seen += 1
        if inbound.seen > (inbound.expected or MAX_CHUNKS):
            raise ProtocolError(f"a contribution of more than {MAX_CHUNKS} chunks")
        if payload is not None:
            checked = inbound.entry.check(payload)
            with fed.cond:
                assert inbound.owner is not None
                held = inbound.owner.stage(inbound.entry, checked)
                if held is not None and fed.replication is not None:
                    fed.replication.staged(inbound.owner, inbound.entry, held)
            failpoints.reached("upload", inbound.round)
        if inbound.seen == inbound.expected:
            self._last_chunk(session, inbound)

    def end(self, session: Session, end: ContributionEnd) -> None:
        """A streamed contribution's end: its count must be what arrived; commits it."""
        fed = self.fed
        with fed.cond:
            inbound = session.inbound
            if (
                inbound is not None
                and inbound.entry is None
                and inbound.expected is None
                and inbound.round == end.round
            ):
                session.inbound = None  # refused while it streamed: all of it is counted off
                return
        if inbound is None or inbound.entry is None or inbound.expected is not None:
            raise ProtocolError("a contribution's end arrived outside a streamed contribution")
        if end.round != inbound.round or end.chunks != inbound.seen:
            raise ProtocolError(
                f"the contribution to round {end.round} ends at {end.chunks} chunks; "
                f"{inbound.seen} of round {inbound.round} arrived"
            )
        self._last_chunk(session, inbound)

    def _last_chunk(self, session: Session, inbound: Inbound) -> None:
        assert inbound.assembler is not None
        if inbound.assembler.mid_payload:
            raise ProtocolError("the contribution's last chunk ends inside a payload")
        self._finish(session, inbound)

    def _finish(self, session: Session, inbound: Inbound) -> None:
        fed = self.fed
        with fed.cond:
            if not inbound.open:
                return  # withdrawn meanwhile: the round closed under it and it was refused
            assert inbound.owner is not None and inbound.entry is not None
            inbound.owner.commit(inbound.entry)
            session.inbound = None
            session.last_round = inbound.round
            connections = session.connections if session.stripe_token else 0
            link = fed.links.of(session)
            nbytes = link.upload_done(
                session.bytes_up, time.monotonic(), inbound.train_s, connections, inbound.seen
            )
            session.transfers[inbound.round] = [nbytes, 0]
            for old in sorted(session.transfers)[:-TRANSFERS_KEPT]:
                del session.transfers[old]
            session.state = "idle"
            fed.rounds.contributed(session.key, inbound.loss, inbound.train_s)
            phase(inbound.round, "committed", agent=session.key)
            session.send(Receipt(round=session.last_round, accepted=True))
            fed.cond.notify_all()

    def withdraw_all(self) -> None:
        """The round closes: anything half-sent is late, taken out before the mean."""
        fed = self.fed
        for s in fed.admission.sessions.values():
            inbound = s.inbound
            if inbound is not None and inbound.open:
                fed.admission.forget(s)
                s.state = "idle"
                number = fed.rounds.round.number
                late = LateContributionError(
                    f"round {number} closed while this contribution was arriving"
                )
                self.refuse(s, number, inbound.left, late)


def _check(header: Announce, open_round: int) -> None:
    if header.round > open_round or header.round < 0:
        raise ProtocolError(
            f"contribution for round {header.round}, but round {open_round} is open"
        )
    if header.samples < 1:
        raise ProtocolError(f"a contribution must count at least 1 sample, got {header.samples}")


def latest_metrics(held: dict[str, float], new: Mapping[str, float]) -> dict[str, float]:
    """The latest value of each metric a site reported: a script's accuracy, reported
    every few phases, stays beside the GPU summary every contribution carries. Bounded
    like one report (``MAX_METRICS``): the new names first, then the most recent others."""
    kept = {k: v for k, v in held.items() if k not in new}
    room = max(MAX_METRICS - len(new), 0)
    return {**dict(list(kept.items())[-room:] if room else []), **new}
