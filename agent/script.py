"""A site run from a user's own training script: ``skyfed.Site`` (docs/own-loop.md).

The script keeps its loop, its data loader and its optimizer, and calls
:meth:`ScriptSite.step` after each optimizer step. Every ``local_steps`` calls is a phase
boundary: the site contributes ``start - now`` of the weights, puts ``start`` back and
applies the federation's update into the same parameters, in place, so the optimizer's
references stay valid. Everything between is ``agent start``'s own: the session loop
(``skyfed.agent.daemon``) on global rank 0, the SPMD steps every rank runs
(``skyfed.agent.site``), the codecs, error feedback, residual state, overlap and metrics.
Only the local phase differs: the script's steps instead of a Task's (:class:`ScriptTrainer`).

Each rank runs the federation on a thread of its own, and the two threads take turns over
the model (``skyfed.agent.handoff``): the script's thread waits at a boundary while the
federation's contributes and applies, and the federation's waits while the script trains.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from skyfed.agent import failure
from skyfed.agent.config import AgentConfig
from skyfed.agent.core import Steps, TrainerCore
from skyfed.agent.handoff import Handoff, Stopped
from skyfed.agent.parallelize import HSDP_DIMS, local_tensor
from skyfed.agent.site import RankGroup, Site
from skyfed.wire import metrics_problem

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 30.0
"""How long :meth:`ScriptSite.close` waits for the federation's thread to end."""
SCRIPT_OWNS = (
    "task",
    "shard",
    "num_shards",
    "dp",
    "tp",
    "dp_mode",
    "dp_shard",
    "device",
    "launcher",
    "threads",
)
"""``agent start`` options a script decides for itself (its model, data, layout, device)."""
PATH_OPTIONS = ("certs", "ca", "cert", "key", "state_dir", "report")


class SiteError(RuntimeError):
    """The site cannot go on: refused by the coordinator, no session for too long, a rank
    down. The message is one line that says why (what ``agent start`` prints)."""


class ScriptTrainer(TrainerCore):
    """The local phase is the script's: :meth:`train`, on the federation's thread, hands
    the model to the script and waits for its ``local_steps`` calls of :meth:`step`."""

    exchanges = ("delta",)  # the script's optimizer moves the weights: no gradient exchange

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        handoff: Handoff,
        *,
        local_steps: int,
        mesh: DeviceMesh | None,
        samples_per_step: int,
        seed: int,
        rank: int,
        world: int,
    ) -> None:
        super().__init__(
            model,
            optimizer,
            local_steps=local_steps,
            mesh=mesh,
            seed=seed,
            device=device_of(model),
            # The gradients are the script's (a user's DDP may keep them as views of its
            # buckets): a phase's delta takes memory of its own.
            reuse_gradients=False,
            rank=rank,
            world=world,
        )
        self.task_name = f"script:{type(model).__name__}"
        self.handoff = handoff
        self.samples_per_step = samples_per_step
        # One rank of each TP group counts its replica's samples (they share its batches).
        self._counts = (
            mesh is None
            or "tp" not in (mesh.mesh_dim_names or ())
            or (mesh["tp"].get_local_rank() == 0)
        )
        self._losses: list[torch.Tensor | float] = []
        self._samples = 0

    def _steps(self, settle: Callable[[], str | None]) -> Steps:
        settle()  # the script's first optimizer step may come at once
        self._losses, self._samples = [], 0
        self.handoff.to_script()
        return Steps(_finite(self._losses), self._samples * self._counts)

    def step(self, loss: torch.Tensor | float | None, samples: int | None) -> bool:
        """The script's optimizer step is done (on the script's thread): True while the
        federation goes on; at a phase boundary, after its exchange."""
        if self.handoff.ended:
            return self.handoff.wait_turn()
        if isinstance(loss, torch.Tensor):  # read at the boundary, not synced every step
            self._losses.append(loss.detach().float().mean())
        elif loss is not None:
            self._losses.append(float(loss))
        self._samples += self.samples_per_step if samples is None else samples
        self.stepped()
        if self.local_step < self.local_steps:
            return True
        return self.handoff.to_federation()


