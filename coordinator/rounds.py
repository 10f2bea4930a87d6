"""The round lifecycle on the network: open, close, broadcast; the driver loop; each
round's figures; checkpoints.

Round r opens; every live member may contribute once; the round closes when all live
members have committed, or when a quorum has and the deadline (counted from the first
committed contribution) has passed. The close itself (weighting, clipping, the mean, the
outer step, the downlink's encode) is the round object's (``coordinator/round.py``):
this driver streams each tensor's payload to every agent as soon as the close yields
it, writes the checkpoint while they travel, and sends each agent's ``RoundEnd``, the
message that makes it apply the round, only once the checkpoint is whole on disk: every
agent applies the same bytes, and no acknowledged round is lost (docs/scale.md,
Checkpoints). A coordinator replica that leads also waits for its standbys to hold the
round and records its release under its term first (docs/failover.md): a deposed
leader's round is never applied.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from skyfed import failpoints
from skyfed.coordinator import checkpoint
from skyfed.coordinator.replicas.followers import ReleaseRefused
from skyfed.coordinator.round import Round
from skyfed.fingerprint import DigestStream
from skyfed.logs import Phases
from skyfed.proto import serde
from skyfed.proto.chunks import cut
from skyfed.status import RoundStats
from skyfed.wire import ChunkKind, Payload, RoundEnd, raw_bytes

if TYPE_CHECKING:
    from skyfed.coordinator.federation import Federation
    from skyfed.coordinator.session import Session

log = logging.getLogger(__name__)
phase = Phases("Coordinator", log)
"""A round's phases, timed at DEBUG (``bench/scale.py --phases``, docs/wan.md)."""

HISTORY = 1000
"""Closed rounds whose figures status keeps."""


