"""The federation's shared state and its one lock, wiring the parts that work on it.

``admission`` (who is a member), ``intake`` (contributions in flight), ``rounds`` (open,
close, broadcast), ``downlink`` (the broadcast's encoding), ``links`` (each link's monitor
and codec), checkpoints and status. One condition variable, ``cond``, guards everything
here; every part takes it, and the round driver waits on it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence

import torch

from skyfed.coordinator import checkpoint
from skyfed.coordinator.admission import Admission
from skyfed.coordinator.aggregate import RoundAggregate
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.downlink import Downlink
from skyfed.coordinator.evaluate import EvalResult
from skyfed.coordinator.inbound import Intake
from skyfed.coordinator.links import Links
from skyfed.coordinator.outer import OuterOptimizer
from skyfed.coordinator.robust import NormBound
from skyfed.coordinator.rounds import Rounds
from skyfed.coordinator.session import Session
from skyfed.coordinator.status import RoundStats, Status, build_status
from skyfed.files import write_text_atomic
from skyfed.fingerprint import DigestStream, TensorInfo, spec_digest, weights_digest
from skyfed.payload_pool import PayloadPool
from skyfed.proto import serde
from skyfed.wire import max_payload_bytes, raw_bytes

log = logging.getLogger(__name__)

HISTORY = 1000


class Federation:
    """All state shared by the sessions, guarded by one condition variable."""

    def __init__(
        self, config: CoordinatorConfig, spec: Sequence[TensorInfo], weights: list[torch.Tensor]
    ) -> None:
        self.config = config
        self.spec = list(spec)
        self.digest = spec_digest(self.spec)
        self.weights = weights
        self.round = 0
        self.sessions: dict[str, Session] = {}
        self.revoked: dict[str, Session] = {}
        """Sessions ended by revocation, kept for status (state ``revoked``)."""
        self.closed_with: list[Session] = []
        """The sessions the last round closed with: the observer records that round's links
        from them even when an agent left before it looked (an agent that has applied the
        final round closes its stream at once, often before the observer's thread runs)."""
        self.cond = threading.Condition()
        self.started_at = time.monotonic()
        self.finished = False
        self.stopping = False
        self.failure: Exception | None = None
        """What ended the round driver, if it failed (the process then exits non-zero)."""
        self.history: deque[RoundStats] = deque(maxlen=HISTORY)
        self.stats = RoundStats(self.round, time.monotonic())
        self.aggregate = self.new_aggregate()
        self.payloads = PayloadPool()
        """The uplinks' payload memory, kept mapped from round to round (reused once the
        close let go of a payload)."""
        self.contributed: set[str] = set()
        self.contributors: set[str] = set()
        """Every identity that ever had a contribution counted: each is owed the final
        weights (``final_wait_s``)."""
        self.final_delivered: set[str] = set()
        """Identities the final round or the final weights were sent to."""
        self.round_open = False
        self.round_closed = threading.Event()
        """Set after every closed round; the observer clears it (``coordinator/observe.py``)."""
        # Operators' counters (status, metrics): refusals by gRPC status name, checkpoints.
        self.refusals: Counter[str] = Counter()
        self.checkpoints_written = 0
        self.checkpoint_wait_s = 0.0
        """Seconds rounds waited on their checkpoint (the rest is written beside them)."""
        self.evaluation: EvalResult | None = None
        """The last held-out evaluation, set by the observer's evaluator."""
        self.weights_free = threading.Event()
        """Clear while an evaluation reads the live weights (the observer lends them, the
        evaluator sets it when done); the close waits for it before changing them."""
        self.weights_free.set()
        self.evaluation_wait_s = 0.0
        """Seconds closes waited for an evaluation still reading the weights."""
        self.max_payload = max_payload_bytes(self.spec)
        self.norm_bound = NormBound(config.clip_norm_ratio)
        self.links = Links(
            config.codec,
            config.policy,
            config.monitor,
            [t.numel for t in self.spec],
            config.streams,
            rate_mbit=config.link_rate_mbit,
        )
        self.downlink = Downlink(self.spec, config.policy, config.seed)
        self.downlink.feedback.memory = self.payloads.take  # its payloads, kept mapped too
        self.outer = OuterOptimizer(config.outer)
        self.admission = Admission(self)
        self.intake = Intake(self)
        self.rounds = Rounds(self)
        self.checkpoints = (
            None
            if config.checkpoint_dir is None
            else checkpoint.CheckpointWriter(config.checkpoint_dir)
        )
        self._resume()
        self.weights_digest = weights_digest(self.weights)

    # ---- what the servicer and the server call -----------------------------------------

    def new_aggregate(self) -> RoundAggregate:
        """A round's aggregate, staging in memory up to ``stage_memory`` x the model (the
        coordinator's own directories it stages in are made; an operator's
        ``stage_dir`` is checked at start)."""
        config = self.config
        if config.stage_dir is None and config.spill_dir is not None:
            with contextlib.suppress(OSError):  # then held in memory (RoundAggregate.hold)
                config.spill_dir.mkdir(parents=True, exist_ok=True)
        budget = config.stage_memory * raw_bytes(self.spec)
        return RoundAggregate(
            self.spec,
            memory_bytes=None if math.isinf(budget) else int(budget),
            spill_dir=config.spill_dir,
        )

    def run(self) -> None:
        """Drive rounds (``coordinator/rounds.py``); meant for its own thread."""
        self.rounds.run()

    def stop(self) -> None:
        self.rounds.stop()

    def status(self, windows: bool = False, departed: bool = False) -> Status:
        """Who is connected and how, the recent rounds; ``windows`` adds raw link samples,
        ``departed`` the members the last round closed with that have left since (state
        ``disconnected``, their figures as they left)."""
        with self.cond:
            return build_status(self, windows, departed)

    def write_status(self) -> None:
        """Status as JSON, atomically, for operators' scripts and the demo's summary."""
        if self.config.status_file is not None:
            write_text_atomic(self.config.status_file, serde.status_to_json(self.status()))

    def refused(self, code: str) -> None:
        """Count a refused peer or session by its gRPC status name (``UNAUTHENTICATED``);
        in-band refusals of a contribution count in ``intake``."""
        with self.cond:
            self.refusals[code] += 1

    # ---- persistence ---------------------------------------------------------------------

    def begin_round_state(self) -> None:
        """The closing round's weights and residuals are about to become final, tensor by
        tensor: start their digest and (with a checkpoint directory) their checkpoint."""
        # The weights' digest names them to the agents; the rest only guards the file
        # (checkpoint.section_digest).
        self._digests = {
            section: DigestStream("weights" if section == "weights" else "integrity")
            for section in checkpoint.SECTIONS
        }
        self._written_sections: set[str] = set()
        if self.checkpoints is not None:
            self.checkpoints.begin(self.round, self.digest, [t.shape for t in self.spec])

    def tensor_final(self, i: int) -> None:
        """Tensor ``i``'s weights, downlink residual and outer momentum are final for this
        round: hash them and hand them to the checkpoint writer while later tensors are
        encoded (only the weights' digest without a checkpoint directory)."""
        momentum = self.outer.state()
        parts = {
            "weights": self.weights[i],
            "residual": self.downlink.residual_of(i),
            "outer": None if momentum is None else momentum[i],
        }
        for section, tensor in parts.items():
            if tensor is None or (section != "weights" and self.checkpoints is None):
                continue
            self._digests[section].add(tensor)
            self._written_sections.add(section)
            if self.checkpoints is not None:
                self.checkpoints.add(section, i, tensor)

    def end_round_state(self) -> None:
        """Every tensor is final: the weights digest, and the checkpoint's footer (the
        caller holds the lock and waits with :meth:`checkpoint_written` before the
        round's end goes out and before anything changes the tensors again)."""
        self.weights_digest = self._digests["weights"].hexdigest()
        if self.checkpoints is not None:
            self.checkpoints.finish(
                {s: self._digests[s].hexdigest() for s in self._written_sections}
            )

    def weights_read(self) -> None:
        """Wait until no evaluation reads the live weights (``coordinator/evaluate.py``):
        the close changes them in place. Called with the lock held; the evaluator frees
        them without taking it."""
        if self.weights_free.is_set():
            return
        started = time.perf_counter()
        self.weights_free.wait()
        waited = time.perf_counter() - started
        self.evaluation_wait_s += waited
        log.info("[Coordinator.Eval] round=%d close_waited_ms=%.0f", self.round, waited * 1000)

    def checkpoint_written(self) -> None:
        """Wait until the last checkpoint is whole on disk (a kill no longer loses it)."""
        if self.checkpoints is not None:
            self.checkpoints.wait_written()

    def close_checkpoints(self) -> None:
        """At shutdown: the last checkpoint made durable (fsynced)."""
        if self.checkpoints is not None:
            self.checkpoints.close()

    def _resume(self) -> None:
        if self.config.checkpoint_dir is None:
            return
        checkpoint.clean_stale(self.config.checkpoint_dir)
        # Weights, downlink residual and outer momentum: up to three float32 model copies.
        checkpoint.check_room(self.config.checkpoint_dir, 3 * raw_bytes(self.spec))
        ckpt = checkpoint.load(self.config.checkpoint_dir)
        if ckpt is None:
            return
        if ckpt.spec_digest != self.digest:
            raise RuntimeError(
                f"checkpoint in {self.config.checkpoint_dir} is for model {ckpt.spec_digest}, "
                f"this federation trains {self.digest}"
            )
        self.weights, self.round = ckpt.weights, ckpt.round + 1
        self.downlink.load_residual_list(ckpt.downlink_residual)
        self.outer.load(ckpt.outer_momentum)
        log.info("[Coordinator.Resume] round=%d from=%s", self.round, self.config.checkpoint_dir)
