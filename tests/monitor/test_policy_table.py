"""The link policy: default table, hysteresis, dwell, cost model, configuration."""

from __future__ import annotations

import math

import pytest
import torch

from skyfed.compression import decode_payload, make_codec
from skyfed.compression.monitor import LinkStats
from skyfed.compression.policy import (
    CodecProfile,
    PolicyConfig,
    PolicyState,
    cost_choice,
    predict_exchange_s,
    profile_codecs,
    step,
    table_level,
)

FAST = PolicyConfig(heavier_after_windows=1, lighter_after_windows=1)


def settle(stats: LinkStats, config: PolicyConfig, start: str = "fp16", windows: int = 10) -> str:
    state = PolicyState(start)
    for _ in range(windows):
        state = step(state, stats, config)
    return state.codec


@pytest.mark.parametrize(
    ("rtt_ms", "loss_pct", "codec"),
    [
        (1.0, 0.0, "fp16"),
        (20.0, 0.1, "fp16"),
        (120.0, 0.5, "topk"),
        (30.0, 2.0, "topk"),  # near but somewhat lossy
        (250.0, 1.2, "ecsgd"),
        (30.0, 8.0, "ecsgd"),  # near but lossy
        (math.nan, math.nan, "fp16"),  # nothing measured: stay
    ],
)
def test_default_table(rtt_ms, loss_pct, codec):
    assert settle(LinkStats(rtt_ms=rtt_ms, loss_pct=loss_pct), FAST) == codec


def test_hysteresis_keeps_a_link_in_the_dead_band_where_it_is():
    config = PolicyConfig(hysteresis_pct=10)
    at_edge = LinkStats(rtt_ms=52.0, loss_pct=0.0)  # above 50, inside 45..55
    assert table_level(at_edge, config, current=0) == 0
    assert table_level(at_edge, config, current=1) == 1
    assert table_level(LinkStats(rtt_ms=56.0, loss_pct=0.0), config, current=0) == 1
    assert table_level(LinkStats(rtt_ms=44.0, loss_pct=0.0), config, current=1) == 0


def test_rtt_jittering_around_a_threshold_does_not_flap():
    config = PolicyConfig()
    state, codecs = PolicyState("fp16"), []
    for i in range(200):
        rtt = 50.0 + (4.0 if i % 2 else -4.0) + (i % 7) * 0.5
        state = step(state, LinkStats(rtt_ms=rtt, loss_pct=0.0), config)
        codecs.append(state.codec)
    assert set(codecs) == {"fp16"}


def test_heavier_only_after_several_consistent_windows():
    config = PolicyConfig(heavier_after_windows=3, lighter_after_windows=2)
    far, near = LinkStats(rtt_ms=150.0, loss_pct=0.0), LinkStats(rtt_ms=10.0, loss_pct=0.0)
    state = PolicyState("fp16")
    for stats in (far, far, near, far, far):  # a lull breaks the run
        state = step(state, stats, config)
        assert state.codec == "fp16"
    state = step(state, far, config)
    assert state.codec == "topk"


def test_a_run_of_mixed_heavier_windows_moves_only_as_far_as_all_agree():
    config = PolicyConfig(heavier_after_windows=3)
    state = PolicyState("fp16")
    for rtt in (300.0, 120.0, 300.0):
        state = step(state, LinkStats(rtt_ms=rtt, loss_pct=0.0), config)
    assert state.codec == "topk"


def test_back_to_light_as_soon_as_the_link_recovered_long_enough():
    config = PolicyConfig(heavier_after_windows=3, lighter_after_windows=2)
    near = LinkStats(rtt_ms=20.0, loss_pct=0.0)
    state = step(PolicyState("ecsgd"), near, config)
    assert state.codec == "ecsgd"
    state = step(state, near, config)
    assert state.codec == "fp16"  # straight back, not one step at a time


def test_every_step_of_a_degrading_then_healed_link_switches_once():
    config = PolicyConfig()
    state, switches = PolicyState("fp16"), []
    for rtt in [20.0] * 10 + [150.0] * 10 + [300.0] * 10 + [20.0] * 10:
        new = step(state, LinkStats(rtt_ms=rtt, loss_pct=0.0), config)
        if new.codec != state.codec:
            switches.append(new.codec)
        state = new
    assert switches == ["topk", "ecsgd", "fp16"]


def test_a_window_straddling_a_recovery_costs_no_second_switch():
    config = PolicyConfig(lighter_after_windows=2)
    state, switches = PolicyState("ecsgd"), []
    for rtt in (300.0, 160.0, 20.0, 20.0, 20.0):  # 160: half the window before the change
        new = step(state, LinkStats(rtt_ms=rtt, loss_pct=0.0), config)
        if new.codec != state.codec:
            switches.append(new.codec)
        state = new
    assert switches == ["fp16"]


