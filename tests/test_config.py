"""Configuration: TOML by section, environment and flags named flat; bad values name the
section, the key, the value and where it came from, in one line."""

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
from skyfed.config.sections import flat_keys, route
from skyfed.coordinator.config import CoordinatorConfig


def load(toml: Path, **flags: object) -> CoordinatorConfig:
    return load_config(CoordinatorConfig, component="coordinator", path=toml, flags=flags)


def test_layers_apply_in_order_defaults_toml_env_flags(tmp_path, monkeypatch):
    toml = tmp_path / "c.toml"
    toml.write_text(
        '[transport]\ncerts = "/etc/skyfed"\nlisten = "0.0.0.0:1"\n'
        "[rounds]\nmin_agents = 3\nquorum = 2\nrounds = 5\n"
    )
    monkeypatch.setenv("SKYFED_COORDINATOR_ROUNDS", "7")
    monkeypatch.setenv("SKYFED_COORDINATOR_ROUND_DEADLINE_S", "2.5")
    config = load(toml, listen="127.0.0.1:9", quorum=None)
    rounds = config.rounds
    assert (rounds.quorum, rounds.rounds, rounds.round_deadline_s) == (2, 7, 2.5)
    assert config.transport.listen == "127.0.0.1:9"
    transport = config.transport
    assert transport.ca == Path("/etc/skyfed/ca.crt") and transport.crl == Path(
        "/etc/skyfed/crl.pem"
    )


