"""The federation's shared state and its one lock, wiring the parts that work on it.

``admission`` (who is a member), ``intake`` (contributions in flight), ``rounds`` (open,
close, broadcast), ``downlink`` (the broadcast's encoding), ``links`` (each link's monitor
and codec), checkpoints and status. One condition variable, ``cond``, guards everything
here; every part takes it, and the round driver waits on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence

import torch

from skyfed.coordinator import checkpoint
from skyfed.coordinator.admission import Admission
from skyfed.coordinator.aggregate import RoundAggregate
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.downlink import Downlink
from skyfed.coordinator.inbound import Intake
from skyfed.coordinator.links import Links
from skyfed.coordinator.outer import OuterOptimizer
from skyfed.coordinator.robust import NormBound
from skyfed.coordinator.rounds import Rounds
from skyfed.coordinator.session import Session
from skyfed.coordinator.status import RoundStats, Status, build_status
from skyfed.files import write_text_atomic
from skyfed.fingerprint import TensorInfo, spec_digest, weights_digest
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
        self.cond = threading.Condition()
        self.started_at = time.monotonic()
        self.finished = False
        self.stopping = False
        self.failure: Exception | None = None
        """What ended the round driver, if it failed (the process then exits non-zero)."""
        self.history: deque[RoundStats] = deque(maxlen=HISTORY)
        self.stats = RoundStats(self.round, time.monotonic())
        self.aggregate = RoundAggregate(self.spec)
        self.contributed: set[str] = set()
        self.contributors: set[str] = set()
        """Every identity that ever had a contribution counted: each is owed the final
        weights (``final_wait_s``)."""
        self.final_delivered: set[str] = set()
        """Identities the final round or the final weights were sent to."""
        self.round_open = False
        self.max_payload = max_payload_bytes(self.spec)
        self.norm_bound = NormBound(config.clip_norm_ratio)
        self.links = Links(
            config.codec, config.policy, config.monitor, [t.numel for t in self.spec]
        )
        self.downlink = Downlink(self.spec, config.policy, config.seed)
        self.outer = OuterOptimizer(config.outer)
        self.admission = Admission(self)
        self.intake = Intake(self)
        self.rounds = Rounds(self)
        self._resume()
        self.weights_digest = weights_digest(self.weights)

    # ---- what the servicer and the server call -----------------------------------------

    def run(self) -> None:
        """Drive rounds (``coordinator/rounds.py``); meant for its own thread."""
        self.rounds.run()

    def stop(self) -> None:
        self.rounds.stop()

    def status(self, windows: bool = False) -> Status:
        """Who is connected and how, the recent rounds; ``windows`` adds raw link samples."""
        with self.cond:
            return build_status(self, windows)

    def write_status(self) -> None:
        """Status as JSON, atomically, for operators' scripts and the demo's summary."""
        if self.config.status_file is not None:
            write_text_atomic(self.config.status_file, serde.status_to_json(self.status()))

    # ---- persistence ---------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Write the closed round's state (the caller holds the lock)."""
        if self.config.checkpoint_dir is None:
            return
        checkpoint.save(
            self.config.checkpoint_dir,
            checkpoint.Checkpoint(
                round=self.round,
                spec_digest=self.digest,
                weights=self.weights,
                downlink_residual=self.downlink.residual_list(),
                outer_momentum=self.outer.state(),
            ),
        )

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
