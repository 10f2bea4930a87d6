"""Configuration: TOML, environment, flags; bad values name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyfed.agent.config import AgentConfig
from skyfed.compression.policy import (
    DELTA_TOPK_DENSITY,
    GRADIENT_ECSGD_CLIP,
    GRADIENT_TOPK_DENSITY,
    PolicyConfig,
)
from skyfed.config.load import load_config
from skyfed.coordinator.config import CoordinatorConfig


def test_layers_apply_in_order_defaults_toml_env_flags(tmp_path, monkeypatch):
    toml = tmp_path / "c.toml"
    toml.write_text('quorum = 2\nrounds = 5\ncerts = "/etc/skyfed"\nlisten = "0.0.0.0:1"\n')
    monkeypatch.setenv("SKYFED_COORDINATOR_ROUNDS", "7")
    monkeypatch.setenv("SKYFED_COORDINATOR_ROUND_DEADLINE_S", "2.5")
    config = load_config(
        CoordinatorConfig,
        component="coordinator",
        path=toml,
        flags={"listen": "127.0.0.1:9", "quorum": None},
    )
    assert (config.quorum, config.rounds, config.round_deadline_s, config.listen) == (
        2,
        7,
        2.5,
        "127.0.0.1:9",
    )
    assert config.ca == Path("/etc/skyfed/ca.crt") and config.crl == Path("/etc/skyfed/crl.pem")


def test_unknown_toml_key_is_named(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('quorom = 2\ncerts = "x"\n')
    with pytest.raises(ValueError, match="unknown coordinator option.*quorom"):
        load_config(CoordinatorConfig, component="coordinator", path=toml, flags={})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("quorum", 0),
        ("codec", "zip"),
        ("max_chunk_bytes", 10),
        ("listen", "nowhere"),
        ("exchange", "weights"),
        ("sgd_momentum", 1.0),
    ],
)
def test_bad_coordinator_option_names_field_and_value(field, value):
    with pytest.raises(ValueError, match=f"{field}={value!r}"):
        CoordinatorConfig(certs=Path("c"), **{field: value})


def test_one_bit_ecsgd_under_gradient_exchange_is_refused():
    with pytest.raises(ValueError, match="ecsgd_bits=1 must be 2 or 4 under exchange = gradient"):
        CoordinatorConfig(certs=Path("c"), exchange="gradient", policy={"ecsgd_bits": 1})


def test_gradient_exchange_sets_ecsgd_clip_unless_the_policy_does(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('certs = "c"\nexchange = "gradient"\n')
    config = load_config(CoordinatorConfig, component="coordinator", path=toml, flags={})
    assert config.policy.codec_params("ecsgd") == {"bits": 2, "clip": GRADIENT_ECSGD_CLIP}
    toml.write_text('certs = "c"\nexchange = "gradient"\n[policy]\necsgd_clip = 1.5\n')
    config = load_config(CoordinatorConfig, component="coordinator", path=toml, flags={})
    assert config.policy.codec_params("ecsgd") == {"bits": 2, "clip": 1.5}
    assert CoordinatorConfig(certs=Path("c")).policy.codec_params("ecsgd") == {"bits": 2}


def test_topk_density_defaults_by_exchange_unless_the_policy_sets_it(tmp_path):
    toml = tmp_path / "c.toml"
    for exchange, policy, density in [
        ("delta", "", DELTA_TOPK_DENSITY),
        ("gradient", "", GRADIENT_TOPK_DENSITY),
        ("gradient", "[policy]\ntopk_density = 0.05\n", 0.05),
        ("delta", "[policy]\ntopk_density = 0.01\n", 0.01),
    ]:
        toml.write_text(f'certs = "c"\nexchange = "{exchange}"\n{policy}')
        config = load_config(CoordinatorConfig, component="coordinator", path=toml, flags={})
        assert config.policy.codec_params("topk")["density"] == density, (exchange, policy)
    assert (DELTA_TOPK_DENSITY, GRADIENT_TOPK_DENSITY) == (0.05, 0.01)


def test_gradient_exchange_leaves_a_policy_it_was_given_alone():
    shared = PolicyConfig(ecsgd_bits=4)
    gradient = CoordinatorConfig(certs=Path("c"), exchange="gradient", policy=shared)
    delta = CoordinatorConfig(certs=Path("c"), policy=shared)
    assert gradient.policy.codec_params("ecsgd") == {"bits": 4, "clip": GRADIENT_ECSGD_CLIP}
    assert delta.policy.codec_params("ecsgd") == {"bits": 4} and shared.ecsgd_clip is None


def test_agent_name_defaults_from_cloud_and_cert_paths_from_certs_dir():
    config = AgentConfig(cloud="gcp", certs=Path("/c"))
    assert (
        config.name == "gcp-1"
        and config.cert == Path("/c/gcp-1.crt")
        and config.key == Path("/c/gcp-1.key")
    )


def test_bad_agent_option_names_field():
    with pytest.raises(ValueError, match="shard=3"):
        AgentConfig(cloud="aws", certs=Path("/c"), shard=3, num_shards=2)
    with pytest.raises(ValueError, match="local_steps"):  # more than its hello may say
        AgentConfig(cloud="aws", certs=Path("/c"), local_steps=(1 << 20) + 1)