class Rounds:
    """Drives the federation's rounds; owns the open round, the run's history and its
    checkpoints. Every method but :meth:`run`, :meth:`stop` and :meth:`lend_weights`
    is called with the federation's lock held."""

    def __init__(self, fed: Federation) -> None:
        self.fed = fed
        self.round: Round = fed.model.open()
        """The round contributions go to: open, or waiting to open (an early contribution
        is summed and counts once it opens)."""
        self.opened = False
        self.finished = False
        self.stats = RoundStats(self.round.number, time.monotonic())
        self.history: deque[RoundStats] = deque(maxlen=HISTORY)
        self.closed_with: list[Session] = []
        """The sessions the last round closed with: the observer records that round's links
        from them even when an agent left before it looked (an agent that has applied the
        final round closes its stream at once, often before the observer's thread runs)."""
        self.round_closed = threading.Event()
        """Set after every closed round; the observer clears it (``coordinator/observe.py``)."""
        self.contributors: set[str] = set()
        """Every identity that ever had a contribution counted: each is owed the final
        weights (``final_wait_s``)."""
        self.final_delivered: set[str] = set()
        """Identities the final round or the final weights were sent to."""
        directory = fed.config.checkpoints.checkpoint_dir
        self.checkpoints = None if directory is None else checkpoint.CheckpointWriter(directory)
        self.checkpoints_written = 0
        self.checkpoint_wait_s = 0.0
        """Seconds rounds waited on their checkpoint (the rest is written beside them)."""
        self.weights_free = threading.Event()
        """Clear while an evaluation reads the live weights (:meth:`lend_weights`); the
        close waits for it before changing them."""
        self.weights_free.set()
        self.evaluation_wait_s = 0.0
        """Seconds closes waited for an evaluation still reading the weights."""
        self._first = True
        self._losses: list[float] = []
        self._train_s: list[float] = []
        # monotonic s of the open round's first committed contribution: the deadline counts
        # from it (None: nothing committed yet)
        self._first_commit_at: float | None = None
        self._integrity: dict[str, DigestStream] = {}
        self._encode_s = 0.0
        """Of the closing round, s: making the downlink's payloads (the mean included),
        for its phase marks."""

    # ---- the driver ----------------------------------------------------------------------

    def run(self) -> None:
        """Drive rounds until the configured count or :meth:`stop`; meant for its own thread."""
        fed = self.fed
        with fed.cond:
            while not fed.stopping and not self.finished:
                fed.admission.expire_silent()
                if not self.opened:
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
            deadline = time.monotonic() + fed.config.rounds.final_wait_s
            while not fed.stopping and self._owed() and time.monotonic() < deadline:
                fed.cond.wait(timeout=0.05)
            for s in fed.admission.sessions.values():
                s.close()  # after the queued final messages

    def _owed(self) -> bool:
        """Someone may still need the final weights: a stream still open, or a member
        that contributed and has not had them."""
        sessions = self.fed.admission.sessions
        return bool(sessions) or bool(self.contributors - self.final_delivered)

    def stop(self) -> None:
        with self.fed.cond:
            self.fed.stopping = True
            self.fed.cond.notify_all()

    def contributed(self, key: str, loss: float | None, train_s: float) -> None:
        """``key``'s contribution was committed: its loss (if it said one) and compute
        time count in the round's figures."""
        self.contributors.add(key)
        if loss is not None:
            self._losses.append(loss)
        self._train_s.append(train_s)
        if self._first_commit_at is None:
            self._first_commit_at = time.monotonic()

    def maybe_open(self) -> None:
        """Round 0, and the first round after a restart, wait for ``min_agents``."""
        fed = self.fed
        needed = fed.config.rounds.min_agents if self._first else 1
        if len(fed.admission.sessions) < needed:
            return
        self._first = False
        self.opened = True
        self.stats = RoundStats(self.round.number, time.monotonic())
        phase(self.round.number, "open")
        failpoints.reached("idle", self.round.number)  # open, nothing staged yet
        log.info(
            "[Coordinator.Round] round=%d opened agents=%d",
            self.round.number,
            len(fed.admission.sessions),
        )

    def _should_close(self) -> bool:
        fed = self.fed
        committed = self.round.committed
        if committed < max(1, fed.config.rounds.quorum):  # a minimum, even when all have sent
            return False
        if all(self.round.has(key) for key in fed.admission.sessions):
            return True
        # The deadline bounds the wait for stragglers once the fastest site is done, not
        # the local phase: counted from the round's opening, a local phase longer than it
        # (DiLoCo's hundreds of steps) closed every round on the fastest site alone and
        # threw the others' whole phase away (docs/outer-optimizer.md, Long local phases).
        first = self.stats.opened_at if self._first_commit_at is None else self._first_commit_at
        late = time.monotonic() - first >= fed.config.rounds.round_deadline_s
        return late and committed >= fed.config.rounds.quorum

    # ---- the close -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the open round: its update streamed to every agent as the round object
        makes it, the checkpoint, the round's end, the next round."""
        fed, round_ = self.fed, self.round
        number = round_.number
        phase(number, "close")
        fed.intake.withdraw_all()
        sessions = list(fed.admission.sessions.values())
        codec = fed.model.downlink.codec_for([s.codec for s in sessions] or [fed.links.start_codec])
        contributors = round_.committed
        aggregate = round_.aggregate
        if aggregate.spilled:
            log.info(
                "[Coordinator.Stage] round=%d uplinks in_memory_mb=%.1f on_disk_mb=%.1f"
                " (stage_memory=%g)",
                number,
                aggregate.held / 2**20,
                aggregate.spilled / 2**20,
                fed.config.checkpoints.stage_memory,
            )
        self.checkpoint_written()  # the last one read the weights this round changes
        self._weights_read()  # and so may the last evaluation
        final = fed.config.rounds.rounds > 0 and number + 1 >= fed.config.rounds.rounds
        before = {s.key: s.bytes_down for s in sessions}
        fewest = min((s.local_steps for s in sessions), default=0)  # the shortest phase
        if fed.replication is not None:  # the standbys close the same round beside us
            since = fed.model.downlink.run.at(codec, number).since
            fed.replication.closing(round_, codec, since, fewest)
        self._begin_checkpoint(number)
        chunks = self._stream(round_, round_.close(codec, fewest), sessions)
        self._end_checkpoint()
        phase(number, "encoded", mean_s=round_.mean_s, encode_s=self._encode_s)
        waited = time.perf_counter()
        self.checkpoint_written()
        phase(number, "checkpointed")
        if self.checkpoints is not None:
            on_path_s = time.perf_counter() - waited
            self.checkpoints_written += 1
            self.checkpoint_wait_s += on_path_s
            log.info("[Coordinator.Checkpoint] round=%d on_path_ms=%.0f", number, on_path_s * 1000)
        self._record(codec, contributors, aggregate.held, aggregate.spilled)
        self._released(number)
        self._round_ends(number, sessions, before, chunks, contributors, final)
        self.stats.bytes_down += sum(s.bytes_down - before[s.key] for s in sessions)
        phase(number, "ended")
        fed.write_status()
        self.finished = final
        self.round = fed.model.open()
        self.opened = False
        self.closed_with = sessions
        self.round_closed.set()  # the observer's cue (coordinator/observe.py)
        if not final:
            self.maybe_open()

    def _released(self, number: int) -> None:
        """A replica's round is released once its following standbys hold it and etcd
        records it under this leader's term (``coordinator/replicas/followers.py``); a
        leader whose term has ended releases nothing: ``ReleaseRefused`` ends its driver."""
        replication = self.fed.replication
        if replication is None:
            return
        if not replication.release(number, self.fed.model.weights_digest):
            raise ReleaseRefused(f"round {number} was not released: term {replication.term} ended")
        phase(number, "released")
        failpoints.reached("release", number)  # standbys hold it; no agent has it yet

    def _stream(self, round_: Round, payloads: Iterable[Payload], sessions: list[Session]) -> int:
        """Queue every payload's chunks for every session as each payload is made (each
        chunk converted once and shared; its bytes are a view of the payload, joined as
        each session sends it: docs/scale.md, Streams); the number of chunks."""
        sent = 0
        self._encode_s, started = 0.0, time.perf_counter()
        for payload in payloads:
            self._encode_s += time.perf_counter() - started
            for chunk in cut(
                payload,
                kind=ChunkKind.AGGREGATE,
                round=round_.number,
                first_seq=sent,
                max_chunk_bytes=self.fed.config.transport.max_chunk_bytes,
                views=True,
                term=self.fed.term,
            ):
                encoded = serde.serialized_chunk(chunk)
                for s in sessions:
                    s.send_encoded(encoded)
                sent += 1
            self._tensor_final(payload.tensor)  # written while the next encodes
            failpoints.reached("downlink", round_.number)
            started = time.perf_counter()
        self._encode_s += time.perf_counter() - started
        return sent

    def _round_ends(
        self,
        number: int,
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
                self.final_delivered.add(s.key)
            fed.links.boundary(s, number + 1)
            streams = fed.links.streams_at_boundary(s)
            s.send(
                RoundEnd(
                    round=number,
                    chunks=chunks,
                    weights_digest=fed.model.weights_digest,
                    contributors=contributors,
                    mean_loss=self.stats.mean_loss,
                    codec=s.codec,
                    codec_params=fed.links.codec_params(s, number + 1),
                    final=final,
                    streams=streams if s.stripe_token else 0,
                    term=fed.term,
                )
            )
            s.raw_bytes_down += raw_bytes(fed.model.spec)
            if number in s.transfers:  # the link's exchange, timed (docs/striping.md)
                s.transfers[number][1] = s.bytes_down - before[s.key]
            failpoints.reached("broadcast", number, settle_s=1.0)  # one agent has it

    def _record(self, codec: str, contributors: int, held: int, spilled: int) -> None:
        """Close the round's stats; ``bytes_down`` is added by the broadcast that follows."""
        fed = self.fed
        st = self.stats
        now = time.monotonic()
        st.duration_s = now - st.opened_at
        st.wall_s = now - fed.started_at
        st.contributors = contributors
        st.mean_loss = sum(self._losses) / len(self._losses) if self._losses else float("nan")
        # The slowest contributor's compute is the round's critical path; the rest is exchange.
        st.train_s = max(self._train_s, default=0.0)
        st.raw_bytes_down = raw_bytes(fed.model.spec) * len(fed.admission.sessions)
        st.downlink_codec = codec
        st.staged_memory_bytes = held
        st.staged_disk_bytes = spilled
        # Taken now: an agent's next contribution replaces its metrics before the observer
        # writes this round's line.
        st.metrics = {
            s.identity.name: dict(s.metrics)
            for s in fed.admission.sessions.values()
            if s.metrics and s.metrics_round == st.round
        }
        self.history.append(st)
        self._losses, self._train_s = [], []
        self._first_commit_at = None
        log.info(
            "[Coordinator.Round] round=%d closed agents=%d loss=%.4f duration_s=%.3f down=%s "
            "digest=%s",
            st.round,
            contributors,
            st.mean_loss,
            st.duration_s,
            codec,
            fed.model.weights_digest[:16],
        )

    # ---- checkpoints ---------------------------------------------------------------------

    def _begin_checkpoint(self, number: int) -> None:
        """Round ``number``'s checkpoint begins: its tensors go in as the close makes
        them final (the weights' digest is the round object's own)."""
        if self.checkpoints is None:
            return
        self._integrity = {s: DigestStream("integrity") for s in ("residual", "outer")}
        model = self.fed.model
        self.checkpoints.begin(number, model.spec_digest, [t.shape for t in model.spec])

    def _tensor_final(self, i: int) -> None:
        """Tensor ``i``'s weights, downlink residual and outer momentum are final for this
        round: hand them to the checkpoint writer while later tensors are encoded."""
        if self.checkpoints is None:
            return
        model = self.fed.model
        momentum = model.outer.state()
        parts = {
            "weights": model.weights[i],
            "residual": model.downlink.residual_of(i),
            "outer": None if momentum is None else momentum[i],
        }
        for section, tensor in parts.items():
            if tensor is None:
                continue
            if section in self._integrity:
                self._integrity[section].add(tensor)
            self.checkpoints.add(section, i, tensor)

    def _end_checkpoint(self) -> None:
        """Every tensor is final: the checkpoint's footer (waited for with
        :meth:`checkpoint_written` before the round's end goes out)."""
        if self.checkpoints is None:
            return
        model = self.fed.model
        model_state = model.checkpoint()
        digests = {"weights": model.weights_digest}
        if model_state.downlink_residual is not None:
            digests["residual"] = self._integrity["residual"].hexdigest()
        if model_state.outer_momentum is not None:
            digests["outer"] = self._integrity["outer"].hexdigest()
        self.checkpoints.finish(digests, model_state.norms)

    def checkpoint_written(self) -> None:
        """Wait until the last checkpoint is whole on disk (a kill no longer loses it)."""
        if self.checkpoints is not None:
            self.checkpoints.wait_written()

    def close_checkpoints(self) -> None:
        """At shutdown: the last checkpoint made durable (fsynced)."""
        if self.checkpoints is not None:
            self.checkpoints.close()

    # ---- the weights, lent to an evaluation ----------------------------------------------

    def lend_weights(self) -> tuple[int, list]:
        """The last closed round and its live weights, lent: the next close waits until
        the borrower sets :attr:`weights_free` again, so they stay that round's whole,
        with no model-sized copy (docs/scale.md, The held-out evaluation). Takes the lock."""
        fed = self.fed
        with fed.cond:  # between closes: the close changes the weights under it
            self.weights_free.clear()
            return fed.model.round - 1, list(fed.model.weights)

    def _weights_read(self) -> None:
        """Wait until no evaluation reads the live weights: the close changes them in
        place. The evaluator frees them without taking the lock."""
        if self.weights_free.is_set():
            return
        started = time.perf_counter()
        self.weights_free.wait()
        waited = time.perf_counter() - started
        self.evaluation_wait_s += waited
        log.info(
            "[Coordinator.Eval] round=%d close_waited_ms=%.0f", self.round.number, waited * 1000
        )
