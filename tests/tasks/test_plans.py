"""TP plans: Hugging Face style names resolve to torch styles; a plan the model cannot take
is refused in one line naming the module and why."""

from __future__ import annotations

import pytest
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from skyfed.tasks import load_task
from skyfed.tasks.base import tp_plan_of
from skyfed.tasks.plans import PlanError, check, matches, resolve


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 32)
        self.down = nn.Linear(32, 8)
        self.qkv = nn.Linear(8, 24)
        self.norm = nn.LayerNorm(8)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(3))


def test_a_wildcard_names_one_path_component_in_every_layer():
    names = [name for name, _ in matches(Model(), "layers.*.up")]
    assert names == ["layers.0.up", "layers.1.up", "layers.2.up"]
    assert matches(Model(), "layers.*") != [] and matches(Model(), "*.up") == []


def test_hugging_face_style_names_resolve_to_torch_styles():
    plan = resolve({"a": "colwise", "b": "rowwise", "c": "replicate", "d": ColwiseParallel()})
    assert isinstance(plan["a"], ColwiseParallel) and isinstance(plan["b"], RowwiseParallel)
    assert "c" not in plan and isinstance(plan["d"], ColwiseParallel)


def test_a_style_with_no_torch_equivalent_is_refused_by_name():
    with pytest.raises(PlanError, match="'layers.*.mlp.gate_up_proj': style 'packed_colwise'"):
        resolve({"layers.*.mlp.gate_up_proj": "packed_colwise"})


@pytest.mark.parametrize(
    ("plan", "tp", "words"),
    [
        ({"layers.*.norm": ColwiseParallel()}, 2, "layers.0.norm is a LayerNorm"),
        ({"layers.*.qkv": ColwiseParallel()}, 2, "layers.0.qkv looks like a fused projection"),
        ({"layers.*.up": ColwiseParallel()}, 3, "has 32 rows/columns to split"),
        ({"layers.9.up": ColwiseParallel()}, 2, "names module 'layers.9.up'"),
        ({}, 2, "needs a task with a tp_plan()"),
    ],
)
def test_a_plan_the_model_cannot_take_is_refused_naming_the_module(plan, tp, words):
    with pytest.raises(PlanError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check(Model(), plan, tp)


def test_a_plan_that_fits_passes():
    check(Model(), {"layers.*.up": ColwiseParallel(), "layers.*.down": RowwiseParallel()}, 4)


def test_the_llama_tasks_own_plan_fits_it_and_its_heads_bound_tp():
    task = load_task("skyfed.tasks.llama:llama")
    model = task.build_model(0)
    check(model, tp_plan_of(task), 2)
    with pytest.raises(PlanError, match="num_key_value_heads = 2 is not divisible by tp=4"):
        check(model, tp_plan_of(task), 4)
