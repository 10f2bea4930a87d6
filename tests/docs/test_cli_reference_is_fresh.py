"""docs/cli.md is exactly what ``python -m skyfed.config.cliref`` writes from the click commands."""

from skyfed.config import cliref


def test_cli_reference_matches_the_click_commands():
    fresh = cliref.render(cliref.entry_points())
    assert cliref.OUTPUT.read_text() == fresh, (
        f"{cliref.OUTPUT} is stale: run `make docs` (python -m skyfed.config.cliref)"
    )


def test_reference_covers_every_console_command_and_its_subcommands():
    page = cliref.OUTPUT.read_text()
    for heading in ("`coordinator serve`", "`agent start`", "`certs issue agent`", "`skyfed demo`"):
        assert heading in page, f"docs/cli.md has no section for {heading}"
