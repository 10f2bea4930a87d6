"""A serving coordinator's parts, wired together around the one lock they share.

Each part owns its state: the model (``coordinator/model.py``: the weights and what a
round carries into the next), admission (the members' sessions), the intake
(contributions arriving), rounds (the open round, its close and broadcast, checkpoints,
the history), links (each link's monitor, codec and streams). One condition variable,
``cond``, guards all of them; every part takes it, and the round driver waits on it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from skyfed.coordinator import checkpoint
from skyfed.coordinator.admission import Admission
from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.evaluate import EvalResult
from skyfed.coordinator.inbound import Intake
from skyfed.coordinator.links import Links
from skyfed.coordinator.model import Model, RoundRules
from skyfed.coordinator.payload_pool import PayloadPool
from skyfed.coordinator.rounds import Rounds
from skyfed.coordinator.snapshot import build_status
from skyfed.files import write_text_atomic
from skyfed.proto import serde
from skyfed.status import Status
from skyfed.wire import max_payload_bytes, raw_bytes

if TYPE_CHECKING:
    from skyfed.coordinator.replicas.followers import Followers

log = logging.getLogger(__name__)


def round_rules(config: CoordinatorConfig) -> RoundRules:
    """The round's rules as the coordinator's configuration sets them."""
    return RoundRules(
        max_samples=config.robustness.max_samples,
        clip_norm_ratio=config.robustness.clip_norm_ratio,
        outer=config.rounds.outer,
        policy=config.policy,
        seed=config.seed,
        stage_memory=config.checkpoints.stage_memory,
        spill_dir=config.spill_dir,
    )


class Federation:
    """The coordinator's parts and their one lock."""

    def __init__(self, config: CoordinatorConfig, model: Model, term: int = 0) -> None:
        """``model``: the federation's (``coordinator/server.py`` builds it from the task,
        resumed from ``checkpoint_dir``; an elected standby replica brings the one it kept
        in step with the leader, docs/failover.md). ``term``: the leader's, on every
        message that changes an agent's state (0: one coordinator, no replicas)."""
        self.config = config
        self.term = term
        self.replication: Followers | None = None
        """The standbys following this leader (``coordinator/replicas/followers.py``);
        None: one coordinator."""
        self.cond = threading.Condition()
        self.started_at = time.monotonic()
        self.stopping = False
        self.failure: Exception | None = None
        """What ended the round driver, if it failed (the process then exits non-zero)."""
        self.refusals: Counter[str] = Counter()
        """Refused peers and sessions by gRPC status name, for operators (status, metrics)."""
        self.evaluation: EvalResult | None = None
        """The last held-out evaluation, set by the observer's evaluator."""
        if config.checkpoints.stage_dir is None and config.spill_dir is not None:
            # The coordinator's own directory stages what arrives past stage_memory
            # (an operator's stage_dir is checked at start); without it, held in memory.
            with contextlib.suppress(OSError):
                config.spill_dir.mkdir(parents=True, exist_ok=True)
        self.payloads = PayloadPool()
        """The payloads' memory, kept mapped from round to round (reused once nothing holds
        a payload): the uplinks' and the downlink's."""
        model.downlink.feedback.memory = self.payloads.take
        self.model = model
        self.max_payload = max_payload_bytes(self.model.spec)
        self.links = Links(
            config.codec,
            config.policy,
            config.monitor,
            [t.numel for t in self.model.spec],
            config.streams,
            rate_mbit=config.transport.link_rate_mbit,
        )
        self.admission = Admission(self)
        self.intake = Intake(self)
        self.rounds = Rounds(self)

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
        if self.config.metrics.status_file is not None:
            write_text_atomic(self.config.metrics.status_file, serde.status_to_json(self.status()))

    def refused(self, code: str) -> None:
        """Count a refused peer or session by its gRPC status name (``UNAUTHENTICATED``);
        in-band refusals of a contribution count in ``intake``."""
        with self.cond:
            self.refusals[code] += 1


def resume(model: Model, directory: Path | None) -> None:
    """Resume ``model`` from the newest checkpoint in ``directory`` that verifies, if
    there is one (a standby replica starts from its own the same way)."""
    if directory is None:
        return
    checkpoint.clean_stale(directory)
    # Weights, downlink residual and outer momentum: up to three float32 model copies.
    checkpoint.check_room(directory, 3 * raw_bytes(model.spec))
    ckpt = checkpoint.load(directory)
    if ckpt is None:
        return
    if ckpt.spec_digest != model.spec_digest:
        raise RuntimeError(
            f"checkpoint in {directory} is for model {ckpt.spec_digest}, "
            f"this federation trains {model.spec_digest}"
        )
    model.resume(ckpt)
    log.info("[Coordinator.Resume] round=%d from=%s", model.round, directory)
