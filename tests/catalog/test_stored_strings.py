"""Operator strings the catalog stores, on both databases: a model id, an alias or an upstream
model name with a control character is a catalog error naming the key (config.md: exit 2), on
SQLite and PostgreSQL alike. Before, PostgreSQL refused a NUL with a database error naming
nothing (`catalog sync` and `serve` exit 1: `database error: invalid byte sequence`) while SQLite
stored it, and a new line or an ESC went into the ledger, `/metrics` and the rows of `switchyard
usage`, where the report's own filter refuses such a value (`catalog.usage_query`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.catalog.conftest import NewDatabase
from tests.support.cli import run_cli

MODEL = """[models.{id}]
context_window = 100
max_output = 10
aliases = [{alias}]

[[models.{id}.deployments]]
provider = "up"
upstream_model = {upstream}
"""
CONFIG = """[database]
url = "{url}"

[catalog]
files = ["models.toml"]

[providers.up]
kind = "openai_compatible"
base_url = "http://127.0.0.1:9/v1"
"""
CASES = {
    "nul in an id": (
        {"id": '"a\\u0000b"', "alias": "", "upstream": '"u"'},
        'models."a\\u0000b": must not hold a control character',
    ),
    "new line in an id": (
        {"id": '"a\\nb"', "alias": "", "upstream": '"u"'},
        'models."a\\nb": must not hold a control character',
    ),
    "esc in an alias": (
        {"id": '"m"', "alias": '"al\\u001b[2J"', "upstream": '"u"'},
        'models."m".aliases[0]: must not hold a control character',
    ),
    "nul in an upstream model": (
        {"id": '"m"', "alias": "", "upstream": '"u\\u0000"'},
        'models."m".deployments[0].upstream_model: must not hold a control character',
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_control_character_in_a_catalog_name_is_refused_naming_the_key(
    tmp_path: Path, fresh_url: NewDatabase, case: str
) -> None:
    fields, message = CASES[case]
    (tmp_path / "models.toml").write_text(MODEL.format(**fields))
    config = tmp_path / "config.toml"
    config.write_text(CONFIG.format(url=await fresh_url()))
    assert run_cli(tmp_path, "db", "upgrade", "--config", str(config)).returncode == 0

    synced = run_cli(tmp_path, "catalog", "sync", "--config", str(config))

    assert (synced.returncode, synced.stdout, synced.stderr) == (2, "", f"switchyard: models.toml: {message}\n")