def test_thresholds_and_codecs_are_configurable():
    config = PolicyConfig(
        light="bf16", heavy="topk", medium="fp16", light_below_rtt_ms=5, heavy_above_rtt_ms=10
    )
    assert settle(LinkStats(rtt_ms=20.0, loss_pct=0.0), _fast(config)) == "topk"
    assert config.codec_params("topk") == {"density": 0.05, "values": "int8"}  # delta's
    assert PolicyConfig(ecsgd_bits=4).codec_params("ecsgd") == {"bits": 4}
    assert PolicyConfig(ecsgd_block=128).codec_params("ecsgd") == {"bits": 2, "block": 128}
    warm = PolicyConfig(topk_density=0.001, topk_warmup_rounds=3)
    assert [warm.codec_params("topk", t)["density"] for t in (0, 3, 9)] == pytest.approx(
        [0.25, 0.001, 0.001]
    )
    assert warm.codec_params("topk")["density"] == 0.001  # no round: after warm-up


def test_ecsgd_block_reaches_the_codec_and_a_small_tensor_costs_its_own_length():
    small = make_codec("ecsgd", seed=0, **PolicyConfig(ecsgd_block=128).codec_params("ecsgd"))
    default = make_codec("ecsgd", seed=0, **PolicyConfig().codec_params("ecsgd"))
    bias, weight = torch.randn(32), torch.randn(2048)
    # A bias is one ragged block either way, at its own length: 4 bytes of scale, 8 of codes.
    assert len(default.encode(bias)) == len(small.encode(bias))
    # The weight takes 16 scales in blocks of 128 against 2 in 1024.
    assert len(small.encode(weight)) - len(default.encode(weight)) == (16 - 2) * 4
    decoded = decode_payload(small.encode(bias), shape=(32,))
    assert decoded.shape == (32,) and bool(torch.isfinite(decoded).all())


def _fast(config: PolicyConfig) -> PolicyConfig:
    config.heavier_after_windows = config.lighter_after_windows = 1
    return config


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mode", "magic"),
        ("light", "zip"),
        ("light_below_rtt_ms", 500.0),
        ("high_loss_pct", 0.5),
        ("heavier_after_windows", 0),
        ("ecsgd_bits", 3),
        ("ecsgd_block", 100),
    ],
)
def test_bad_policy_option_names_field_and_value(field, value):
    with pytest.raises(ValueError, match=f"{field}="):
        PolicyConfig(**{field: value})


PROFILES = {
    "fp16": CodecProfile("fp16", 2.0, 0.001, 0.001, 2_000_000),
    "topk": CodecProfile("topk", 100.0, 0.02, 0.002, 40_000),
    "ecsgd": CodecProfile("ecsgd", 15.0, 0.01, 0.01, 270_000),
}


def test_cost_model_predicts_rtt_plus_payload_and_codec_time_both_ways():
    stats = LinkStats(rtt_ms=100.0, goodput_mbit=80.0)
    # 0.1 s + 2 * (2 MB * 8 / 80 Mbit/s + 1 ms encode + 1 ms decode)
    assert predict_exchange_s(PROFILES["fp16"], stats) == pytest.approx(0.1 + 0.4 + 0.004)


def test_cost_model_picks_the_fastest_and_prefers_less_compression_on_a_tie():
    slow = LinkStats(rtt_ms=100.0, goodput_mbit=10.0)
    assert cost_choice(slow, PolicyConfig(mode="cost"), PROFILES) == "topk"
    fast = LinkStats(rtt_ms=1.0, goodput_mbit=100_000.0)
    assert cost_choice(fast, PolicyConfig(mode="cost", cost_tie_pct=50), PROFILES) == "fp16"
    assert cost_choice(LinkStats(rtt_ms=10.0), PolicyConfig(mode="cost"), PROFILES) is None


def test_cost_model_keeps_the_light_codec_where_training_dominates_the_round():
    # fp16 0.094 s, topk 0.056 s, ecsgd 0.061 s (a tie with topk: the less compressing)
    near = LinkStats(rtt_ms=10.0, goodput_mbit=400.0)
    assert cost_choice(near, PolicyConfig(mode="cost"), PROFILES) == "ecsgd"
    # With 1 s of local training per round they are 1.094, 1.056 and 1.061 s: all tie.
    assert cost_choice(near, PolicyConfig(mode="cost"), PROFILES, train_s=1.0) == "fp16"
    far = LinkStats(rtt_ms=300.0, goodput_mbit=5.0)  # fp16 6.7 s: too slow however long
    assert cost_choice(far, PolicyConfig(mode="cost"), PROFILES, train_s=1.0) == "topk"


