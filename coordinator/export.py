"""The trained model as a plain ``state_dict`` a user loads without skyfed's internals.

``model.pt`` holds ``model.state_dict()`` of the task's model with the federation's weights
loaded (parameters by name, plus the buffers the model builds itself), so
``task.build_model(0).load_state_dict(torch.load("model.pt"))`` works; ``model.json``
beside it says which round, weights digest and task it is (docs/operations.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from skyfed.coordinator import checkpoint
from skyfed.files import write_atomic, write_text_atomic
from skyfed.fingerprint import model_spec, spec_digest, weights_digest
from skyfed.tasks import load_task


def export_weights(
    weights: list[torch.Tensor], out: Path, *, task: str, round_: int, seed: int = 0
) -> dict[str, Any]:
    """Write ``out`` (the state_dict) and ``out`` with ``.json`` (its metadata); returns it.

    ``weights`` are the federation's canonical tensors in ``named_parameters()`` order.
    """
    model = load_task(task).build_model(seed)
    named = list(model.named_parameters())
    if len(named) != len(weights):
        raise ValueError(f"{len(weights)} tensors for a model of {len(named)} parameters ({task})")
    with torch.no_grad():
        for (name, param), w in zip(named, weights, strict=True):
            if tuple(param.shape) != tuple(w.shape):
                raise ValueError(f"{name}: shape {list(w.shape)}, the model's {list(param.shape)}")
            param.copy_(w.to(param.dtype))
    meta = {
        "round": round_,
        "weights_digest": weights_digest(weights),
        "spec_digest": spec_digest(model_spec(named)),
        "task": task,
        "parameters": len(named),
        "elements": sum(p.numel() for _, p in named),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda f: torch.save(model.state_dict(), f))
    write_text_atomic(meta_path(out), json.dumps(meta, indent=1))
    return meta


def export_checkpoint(checkpoint_dir: Path, out: Path, *, task: str) -> dict[str, Any]:
    """Export the latest checkpoint in ``checkpoint_dir``; a clear error if there is none
    or it is another model's."""
    ckpt = checkpoint.load(checkpoint_dir)
    if ckpt is None:
        raise FileNotFoundError(
            f"no checkpoint in {checkpoint_dir} ({checkpoint.PREFIX}*{checkpoint.SUFFIX})"
        )
    model = load_task(task).build_model(0)
    digest = spec_digest(model_spec(list(model.named_parameters())))
    if ckpt.spec_digest != digest:
        raise ValueError(
            f"checkpoint in {checkpoint_dir} is for model {ckpt.spec_digest}; task {task} "
            f"builds {digest} (pass the run's --task)"
        )
    return export_weights(ckpt.weights, out, task=task, round_=ckpt.round)


def meta_path(out: Path) -> Path:
    return out.with_suffix(".json")
