"""constraints.txt pins every package pyproject.toml names, at a version it admits: a
package added without `make lock` fails here, not on a fresh machine (.ci/lock)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def pins() -> dict[str, str]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"constraints.txt: {line!r} is not NAME==VERSION"
            found[canonicalize_name(name)] = version.strip()
    return found


def required() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    return [Requirement(r) for r in [*project["dependencies"], *extras]]


def test_every_dependency_of_every_extra_is_pinned_at_a_version_pyproject_admits():
    pinned = pins()
    for requirement in required():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} is not in constraints.txt: run `make lock`"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {name}=={pinned[name]}, which {requirement} does not admit: "
            "run `make lock`"
        )


def test_torch_is_the_cpu_build_on_disk_and_skyfed_is_not_pinned():
    pinned = pins()
    assert pinned["torch"] == "2.13.0"
    assert "skyfed" not in pinned