class ScriptSite:
    """Join a federation from your own training loop; ``skyfed.Site`` (docs/own-loop.md).

    Build it once the model and its optimizer exist (after any DDP, FSDP2 or TP wrapping,
    and after ``torch.distributed`` is initialised, on every rank of a multi-process
    script), then call :meth:`step` after each ``optimizer.step()``::

        with skyfed.Site(model, optimizer, cloud="aws", certs="certs",
                         coordinator="coord:7443", local_steps=50) as site:
            for batch in loader:
                loss = model(batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if not site.step(loss):
                    break  # the federation finished: the model holds its final weights

    The constructor returns once the site has joined: the model then holds the
    federation's weights (the coordinator's, loaded into its parameters in place).

    Args:
        model: the model the script trains, as it is wrapped (``DistributedDataParallel``
            and ``torch.compile`` are looked through); its parameter names, shapes and
            dtypes must be the federation's (the coordinator's task builds the same model).
        optimizer: the script's optimizer over ``model``'s parameters; it stays the
            script's (its state is never reset by an exchange).
        cloud: this site's cloud, as its certificate's identity says.
        coordinator: ``HOST:PORT`` of the coordinator; replicas comma-separated.
        certs: a ``certs`` directory (``ca.crt``, ``<name>.crt``, ``<name>.key``); or give
            ``ca``, ``cert`` and ``key`` as options.
        name: this site's name (default ``<cloud>-1``), as its certificate says.
        local_steps: calls of :meth:`step` per phase; every ``local_steps``-th is a
            boundary where the site exchanges ``start - now`` for the federation's update.
        rounds: stop after this many applied rounds (0: until the coordinator says final).
        mesh: the site's ``DeviceMesh`` when the model is tensor-parallel (a "tp"
            dimension, with "dp" or HSDP's "dp_replicate"/"dp_shard"); None: the site is
            one process, or every rank of the default process group is a data-parallel
            replica (DDP, FSDP2 over the world).
        samples_per_step: what one :meth:`step` counts when it is not told ``samples``:
            the samples one replica trained on per step (the contribution's weight in the
            mean is its samples, summed over the site's replicas).
        state_dir: where the site keeps its error-feedback residuals across restarts (and
            the reason it last stopped); None: nothing kept.
        metrics_listen: ``HOST:PORT`` of the site's ``/metrics`` port on global rank 0
            ("": none).
        report: a JSON file rewritten after every applied round (round, weights digest,
            bytes, loss).
        seed: seeds the uplink's stochastic rounding (with the site's name).
        **options: any other field of ``agent start``'s configuration
            (docs/configuration.md): ``give_up_after_s``, ``max_streams``,
            ``reconnect_max_s``, ``server_name``, ``ca``, ``cert``, ``key``... Those the
            script decides itself (task, data shard, layout, device, launcher) are refused.

    Raises:
        SiteError: the site could not join (refused, no session within
            ``give_up_after_s``, a rank down); the message says why, in one line.
        ValueError: an option out of its bounds, one the script decides itself, or a
            certificate or key that is missing or not a pair.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        cloud: str,
        coordinator: str = "localhost:7443",
        certs: str | Path | None = None,
        name: str = "",
        local_steps: int = 4,
        rounds: int = 0,
        mesh: DeviceMesh | None = None,
        samples_per_step: int = 1,
        state_dir: str | Path | None = None,
        metrics_listen: str = "",
        report: str | Path | None = None,
        seed: int = 0,
        **options: Any,
    ) -> None:
        config = script_config(
            cloud=cloud,
            coordinator=coordinator,
            certs=certs,
            name=name,
            local_steps=local_steps,
            rounds=rounds,
            state_dir=state_dir,
            metrics_listen=metrics_listen,
            report=report,
            seed=seed,
            **options,
        )
        if samples_per_step < 1:
            raise ValueError(f"skyfed.Site samples_per_step={samples_per_step} must be >= 1")
        rank, world = _rank_and_world(mesh)
        self._handoff = Handoff()
        self._trainer = ScriptTrainer(
            unwrapped(model),
            optimizer,
            self._handoff,
            local_steps=config.local_steps,
            mesh=mesh,
            samples_per_step=samples_per_step,
            seed=config.seed,
            rank=rank,
            world=world,
        )
        self._site = Site(
            self._trainer,
            _control_group() if world > 1 else None,
            sender=config.name,
            state_dir=config.state_dir if rank == 0 else None,
            gpu_every_steps=config.gpu_every_steps,
            gpu_warn_c=config.gpu_warn_c,
        )
        from skyfed.agent.daemon import Agent

        self._agent = Agent(config, self._site) if rank == 0 else None
        self._closed = False
        self._thread = threading.Thread(target=self._federate, name="skyfed-site", daemon=True)
        self._thread.start()
        self._finished = not self._handoff.wait_turn()

    # ---- what the script calls -----------------------------------------------------------

    def step(self, loss: torch.Tensor | float | None = None, samples: int | None = None) -> bool:
        """Call after each ``optimizer.step()``, on every rank.

        Every ``local_steps``-th call is a phase boundary: it returns once the site has
        contributed the phase and applied the federation's update into the model's
        parameters (with overlap, the previous round's; docs/wan.md#overlap). A round that
        closed without this phase, or a contribution refused as late, leaves it in the
        site's error-feedback residual: sent with a later round, not lost.

        Args:
            loss: this step's training loss (a tensor is read once per phase, not per
                step); the phase's mean is what the site reports. None: not known.
            samples: the samples this rank's replica trained on in this step (default
                ``samples_per_step``).

        Returns:
            True while the federation goes on; False once it has finished, the model then
            holding the federation's final weights (every later call returns False).

        Raises:
            SiteError: the site cannot go on (the same on every later call).
        """
        if self._closed:
            raise SiteError("skyfed.Site.step() after close()")
        if self._finished:
            return False
        going = self._trainer.step(loss, samples)
        self._finished = not going
        return going

    def report(self, metrics: Mapping[str, float]) -> None:
        """Named metrics of the script's own evaluation (``{"accuracy": 0.91}``): the
        site's next contribution carries them to the coordinator, whose status,
        Prometheus metrics, ``rounds.jsonl`` and run report show them. At most 16, each
        name printable with no space (64 characters at most), each value finite.
        Global rank 0's reach the coordinator; other ranks' are checked, then dropped.

        Raises:
            ValueError: a name or value the wire would refuse (nothing is reported).
        """
        values = {name: _number(value) for name, value in metrics.items()}
        problem = metrics_problem(values)
        if problem is not None:
            raise ValueError(f"skyfed.Site.report: {problem}")
        if self._agent is not None:
            self._agent.report(values)

    @property
    def finished(self) -> bool:
        """The federation has finished; the model holds its final weights."""
        return self._finished

    def close(self, failed: str | None = None) -> None:
        """Leave the federation: the federation's thread ends, the metrics port closes.
        Every rank calls it (a ``with`` block does). Steps since the last boundary are
        dropped, as a stopped ``agent start`` drops them; the residual state stays in
        ``state_dir`` for the next start. ``failed``: the script's error in one line, told
        to the coordinator (its status shows the site down, saying so). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._handoff.close(failed)
        if self._agent is not None:
            self._agent.stop()
        self._thread.join(CLOSE_WAIT_S)
        if self._thread.is_alive():
            log.warning("[Agent.Script] the federation's thread has not ended; leaving it")

    def __enter__(self) -> ScriptSite:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        failed = exc is not None and not isinstance(exc, KeyboardInterrupt | SystemExit)
        self.close(failure.one_line(exc) if failed and exc is not None else None)

    # ---- the federation's thread ---------------------------------------------------------

    def _federate(self) -> None:
        device = self._trainer.device
        if device.type == "cuda":  # the current device is per thread
            torch.cuda.set_device(device)
        error: BaseException | None = None
        try:
            if self._agent is not None:
                self._lead(self._agent)
            else:
                reason = self._site.follow()
                if reason is not None:
                    error = SiteError(reason)
        except Stopped:
            pass
        except BaseException as exc:
            error = exc if isinstance(exc, SiteError) else SiteError(_why(exc))
            log.debug("[Agent.Script] the federation's thread ended", exc_info=exc)
        self._handoff.end(error)

    def _lead(self, agent: Any) -> None:
        """Rank 0: the session loop; then release ranks 1.. from following it."""
        from skyfed.agent.launch import serve_session

        try:
            serve_session(agent, say=log.info)
        except BaseException as exc:
            if not failure.lost_peer(exc):
                self._release(_why(exc))
            raise
        self._release(None)

    def _release(self, reason: str | None) -> None:
        """Tell ranks 1.. that the site ends (``reason``: why; None: finished). Not after a
        close: each rank's own ``close()`` ends its own thread, and they follow no more."""
        if self._handoff.closed:
            return
        try:
            self._site.stop(reason)
        except Exception as exc:  # a rank already gone: it does not follow any more
            log.debug("[Agent.Script] ranks not released: %s", exc)


