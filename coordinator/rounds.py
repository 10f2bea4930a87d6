"""The round lifecycle: open, close, broadcast; the driver loop; each round's figures.

Round r opens; every live member may contribute once; the round closes when all live
members have committed, or when a quorum has and the deadline (counted from the first
committed contribution) has passed. Closing takes
the weighted mean, applies the outer step and encodes the update once for every link
(``coordinator/downlink.py``) tensor by tensor, each tensor's chunks queued for every
agent as soon as it is encoded; the checkpoint is written while they travel, and each
agent's ``RoundEnd``, the message that makes it apply the round, is sent only once the
checkpoint is whole on disk: every agent applies the same bytes, and no acknowledged
round is lost (docs/scale.md, Checkpoints).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from skyfed import failpoints
from skyfed.coordinator.status import RoundStats
from skyfed.logs import Phases
from skyfed.proto import serde
from skyfed.proto.chunks import cut
from skyfed.wire import ChunkKind, Payload, RoundEnd, raw_bytes

if TYPE_CHECKING:
    from skyfed.coordinator.federation import Federation
    from skyfed.coordinator.session import Session

log = logging.getLogger(__name__)
phase = Phases("Coordinator", log)
"""A round's phases, timed at DEBUG (``bench/scale.py --phases``, docs/wan.md)."""


