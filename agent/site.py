"""A site's local ranks driven as one: rank 0 calls a step, every rank runs it.

The daemon (the gRPC session) lives on rank 0 only. Each public method of :class:`Site`
is one SPMD step: on rank 0 it first broadcasts the step's name and its small arguments
over the control group, then runs the step (``self._lead(self._train)``); ranks 1.. sit
in :meth:`Site.follow` and run the same step with the same arguments. Collectives inside
a step (TP forward/backward, FSDP2's gathers, the gather of compressed payloads, the
all-gather of weights for the digest) therefore always line up. With one rank (``Solo``)
nothing is broadcast and nothing is gathered.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from skyfed import failpoints
from skyfed.agent import failure, state
from skyfed.agent.core import LocalResult, TrainerCore
from skyfed.agent.gpus import GpuBoard, GpuWatch
from skyfed.agent.handoff import Stopped
from skyfed.agent.uplink import Uplink
from skyfed.compression import Codec, decode_payload, rounding_seed
from skyfed.compression.spec import codec_from_spec
from skyfed.fingerprint import TensorInfo, spec_digest
from skyfed.wire import Payload

log = logging.getLogger(__name__)

LOST_PEER_WAIT_S = 3.0
"""How long rank 0, having lost a peer, waits for the reason the failed rank or the
supervisor gives (``skyfed.agent.failure``) before it gives its own."""


class RankGroup(Protocol):
    """The control plane between a site's ranks: small Python objects, CPU only."""

    rank: int
    world: int

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        ...

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order, on rank 0 (``[]`` elsewhere)."""
        ...


class Solo:
    """The group of one rank: an agent with ``tp=1`` on CPU runs in a single process."""

    rank = 0
    world = 1

    def broadcast(self, obj: Any) -> Any:
        return obj

    def gather(self, obj: Any) -> list[Any]:
        return [obj]


class Site:
    """What the daemon trains with: the model (maybe sharded), its uplink, its ranks.

    ``state_dir``: where the site keeps its residuals across restarts (``persist``,
    ``restore``) and its last failure (``down``); None: nothing is kept.
    ``gpu_every_steps`` and ``gpu_warn_c``: GPU telemetry (``skyfed.agent.gpus``).
    """

    def __init__(
        self,
        trainer: TrainerCore,
        group: RankGroup | None = None,
        *,
        sender: str = "",
        state_dir: Path | None = None,
        gpu_every_steps: int = 10,
        gpu_warn_c: float = 85.0,
    ) -> None:
        self.trainer = trainer
        self.group = group or Solo()
        self.sender = sender
        """The agent's name: with the trainer's seed, it seeds stochastic rounding."""
        self.state_dir = state_dir
        self.uplink = Uplink(trainer.spec, trainer.shards)
        self.gpu = GpuWatch(trainer.device, trainer.rank, gpu_every_steps)
        trainer.after_step = self.gpu.step
        self.gpus = GpuBoard(gpu_warn_c)
        """The site's GPUs as rank 0 last heard of them (every round)."""
        self._result: LocalResult | None = None
        self._codec: tuple[int, str, Codec] | None = None
        # The steps by the names rank 0 broadcasts (see :meth:`_lead`), for :meth:`follow`.
        self._steps: dict[str, Callable[..., Any]] = {
            step.__name__: step
            for step in (
                self._train,
                self._set_exchange,
                self._contribution,
                self._keep,
                self._acked,
                self._refused,
                self._apply,
                self._load,
                self._digest,
                self._persist,
                self._restore,
            )
        }

    @property
    def spec(self) -> list[TensorInfo]:
        return self.trainer.spec

    @property
    def layout(self) -> tuple[int, int]:
        """``(dp, tp)``: data-parallel replicas, and tensor-parallel ranks in each."""
        dp = self.trainer.dp
        return dp, self.group.world // dp

    # ---- steps, called on rank 0 ---------------------------------------------------------

    def train(self) -> LocalResult:
        """Local steps; rank 0 gets the loss (the mean over the ranks) and cost (its
        ``delta`` stays with the site)."""
        return self._lead(self._train)

    def set_exchange(self, exchange: str, lr: float, momentum: float) -> None:
        """What every rank's ``train`` computes from now on (the coordinator's choice)."""
        self._lead(self._set_exchange, exchange, lr, momentum)

    def contribution(self, round: int, codec: str) -> list[Payload]:
        """Every rank encodes its own shards; rank 0 gets all payloads, in tensor order."""
        return self._lead(self._contribution, round, codec)

    def stream_contribution(self, round: int, codec: str) -> Iterator[Payload]:
        """:meth:`contribution`'s payloads; with one rank, each as soon as it is encoded,
        so its chunks can leave while later tensors are encoded (docs/scale.md, Streams).
        The caller exhausts it."""
        if self.group.world > 1:  # the ranks' payloads meet in one gather
            return iter(self.contribution(round, codec))
        return self._stream(round, codec)

    def _stream(self, round: int, codec: str) -> Iterator[Payload]:
        built = self.codec(round, codec)
        yield from self.uplink.stream(round, built, self._take_delta())
        if self.trainer.momentum is not None:  # only gradient exchange needs it decoded
            self.trainer.sent(self.uplink.sent(round), built)

    def keep(self) -> None:
        """The round closed while we trained: keep the delta in the residuals."""
        self._lead(self._keep)

    def acked(self, round: int) -> None:
        self._lead(self._acked, round)

    def refused(self, round: int) -> None:
        self._lead(self._refused, round)

    def apply(self, round: int, datas: list[bytes]) -> None:
        """Apply the aggregate: the encoded payloads go to every rank, each decodes them
        straight into its slices. Raises ``PayloadError`` for a payload that does not
        decode (checked on rank 0 first when there are other ranks)."""
        self._lead(self._apply, round, self._checked(datas))

    @property
    def solo(self) -> bool:
        """One rank: steps need no broadcast, and an aggregate can be applied payload by
        payload as it arrives (:meth:`apply_payload`)."""
        return self.group.world == 1

    def apply_payload(self, round: int, tensor: int, data: bytes) -> None:
        """Decode one payload of ``round``'s aggregate into the weights now, on a solo site
        (the first begins the apply; :meth:`finish_apply` ends it once every tensor is in):
        on a WAN the apply then runs while the rest of the broadcast is still in flight
        (docs/wan.md). ``PayloadError`` leaves the weights partly updated: a resync."""
        if not self.solo:
            raise RuntimeError("payload-by-payload apply is for a site of one rank")
        if not self.trainer.applying:
            self.trainer.start_apply()
        self.trainer.apply_payload(tensor, data)

    def finish_apply(self, round: int) -> None:
        """Every payload of ``round``'s aggregate applied by :meth:`apply_payload`."""
        self.trainer.finish_apply()
        self._drift(round)

    @property
    def applying(self) -> bool:
        """An aggregate partly applied (:meth:`apply_payload`): the weights are neither
        the last round's nor this one's until :meth:`finish_apply`."""
        return self.trainer.applying

    def load(self, datas: list[bytes]) -> None:
        """Replace the weights by the coordinator's (a resync); ``PayloadError`` as apply."""
        self._lead(self._load, self._checked(datas))

    def _checked(self, datas: list[bytes]) -> list[bytes]:
        """With other ranks, decode each payload here first: a bad one is refused before
        any rank changes its weights (alone, a failed apply is followed by a resync).
        They then cross ranks pickled: an assembled payload is a ``memoryview``
        (``proto/chunks.py``), which does not pickle, so each becomes ``bytes``."""
        if self.group.world == 1:
            return datas
        for data, info in zip(datas, self.spec, strict=True):
            decode_payload(data, shape=info.shape)
        return [bytes(data) for data in datas]

    def digest(self) -> str:
        """sha256 of the full logical weights (``""`` on ranks other than 0)."""
        return self._lead(self._digest)

    def persist(self, round: int) -> None:
        """Keep the residuals (every rank's slices, as logical tensors) in the state
        directory, after ``round`` was applied; nothing without one."""
        if self.state_dir is not None:
            self._lead(self._persist, round)

    def restore(self) -> None:
        """Take the residuals the state directory kept, resharded onto this layout."""
        if self.state_dir is None:
            return
        kept = state.load(self.state_dir, self.spec)
        if kept is None:
            return
        index = {info.name: i for i, info in enumerate(self.spec)}
        self._lead(self._restore, {index[name]: t for name, t in kept.residuals.items()})
        dp, tp = self.layout
        log.info(
            "[Agent.State] residuals of %d tensors from round %d, resharded onto dp=%d tp=%d",
            len(kept.residuals),
            kept.round,
            dp,
            tp,
        )

    def down(self, exc: BaseException) -> str | None:
        """Rank 0: why the site goes down with ``exc``, said once (``failure``) and kept in
        the state directory; None for a plain stop (a SIGTERM with no failure behind it)."""
        store = getattr(self.group, "store", None)
        dp, tp = self.layout
        reason: str | None
        if isinstance(exc, Stopped) and exc.reason is not None:
            reason = f"{failure.where(0, dp, tp)}: its script failed: {exc.reason}"
            failure.report(store, 0, reason)
            reason = failure.announce(store, reason)
        elif isinstance(exc, SystemExit | KeyboardInterrupt | Stopped):  # a plain stop
            reason = failure.announced(store)
        elif failure.lost_peer(exc):
            log.debug("[Agent.Site] lost a peer", exc_info=exc)
            own = f"{failure.where(0, dp, tp)} lost a peer ({failure.one_line(exc)})"
            reason = (
                failure.announced(store, LOST_PEER_WAIT_S)
                or failure.reported(store, self.group.world)
                or own
            )
            reason = failure.announce(store, reason)
        else:
            log.debug("[Agent.Site] failed", exc_info=exc)
            reason = f"{failure.where(0, dp, tp)}: {failure.one_line(exc)}"
            failure.report(store, 0, reason)
            reason = failure.announce(store, reason)
        if reason is not None:
            failure.keep(self.state_dir, reason)
        return reason

    def stop(self, reason: str | None = None) -> None:
        """Release the other ranks from :meth:`follow`, which returns ``reason``: None,
        the federation finished (their processes then exit 0); else why the site ends."""
        if self.group.world > 1 and self.group.rank == 0:
            self.group.broadcast(("stop", (reason,)))

    def follow(self) -> str | None:
        """Ranks 1..: run the steps rank 0 announces until it says stop; why it stopped
        (None: the federation finished)."""
        while True:
            name, args = self.group.broadcast(None)
            if name == "stop":
                return args[0] if args else None
            self._steps[name](*args)

    def _lead(self, step: Callable[..., Any], *args: Any, **local: Any) -> Any:
        """Run ``step`` here, on rank 0, after telling the other ranks to run it too."""
        if self.group.world > 1:
            self.group.broadcast((step.__name__, args))
        return step(*args, **local)

    def codec(self, round: int, spec: str) -> Codec:
        """This rank's codec for its contribution to ``round``, built once per round (its
        rounding seed is the round's); ``ValueError`` if ``spec`` names one it cannot build."""
        if self._codec is None or self._codec[:2] != (round, spec):
            seed = rounding_seed(self.trainer.seed, self.sender, round, self.trainer.rank)
            self._codec = (round, spec, codec_from_spec(spec, seed))
        return self._codec[2]

    # ---- the steps, on every rank --------------------------------------------------------

    def _train(self) -> LocalResult:
        result = self._result = self.trainer.train()
        heard = self.group.gather((result.loss, result.samples, self.gpu.last))
        if self.group.rank == 0:
            losses = [loss for loss, _, _ in heard if math.isfinite(loss)]
            result.loss = sum(losses) / len(losses) if losses else math.nan
            result.samples = sum(samples for _, samples, _ in heard)
            self.gpus.update([reading for _, _, reading in heard], self.gpu.why_not)
        return result

    def _set_exchange(self, exchange: str, lr: float, momentum: float) -> None:
        self.trainer.set_exchange(exchange, lr, momentum)

    def _contribution(self, round: int, codec: str) -> list[Payload]:
        built = self.codec(round, codec)  # the coordinator's name, maybe with parameters
        mine = self.uplink.encode(round, built, self._take_delta())
        if self.trainer.momentum is not None:  # only gradient exchange needs it decoded
            self.trainer.sent(self.uplink.sent(round), built)
        if self.group.world > 1:
            # Payloads cross ranks pickled, and the codecs hand out memoryviews of their
            # reused buffers (docs/codecs-performance.md), which do not pickle.
            mine = [dataclasses.replace(p, data=bytes(p.data)) for p in mine]
        gathered = self.group.gather(mine)
        payloads = [p for per_rank in gathered for p in per_rank]
        return sorted(payloads, key=lambda p: (p.tensor, p.shard[1] if p.shard else 0))

    def _keep(self) -> None:
        self.uplink.keep(self._take_delta())

    def _acked(self, round: int) -> None:
        self.uplink.acked(round)

    def _refused(self, round: int) -> None:
        self.uplink.refused(round)

    def _apply(self, round: int, datas: list[bytes]) -> None:
        self.trainer.apply_encoded(datas)
        self._drift(round)

    def _drift(self, round: int) -> None:
        """A test's fault (``SKYFED_FAILPOINT=drift@<round>``, skyfed/failpoints.py): the
        weights move off the coordinator's after this round's aggregate, as a bad decode
        or a bit flip would; the daemon's digest check must catch it."""
        if failpoints.corrupts("drift", round):
            nudge = [torch.zeros(info.shape) for info in self.spec]
            nudge[0].view(-1)[0] = 1e-3
            self.trainer.apply(nudge)

    def _load(self, datas: list[bytes]) -> None:
        self.trainer.load_encoded(datas)

    def _digest(self) -> str:
        return self.trainer.digest()

    def _persist(self, round: int) -> None:
        gathered = self.group.gather(self.uplink.slices())
        if self.group.rank != 0 or self.state_dir is None:
            return
        residuals = state.assemble(self.spec, (s for per_rank in gathered for s in per_rank))
        state.save(self.state_dir, state.SiteState(round, spec_digest(self.spec), residuals))

    def _restore(self, residuals: dict[int, torch.Tensor]) -> None:
        self.uplink.restore(residuals, self.trainer.owned)

    def _take_delta(self) -> list[torch.Tensor | None]:
        if self._result is None:
            raise RuntimeError("no local delta: train() must precede contribution() or keep()")
        delta, self._result = self._result.delta, None
        return delta