def script_config(**fields: Any) -> AgentConfig:
    """``agent start``'s configuration for a script's site: ``ValueError`` for an option
    the script decides itself or one that does not exist."""
    known = {f.name for f in dataclasses.fields(AgentConfig)}
    for option in fields:
        if option in SCRIPT_OWNS:
            raise ValueError(
                f"skyfed.Site option {option!r} is the script's own (its model, data, "
                "layout and device): leave it out"
            )
        if option not in known:
            raise ValueError(
                f"skyfed.Site has no option {option!r} (agent start's options: "
                "docs/configuration.md)"
            )
    for option in PATH_OPTIONS:
        if isinstance(fields.get(option), str):
            fields[option] = Path(fields[option])
    config = AgentConfig(**fields)
    from skyfed.agent.preflight import check_certificates

    check_certificates(config)  # one line now, not a failed handshake later
    return config


def unwrapped(model: nn.Module) -> nn.Module:
    """The module whose parameter names are the model's own: through DDP's ``module``
    and ``torch.compile``'s ``_orig_mod`` (FSDP2 and TP keep the names)."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod  # type: ignore[assignment]
        else:
            return model


def device_of(model: nn.Module) -> torch.device:
    """Where the model's parameters are (their local shards'), CPU if it has none."""
    for p in model.parameters():
        return local_tensor(p).device
    return torch.device("cpu")


def _rank_and_world(mesh: DeviceMesh | None) -> tuple[int, int]:
    """This process's rank in the site and the site's ranks: the default process group's."""
    names = set(mesh.mesh_dim_names or ()) if mesh is not None else {"dp", "tp"}
    if "tp" not in names or not ("dp" in names or set(HSDP_DIMS) <= names):
        raise ValueError(
            f"skyfed.Site: the mesh's dimensions are {sorted(names)}; name them ('dp', 'tp') "
            "(or HSDP's ('dp_replicate', 'dp_shard', 'tp')), as skyfed.agent.parallelize."
            "build_mesh does"
        )
    if not (dist.is_available() and dist.is_initialized()):
        if mesh is not None:
            raise ValueError("skyfed.Site: a mesh needs torch.distributed initialised")
        return 0, 1
    rank, world = dist.get_rank(), dist.get_world_size()
    if mesh is not None and mesh.size() != world:
        raise ValueError(
            f"skyfed.Site: the mesh has {mesh.size()} ranks, the default process group "
            f"{world}: the site is every rank of the script (give the whole mesh)"
        )
    return rank, world


