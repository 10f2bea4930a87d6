"""The cost policy's codec profile: timed on the model's own tensors, at any model size."""

from __future__ import annotations

import pytest

from skyfed.compression.monitor import MonitorConfig
from skyfed.compression.policy import PolicyConfig, profile_codecs
from skyfed.coordinator import links
from skyfed.coordinator.links import Links


def test_cost_policy_profiles_the_model_tensors_and_scales_past_the_cap(monkeypatch):
    monkeypatch.setattr(links, "PROFILE_MAX_NUMEL", 1000)
    policy = PolicyConfig(mode="cost")
    profiles = Links("auto", policy, MonitorConfig(), [600, 600, 600]).profiles
    assert profiles is not None and set(profiles) == {"fp16", "topk", "ecsgd"}
    one = profile_codecs(["fp16"], policy, [600], repeats=1)["fp16"]
    # The first tensor fits under the cap; the profile counts all three.
    assert profiles["fp16"].payload_bytes == 3 * one.payload_bytes
    assert profiles["fp16"].ratio == pytest.approx(one.ratio)


def test_table_policy_and_fixed_codecs_profile_nothing():
    assert Links("auto", PolicyConfig(), MonitorConfig(), [600]).profiles is None
    assert Links("fp16", PolicyConfig(mode="cost"), MonitorConfig(), [600]).profiles is None
