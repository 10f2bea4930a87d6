"""Tensor-parallel plans as tasks give them, resolved and checked before any rank trains.

A task's ``tp_plan()`` maps module paths (nested, with ``*`` for any one path component:
``layers.*.mlp.up_proj``) to torch's ``ParallelStyle`` objects or to Hugging Face's style
names, so a ``transformers`` model's own ``base_model_tp_plan`` maps straight across.
:func:`resolve` turns names into torch styles; :func:`check` refuses, in one line naming
the module and why, what ``parallelize_module`` would fail on deep in its ranks (a style
on a module it cannot shard: GPT-2's ``Conv1D``) or would shard wrongly (a fused q/k/v
projection split column-wise, a head count the TP degree does not divide).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from torch import nn

HF_STYLES = {
    "colwise": ("colwise", {}),
    "rowwise": ("rowwise", {}),
    "colwise_rep": ("colwise", {"output": "replicate"}),
    "colwise_gather_output": ("colwise", {"output": "replicate"}),
    "embedding_rowwise": ("rowwise", {"input": "replicate"}),
    "embedding_colwise": ("colwise", {"output": "replicate"}),
    "replicate": (None, {}),
}
"""Hugging Face's style names that have a torch ``parallelize_module`` equivalent (None:
the module stays whole on every rank). Any other (packed, sequence-parallel, expert,
local styles) is refused by name."""

SHARDABLE = (nn.Linear, nn.Embedding)
"""What torch's ``ColwiseParallel`` and ``RowwiseParallel`` shard."""

FUSED_NAMES = ("qkv", "c_attn", "gate_up", "w13", "query_key_value")
"""Module names of fused projections: split column-wise, their q, k and v (or gate and
up) would be cut across, not each split by heads."""


class PlanError(ValueError):
    """A TP plan that cannot run on this model at this TP degree; says which entry and why."""


def resolve(plan: Mapping[str, Any]) -> dict[str, Any]:
    """``plan`` with Hugging Face style names replaced by torch styles (entries whose
    style is ``replicate`` dropped: those modules stay whole)."""
    out = {}
    for path, style in plan.items():
        if not isinstance(style, str):
            out[path] = style
            continue
        if style not in HF_STYLES:
            known = ", ".join(sorted(HF_STYLES))
            raise PlanError(
                f"TP plan entry {path!r}: style {style!r} has no torch equivalent here "
                f"(supported: {known}); give that module no TP"
            )
        kind, layouts = HF_STYLES[style]
        if kind is not None:
            out[path] = _torch_style(kind, layouts)
    return out


def _torch_style(kind: str, layouts: dict[str, str]) -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    options: dict[str, Any] = {}
    if layouts.get("output") == "replicate":
        options["output_layouts"] = Replicate()
    if layouts.get("input") == "replicate":
        options["input_layouts"] = Replicate()
    return (ColwiseParallel if kind == "colwise" else RowwiseParallel)(**options)


def matches(model: nn.Module, pattern: str) -> list[tuple[str, nn.Module]]:
    """The modules ``pattern`` names: a dotted path where ``*`` stands for one component."""
    parts = pattern.split(".")
    return [
        (name, module)
        for name, module in model.named_modules()
        if name
        and len(name.split(".")) == len(parts)
        and all(fnmatch.fnmatchcase(n, p) for n, p in zip(name.split("."), parts, strict=True))
    ]


def check(model: nn.Module, plan: Mapping[str, Any], tp: int) -> None:
    """Raise :class:`PlanError` for the first entry of ``plan`` (torch styles) that cannot
    shard ``model`` over ``tp`` ranks; also the model's attention heads (a Hugging Face
    config's ``num_attention_heads`` and ``num_key_value_heads``) must divide by ``tp``."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if tp > 1 and not plan:
        raise PlanError(f"tp={tp} needs a task with a tp_plan(); this one has none (use tp=1)")
    for path, style in plan.items():
        found = matches(model, path)
        if not found:
            raise PlanError(
                f"the task's tp_plan() names module {path!r}, which the model lacks; fix the "
                "plan or run with --tp 1"
            )
        if not isinstance(style, ColwiseParallel | RowwiseParallel):
            continue  # another torch style: parallelize_module's own checks apply
        kind = "ColwiseParallel" if isinstance(style, ColwiseParallel) else "RowwiseParallel"
        for name, module in found:
            _check_module(name, module, kind, tp)
    _check_heads(model, tp)


def _check_module(name: str, module: nn.Module, kind: str, tp: int) -> None:
    if not isinstance(module, SHARDABLE):
        raise PlanError(
            f"TP plan: {name} is a {type(module).__name__}; {kind} shards only nn.Linear and "
            "nn.Embedding (GPT-2's Conv1D keeps its weight transposed): leave it out of the "
            "plan or run with --tp 1"
        )
    last = name.rsplit(".", 1)[-1]
    if kind == "ColwiseParallel" and any(f in last for f in FUSED_NAMES):
        raise PlanError(
            f"TP plan: {name} looks like a fused projection; split column-wise, its parts "
            "would be cut across instead of each split by heads: shard separate q/k/v (or "
            "gate/up) projections, or leave it out of the plan"
        )
    dim = _sharded_size(module, kind)
    if dim % tp:
        raise PlanError(
            f"TP plan: {name} ({kind}) has {dim} rows/columns to split, not divisible by tp={tp}"
        )


def _sharded_size(module: nn.Module, kind: str) -> int:
    if isinstance(module, nn.Embedding):
        return module.num_embeddings if kind == "RowwiseParallel" else module.embedding_dim
    assert isinstance(module, nn.Linear)
    return module.out_features if kind == "ColwiseParallel" else module.in_features


def _check_heads(model: nn.Module, tp: int) -> None:
    config = getattr(model, "config", None)
    for field in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, field, None)
        if isinstance(heads, int) and heads % tp:
            raise PlanError(
                f"TP plan: the model's {field} = {heads} is not divisible by tp={tp}: every "
                "rank must hold whole heads"
            )
