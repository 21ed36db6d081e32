"""What a non-editable install gets: the wheel holds every package of the service (keys mode's
`app.access` was once left out) and the example config, the last fallback of `--config`
(config.md), whose relative paths then point into the current directory, not the package's."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from app.settings import BUNDLED_CONFIG, load_settings
from tests.support.cli import REPO

PACKAGES = ("app", "providers", "catalog", "devtools", "migrations")


def test_the_wheel_holds_every_package_and_the_example_config(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a clean copy: an in-tree build would reuse a stale build/ folder
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    for top in PACKAGES:
        shutil.copytree(REPO / top, source / top, symlinks=True, ignore=ignore)
    for name in ("pyproject.toml", "README.md", "config.example.toml"):
        shutil.copy(REPO / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = tmp_path.glob("switchyard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = sorted(str(init.relative_to(REPO)) for top in PACKAGES for init in (REPO / top).rglob("__init__.py"))
    assert "app/access/__init__.py" in packages
    assert [name for name in packages if name not in names] == []
    assert zipfile.ZipFile(wheel).read("app/config.example.toml") == (REPO / "config.example.toml").read_bytes()


def test_without_a_config_file_the_example_is_used_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SWITCHYARD_CONFIG", raising=False)
    settings = load_settings()
    assert BUNDLED_CONFIG.read_bytes() == (REPO / "config.example.toml").read_bytes()
    assert settings.database.url == f"sqlite+aiosqlite:///{tmp_path.resolve() / 'switchyard.db'}"
    assert settings.journal_dir == tmp_path.resolve() / "switchyard-journal"