def _control_group() -> RankGroup:
    """The site's control plane: a Gloo group of every rank, CPU only, with a long timeout
    (ranks 1.. wait there while rank 0 waits on the WAN; ``skyfed.agent.ranks``)."""
    from skyfed.agent.ranks import CONTROL_TIMEOUT, Ranks

    return Ranks(dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT))


def _why(exc: BaseException) -> str:
    """One line a person acts on, as ``agent start`` says it."""
    from skyfed.agent.daemon import SiteDown
    from skyfed.agent.link import LinkClosed

    if isinstance(exc, LinkClosed):
        return f"refused by the coordinator: {exc}"
    if isinstance(exc, TimeoutError | SiteDown):
        return str(exc)
    return failure.one_line(exc)


def _finite(losses: list[torch.Tensor | float]) -> list[float]:
    """The phase's losses as numbers, its tensors read in one transfer; NaN and inf left out."""
    tensors = [x for x in losses if isinstance(x, torch.Tensor)]
    numbers = [x for x in losses if not isinstance(x, torch.Tensor)]
    if tensors:
        numbers += torch.stack([t.to(tensors[0].device) for t in tensors]).tolist()
    return [x for x in numbers if math.isfinite(x)]


def _number(value: Any) -> Any:
    """A metric's value as a float where it is a number (a one-element tensor too)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