def test_every_section_and_its_options_read_from_toml(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text(
        'task = "chargpt"\nseed = 3\n'
        '[transport]\ncerts = "c"\nheartbeat_ms = 500\n'
        '[rounds]\nexchange = "gradient"\noverlap = true\n'
        "[robustness]\nclip_norm_ratio = 0\n"
        "[checkpoints]\nstage_memory = inf\n"
        '[metrics]\nrun_dir = "run"\n'
        '[policy]\nmode = "cost"\n'
        "[monitor]\nwindow_s = 1\n"
        "[streams]\nmax_streams = 4\n"
        '[replicas]\netcd_prefix = "fed"\n'
    )
    config = load(toml)
    assert config.seed == 3 and config.transport.heartbeat_ms == 500
    assert config.rounds.exchange == "gradient" and config.rounds.overlap
    assert config.robustness.clip_norm_ratio == 0.0
    assert config.checkpoints.stage_memory == float("inf")
    assert config.metrics.status_file == Path("run/status.json")
    assert config.policy.mode == "cost" and config.monitor.window_s == 1.0
    assert config.streams.max_streams == 4 and config.replicas.etcd_prefix == "fed"


def test_flat_names_reach_their_sections_and_the_tables_aliases(tmp_path, monkeypatch):
    monkeypatch.setenv("SKYFED_COORDINATOR_POLICY", "cost")
    toml = tmp_path / "c.toml"
    toml.write_text('[transport]\ncerts = "c"\n[policy]\nheavy_above_rtt_ms = 300\n')
    config = load(toml, max_streams=2, clip_norm_ratio=2.0, replica="")
    assert config.policy.mode == "cost" and config.policy.heavy_above_rtt_ms == 300
    assert config.streams.max_streams == 2 and config.robustness.clip_norm_ratio == 2.0


def test_one_function_routes_flat_names_and_keeps_whole_sections():
    whole = PolicyConfig(ecsgd_bits=4)
    nested = route(CoordinatorConfig, {"quorum": 2, "policy": whole, "seed": 1}, "coordinator")
    assert nested == {"rounds": {"quorum": 2}, "policy": whole, "seed": 1}
    assert flat_keys(CoordinatorConfig)["rounds"] == ("rounds", "rounds")
    assert flat_keys(CoordinatorConfig)["policy"] == ("policy", "mode")
    with pytest.raises(ValueError, match="unknown coordinator option: quorom"):
        CoordinatorConfig.from_flat(quorom=2)


def test_unknown_toml_key_is_named_with_its_file(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[transport]\ncerts = "x"\n[rounds]\nquorom = 2\n')
    with pytest.raises(
        ValueError, match=rf"^{toml}: unknown coordinator option in \[rounds\]: quorom"
    ):
        load(toml)


@pytest.mark.parametrize(
    "text, said",
    [
        ('certs = "x"\n', "option certs belongs in [transport]: move it there"),
        ("quorum = 2\n", "option quorum belongs in [rounds]: move it there"),
        ('policy = "cost"\n', "option policy belongs in [policy] as mode: move it there"),
        ("[rounds]\nlisten = 'h:1'\n", "option [rounds] listen belongs in [transport]: move"),
        ("[rounds]\nseed = 1\n", "option [rounds] seed belongs in the top of the file"),
    ],
)
def test_an_option_outside_its_section_is_told_where_it_belongs(tmp_path, text, said):
    toml = tmp_path / "c.toml"
    toml.write_text(text)
    with pytest.raises(ValueError) as caught:
        load(toml)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{toml}: coordinator ") and said in message


def test_a_wrong_type_names_the_key_and_the_file_in_one_line(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[transport]\ncerts = "c"\n[rounds]\nmin_agents = "three"\n')
    with pytest.raises(ValueError) as caught:
        load(toml)
    assert str(caught.value) == (
        f"{toml}: coordinator option [rounds] min_agents='three' must be an integer"
    )


def test_a_quorum_above_min_agents_is_refused(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[transport]\ncerts = "c"\n[rounds]\nmin_agents = 3\nquorum = 5\n')
    with pytest.raises(ValueError) as caught:
        load(toml)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{toml}: coordinator option [rounds]")
    assert "quorum=5 must be <= min_agents (3)" in message


def test_a_bad_environment_value_names_its_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("SKYFED_COORDINATOR_EXCHANGE", "weights")
    toml = tmp_path / "c.toml"
    toml.write_text('[transport]\ncerts = "c"\n')
    with pytest.raises(ValueError, match="^SKYFED_COORDINATOR_EXCHANGE: coordinator option"):
        load(toml)


@pytest.mark.parametrize(
    ("field", "value", "section"),
    [
        ("quorum", 0, "rounds"),
        ("codec", "zip", ""),
        ("max_chunk_bytes", 10, "transport"),
        ("listen", "nowhere", "transport"),
        ("exchange", "weights", "rounds"),
        ("sgd_momentum", 1.0, "rounds"),
        ("outer_optimizer", "adam", "rounds"),
        ("clip_norm_ratio", 0.5, "robustness"),
        ("stage_memory", -1.0, "checkpoints"),
        ("eval_every", -1, "metrics"),
        ("lease_ttl_s", 1, "replicas"),
        ("policy", "fast", "policy"),
    ],
)
def test_bad_coordinator_option_names_section_field_and_value(field, value, section):
    options = {"replica": "a", "etcd": "http://e:2379"} if section == "replicas" else {}
    shown = "mode" if field == "policy" else field
    where = f"[{section}] " if section else ""
    with pytest.raises(ValueError, match=f"option {where}{shown}={value!r}".replace("[", r"\[")):
        CoordinatorConfig.from_flat(certs=Path("c"), **options, **{field: value})


def test_choices_are_literals_a_number_is_no_boolean():
    with pytest.raises(ValueError, match=r"\[policy\] ecsgd_bits=True must be 1 or 2 or 4"):
        CoordinatorConfig.from_flat(certs=Path("c"), policy={"ecsgd_bits": True})
    with pytest.raises(ValueError, match='must be "auto" or "cpu" or "cuda"'):
        AgentConfig(cloud="aws", certs=Path("/c"), device="tpu")  # type: ignore[arg-type]


def test_one_bit_ecsgd_under_gradient_exchange_is_refused():
    with pytest.raises(ValueError, match="ecsgd_bits=1 must be 2 or 4 under exchange = gradient"):
        CoordinatorConfig.from_flat(certs=Path("c"), exchange="gradient", policy={"ecsgd_bits": 1})


def test_gradient_exchange_sets_ecsgd_clip_unless_the_policy_does(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[transport]\ncerts = "c"\n[rounds]\nexchange = "gradient"\n')
    assert load(toml).policy.codec_params("ecsgd") == {"bits": 2, "clip": GRADIENT_ECSGD_CLIP}
    toml.write_text(
        '[transport]\ncerts = "c"\n[rounds]\nexchange = "gradient"\n[policy]\necsgd_clip = 1.5\n'
    )
    assert load(toml).policy.codec_params("ecsgd") == {"bits": 2, "clip": 1.5}
    config = CoordinatorConfig.from_flat(certs=Path("c"))
    assert config.policy.codec_params("ecsgd") == {"bits": 2}


def test_topk_density_defaults_by_exchange_unless_the_policy_sets_it(tmp_path):
    toml = tmp_path / "c.toml"
    for exchange, policy, density in [
        ("delta", "", DELTA_TOPK_DENSITY),
        ("gradient", "", GRADIENT_TOPK_DENSITY),
        ("gradient", "[policy]\ntopk_density = 0.05\n", 0.05),
        ("delta", "[policy]\ntopk_density = 0.01\n", 0.01),
    ]:
        toml.write_text(f'[transport]\ncerts = "c"\n[rounds]\nexchange = "{exchange}"\n{policy}')
        assert load(toml).policy.codec_params("topk")["density"] == density, (exchange, policy)
    assert (DELTA_TOPK_DENSITY, GRADIENT_TOPK_DENSITY) == (0.05, 0.01)


def test_gradient_exchange_leaves_a_policy_it_was_given_alone():
    shared = PolicyConfig(ecsgd_bits=4)
    flat = CoordinatorConfig.from_flat
    gradient = flat(certs=Path("c"), exchange="gradient", policy=shared)
    delta = flat(certs=Path("c"), policy=shared)
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
    with pytest.raises(ValueError, match="agent option tp='2' must be an integer"):
        AgentConfig(cloud="aws", certs=Path("/c"), tp="2")  # type: ignore[arg-type]
