"""Paths in the configuration: the bundled config handed to workers, and a config directory whose
name is not URL-safe (config.md: "A relative path in the config is relative to the config file")."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import load_settings, worker_config
from catalog.database import sqlite_file


def test_the_bundled_config_handed_to_workers_is_still_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve --workers N` without a config of its own hands its workers `SWITCHYARD_CONFIG`
    (`worker_config`). In a checkout (`pip install -e .`, README's set-up) `app/config.example.toml`
    is a link to the top-level file, and handed resolved it was no longer `BUNDLED_CONFIG`: the
    workers took the repository root for the config's directory and opened another SQLite file
    than the one the parent migrated and synced (`no such table`, every worker failed to start),
    or, where one exists there, recorded the ledger in it. An explicit path to the top-level file
    is relative to its own directory, as config.md says of any config file."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SWITCHYARD_CONFIG", raising=False)
    parent = load_settings(None)
    worker = load_settings(worker_config(None))
    assert parent.base_dir == str(tmp_path)
    assert (worker.base_dir, worker.database.url) == (parent.base_dir, parent.database.url)


@pytest.mark.parametrize("name", ["what?dir", "pct%41dir"])
def test_a_relative_sqlite_path_stays_in_the_config_files_directory_whatever_its_name(
    tmp_path: Path, name: str
) -> None:
    """config.md: "A relative path in the config is relative to the config file." The config's
    directory was pasted into the database URL unquoted: under `what?dir/` the database became the
    file `what` beside it (the rest read as URL arguments), and under `pct%41dir/` every command
    exited 2 saying the directory `pctAdir` does not exist, for the default `switchyard.db`."""
    directory = tmp_path / name
    directory.mkdir()
    config = directory / "config.toml"
    config.write_text('[database]\nurl = "sqlite+aiosqlite:///switchyard.db"\n')
    settings = load_settings(str(config))
    assert sqlite_file(settings.database.url) == str(directory / "switchyard.db")


def test_an_explicit_config_is_relative_to_its_own_directory_even_the_bundled_example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    top = Path(__file__).resolve().parent.parent / "config.example.toml"
    assert load_settings(str(top)).base_dir == str(top.parent)
    assert load_settings(worker_config(str(top))).base_dir == str(top.parent)