def test_cost_model_rescales_goodput_measured_at_another_rtt():
    # Goodput was timed while the link was near (20 ms); it is far now, and Top-k sends too
    # little to time again: a window-limited transfer at 300 ms runs 15x slower.
    far_now = LinkStats(rtt_ms=300.0, goodput_mbit=100.0, goodput_rtt_ms=20.0)
    rate = 100e6 * 20 / 300
    assert predict_exchange_s(PROFILES["ecsgd"], far_now) == pytest.approx(
        0.3 + 2 * 270_000 * 8 / rate + 2 * 0.02
    )
    assert cost_choice(far_now, PolicyConfig(mode="cost"), PROFILES, train_s=1.0) == "topk"
    # Taken at face value, the near link's goodput made ecsgd look as fast: a needless switch.
    stale = LinkStats(rtt_ms=300.0, goodput_mbit=100.0)
    assert cost_choice(stale, PolicyConfig(mode="cost"), PROFILES, train_s=1.0) == "ecsgd"


def test_cost_model_stays_within_the_compression_budget():
    slow = LinkStats(rtt_ms=100.0, goodput_mbit=10.0)
    config = PolicyConfig(mode="cost", max_ratio=20.0)
    assert cost_choice(slow, config, PROFILES) == "ecsgd"


def test_cost_mode_steps_with_dwell_and_falls_back_to_the_table_without_goodput():
    config = PolicyConfig(mode="cost", heavier_after_windows=2)
    slow = LinkStats(rtt_ms=10.0, goodput_mbit=10.0)
    state = step(PolicyState("fp16"), slow, config, PROFILES)
    assert state.codec == "fp16"
    assert step(state, slow, config, PROFILES).codec == "topk"
    unmeasured = LinkStats(rtt_ms=300.0)
    assert settle(unmeasured, _fast(PolicyConfig(mode="cost"))) == "ecsgd"


def test_profiles_are_measured_on_the_model_tensors_through_error_feedback():
    sizes = [16384, 64, 4096, 64, 16384]
    profiles = profile_codecs(["fp16", "topk", "ecsgd"], PolicyConfig(), sizes, repeats=1)
    assert profiles["fp16"].payload_bytes >= 2 * sum(sizes)  # every tensor, 2 bytes each
    assert profiles["fp16"].ratio == pytest.approx(2.0, rel=0.05)
    assert profiles["topk"].ratio > 30 and profiles["ecsgd"].ratio > 10
    assert all(p.encode_s > 0 and p.decode_s > 0 for p in profiles.values())
    # Five payloads cost more than one of the same elements: the per-tensor work counts.
    flat = profile_codecs(["topk"], PolicyConfig(), [sum(sizes)], repeats=1)["topk"]
    assert profiles["topk"].payload_bytes > flat.payload_bytes


def test_long_local_phases_get_ecsgd_in_the_long_phase_blocks_from_the_threshold_on():
    config = PolicyConfig()  # long_phase_local_steps = 64
    assert config.codec_params("ecsgd", local_steps=128) == {"bits": 2, "block": 1024}
    assert config.codec_params("ecsgd", local_steps=64) == {"bits": 2, "block": 1024}
    assert config.codec_params("ecsgd", local_steps=63) == {"bits": 2}
    assert config.codec_params("ecsgd") == {"bits": 2}  # an agent that did not say
    assert config.codec_params("topk", local_steps=128) == config.codec_params("topk")
    assert config.codec_params("fp16", local_steps=128) == {}


def test_a_link_of_long_phases_runs_ecsgd_where_the_policy_says_topk():
    config = PolicyConfig()
    assert config.phase_codec("topk", local_steps=128) == "ecsgd"
    assert config.phase_codec("topk", local_steps=64) == "ecsgd"
    assert config.phase_codec("topk", local_steps=63) == "topk"
    assert config.phase_codec("topk", local_steps=0) == "topk"  # an agent that did not say
    assert [config.phase_codec(c, 128) for c in ("fp16", "ecsgd")] == ["fp16", "ecsgd"]
    assert PolicyConfig(long_phase_local_steps=0).phase_codec("topk", 1 << 20) == "topk"
    assert PolicyConfig().for_gradient_exchange().phase_codec("topk", 128) == "topk"


def test_long_phase_rule_yields_to_a_set_block_and_turns_off_at_0_and_under_gradient():
    assert PolicyConfig(ecsgd_block=256).codec_params("ecsgd", local_steps=128)["block"] == 256
    off = PolicyConfig(long_phase_local_steps=0)
    assert off.codec_params("ecsgd", local_steps=1 << 20) == {"bits": 2}
    gradient = PolicyConfig().for_gradient_exchange()  # a round is one step there
    assert "block" not in gradient.codec_params("ecsgd", local_steps=128)
    with pytest.raises(ValueError, match="long_phase_local_steps"):
        PolicyConfig(long_phase_local_steps=-1)
