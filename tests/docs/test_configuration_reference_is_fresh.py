"""docs/configuration.md is exactly what ``python -m skyfed.config.reference`` writes today."""

from skyfed.config import reference as configref


def test_configuration_reference_matches_the_config_docstrings():
    fresh = configref.render(configref.find_configs())
    assert configref.OUTPUT.read_text() == fresh, (
        f"{configref.OUTPUT} is stale: run `make docs` (python -m skyfed.config.reference)"
    )


def test_every_config_field_has_a_docstring():
    missing = configref.undocumented(configref.find_configs())
    assert not missing, f"config fields without a docstring under them: {', '.join(missing)}"


def test_reference_covers_every_component():
    names = {config.name for config in configref.find_configs()}
    assert {"CoordinatorConfig", "AgentConfig", "PolicyConfig", "MonitorConfig"} <= names
