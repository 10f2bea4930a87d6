"""docs/configuration.md is exactly what ``python -m skyfed.config.reference`` writes today."""

from skyfed.config import reference as configref


def test_configuration_reference_matches_the_config_docstrings():
    fresh = configref.render(configref.find_configs())
    assert configref.OUTPUT.read_text() == fresh, (
        f"{configref.OUTPUT} is stale: run `make docs` (python -m skyfed.config.reference)"
    )


def test_every_config_field_has_a_docstring():
    configs = configref.find_configs()
    missing = [f"{c.name}.{f.name}" for c in configs for f in c.fields if not f.doc]
    assert not missing, f"config fields without a docstring under them: {', '.join(missing)}"


def test_reference_covers_every_component():
    names = {config.name for config in configref.find_configs()}
    assert {"CoordinatorConfig", "AgentConfig", "PolicyConfig", "MonitorConfig"} <= names


def test_the_coordinators_sections_follow_it_under_their_tables():
    page = configref.OUTPUT.read_text()
    coordinator = page.index("## `coordinator serve`")
    headings = [
        page.index(f"### `[{name}]`", coordinator)
        for name in ("transport", "rounds", "robustness", "checkpoints", "metrics", "policy")
    ]
    assert headings == sorted(headings) and headings[-1] < page.index("## `agent start`")
