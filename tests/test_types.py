"""The whole package type-checks with the pinned mypy (``-p skyfed``), as CONTRIBUTING asks.

The package installs from folders named for their part (``compression/`` is
``skyfed.compression``, pyproject's ``package-dir``), which mypy cannot map by itself: the
test lays the tree out as installed (symbolic links) and checks it there.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def installed_layout(into: Path) -> Path:
    """``into/skyfed/...`` linking each package folder where pyproject installs it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = project["tool"]["setuptools"]["package-dir"]
    top = into / "skyfed"
    top.mkdir()
    for source in (ROOT / dirs["skyfed"]).iterdir():
        if source.is_file() or (source / "__init__.py").exists():
            (top / source.name).symlink_to(source)
    for package, folder in dirs.items():
        if package != "skyfed" and package.count(".") == 1:
            link = top / package.split(".")[1]
            if not link.exists():
                link.symlink_to(ROOT / folder)
    return into


def test_the_whole_package_type_checks(tmp_path):
    tree = installed_layout(tmp_path)
    config = ROOT / "pyproject.toml"
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--no-incremental"],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