class Rounds:
    """Drives ``fed``'s rounds; every method but :meth:`run` and :meth:`stop` is called
    with the lock held."""

    def __init__(self, fed: Federation) -> None:
        self.fed = fed
        self._first = True
        self._losses: list[float] = []
        self._train_s: list[float] = []
        # monotonic s of the open round's first committed contribution: the deadline counts
        # from it (None: nothing committed yet)
        self._first_commit_at: float | None = None
        # Of the closing round, s: its mean and outer step; making the downlink's payloads
        # (the mean included), for its phase marks
        self._mean_s = self._encode_s = 0.0

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
        if self._first_commit_at is None:
            self._first_commit_at = time.monotonic()

    def maybe_open(self) -> None:
        """Round 0, and the first round after a restart, wait for ``min_agents``."""
        fed = self.fed
        needed = fed.config.min_agents if self._first else 1
        if len(fed.sessions) < needed:
            return
        self._first = False
        fed.round_open = True
        fed.stats = RoundStats(fed.round, time.monotonic())
        phase(fed.round, "open")
        log.info("[Coordinator.Round] round=%d opened agents=%d", fed.round, len(fed.sessions))

    def _should_close(self) -> bool:
        fed = self.fed
        committed = fed.aggregate.committed
        if committed < max(1, fed.config.quorum):  # a minimum, even when all have sent
            return False
        if all(key in fed.contributed for key in fed.sessions):
            return True
        # The deadline bounds the wait for stragglers once the fastest site is done, not
        # the local phase: counted from the round's opening, a local phase longer than it
        # (DiLoCo's hundreds of steps) closed every round on the fastest site alone and
        # threw the others' whole phase away (docs/outer-optimizer.md, Long local phases).
        first = fed.stats.opened_at if self._first_commit_at is None else self._first_commit_at
        late = time.monotonic() - first >= fed.config.round_deadline_s
        return late and committed >= fed.config.quorum

    def close(self) -> None:
        """Close the open round: the mean, the outer step, the downlink streamed to every
        agent, the checkpoint, the round's end, the next round."""
        fed = self.fed
        phase(fed.round, "close")
        self._mean_s = 0.0
        fed.intake.withdraw_all()
        codec_name = fed.downlink.codec_for(
            [s.codec for s in fed.sessions.values()] or [fed.links.start_codec]
        )
        contributors = fed.aggregate.committed
        if fed.aggregate.spilled:
            log.info(
                "[Coordinator.Stage] round=%d uplinks in_memory_mb=%.1f on_disk_mb=%.1f"
                " (stage_memory=%g)",
                fed.round,
                fed.aggregate.held / 2**20,
                fed.aggregate.spilled / 2**20,
                fed.config.stage_memory,
            )
        fed.checkpoint_written()  # the last one read the weights this round changes
        fed.weights_read()  # and so may the last evaluation
        final = fed.config.rounds > 0 and fed.round + 1 >= fed.config.rounds
        sessions = list(fed.sessions.values())
        before = {s.key: s.bytes_down for s in sessions}
        fewest = min((s.local_steps for s in sessions), default=0)  # the shortest phase
        payloads = fed.downlink.encode(
            fed.weights, self._update, codec_name, contributors, fed.round, fewest
        )
        fed.begin_round_state()
        chunks = self._stream(payloads, sessions)
        fed.end_round_state()
        phase(fed.round, "encoded", mean_s=self._mean_s, encode_s=self._encode_s)
        waited = time.perf_counter()
        fed.checkpoint_written()
        phase(fed.round, "checkpointed")
        if fed.config.checkpoint_dir is not None:
            on_path_s = time.perf_counter() - waited
            fed.checkpoints_written += 1
            fed.checkpoint_wait_s += on_path_s
            log.info(
                "[Coordinator.Checkpoint] round=%d on_path_ms=%.0f", fed.round, on_path_s * 1000
            )
        self._record(codec_name, contributors)
        self._round_ends(sessions, before, chunks, contributors, final)
        fed.stats.bytes_down += sum(s.bytes_down - before[s.key] for s in sessions)
        phase(fed.round, "ended")
        fed.write_status()
        fed.round += 1
        fed.finished = final
        fed.aggregate = fed.new_aggregate()
        fed.contributed = set()
        fed.round_open = False
        fed.closed_with = sessions
        fed.round_closed.set()  # the observer's cue (coordinator/observe.py)
        if not final:
            self.maybe_open()

    def _update(self, tensor: int, out: torch.Tensor) -> torch.Tensor:
        """Tensor ``tensor``'s update into ``out``: the outer optimizer's step on the
        weighted mean of the contributions; its staged payloads are dropped as soon as it
        is taken."""
        fed, started = self.fed, time.perf_counter()
        fed.aggregate.mean_into(tensor, out)
        fed.aggregate.release(tensor)
        failpoints.reached("mean", fed.round)
        update = fed.outer.step_into(tensor, out, len(fed.spec))
        self._mean_s += time.perf_counter() - started
        return update

    def _stream(self, payloads: Iterable[Payload], sessions: list[Session]) -> int:
        """Queue every payload's chunks for every session as each payload is made (each
        chunk converted once and shared; its bytes are a view of the payload, joined as
        each session sends it: docs/scale.md, Streams); the number of chunks."""
        fed, sent = self.fed, 0
        self._encode_s, started = 0.0, time.perf_counter()
        for payload in payloads:
            self._encode_s += time.perf_counter() - started
            for chunk in cut(
                payload,
                kind=ChunkKind.AGGREGATE,
                round=fed.round,
                first_seq=sent,
                max_chunk_bytes=fed.config.max_chunk_bytes,
                views=True,
            ):
                encoded = serde.serialized_chunk(chunk)
                for s in sessions:
                    s.send_encoded(encoded)
                sent += 1
            fed.tensor_final(payload.tensor)  # hashed and written while the next encodes
            failpoints.reached("downlink", fed.round)
            started = time.perf_counter()
        self._encode_s += time.perf_counter() - started
        return sent

    def _round_ends(
        self,
        sessions: list[Session],
        before: dict[str, int],
        chunks: int,
        contributors: int,
        final: bool,
    ) -> None:
        """Each session's round end (after its chunks); ``before``: its bytes down before
        this round's broadcast."""
        fed = self.fed
        for s in sessions:
            if final:  # who has the final weights (coordinator/admission.py)
                fed.final_delivered.add(s.key)
            fed.links.boundary(s, fed.round + 1)
            streams = fed.links.streams_at_boundary(s)
            s.send(
                RoundEnd(
                    round=fed.round,
                    chunks=chunks,
                    weights_digest=fed.weights_digest,
                    contributors=contributors,
                    mean_loss=fed.stats.mean_loss,
                    codec=s.codec,
                    codec_params=fed.links.codec_params(s, fed.round + 1),
                    final=final,
                    streams=streams if s.stripe_token else 0,
                )
            )
            s.raw_bytes_down += raw_bytes(fed.spec)
            if fed.round in s.transfers:  # the link's exchange, timed (docs/striping.md)
                s.transfers[fed.round][1] = s.bytes_down - before[s.key]
            failpoints.reached("broadcast", fed.round, settle_s=1.0)  # one agent has it

    def _record(self, codec_name: str, contributors: int) -> None:
        """Close the round's stats; ``bytes_down`` is added by the broadcast that follows."""
        fed = self.fed
        st = fed.stats
        now = time.monotonic()
        st.duration_s = now - st.opened_at
        st.wall_s = now - fed.started_at
        st.contributors = contributors
        st.mean_loss = sum(self._losses) / len(self._losses) if self._losses else float("nan")
        # The slowest contributor's compute is the round's critical path; the rest is exchange.
        st.train_s = max(self._train_s, default=0.0)
        st.raw_bytes_down = raw_bytes(fed.spec) * len(fed.sessions)
        st.downlink_codec = codec_name
        st.staged_memory_bytes = fed.aggregate.held
        st.staged_disk_bytes = fed.aggregate.spilled
        fed.history.append(st)
        self._losses, self._train_s = [], []
        self._first_commit_at = None
        log.info(
            "[Coordinator.Round] round=%d closed agents=%d loss=%.4f duration_s=%.3f down=%s",
            st.round,
            contributors,
            st.mean_loss,
            st.duration_s,
            codec_name,
        )
