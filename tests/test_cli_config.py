"""Configuration mistakes the CLI refuses as bad usage (config.md: exit 2, the message naming the
key) instead of acting on them: an empty `--config`, database URL arguments the driver does not
take, an empty `[catalog] files`, a downgrade to a revision that does not exist."""

from __future__ import annotations

import inspect
import sqlite3
from pathlib import Path

import asyncpg
import pytest
from litestar import Litestar

from app.application import create_app_from_env
from app.config_urls import POSTGRES_URL_ARGUMENTS, SQLITE_URL_ARGUMENTS, database_url_problem, url_problem
from tests.support.cli import query, run_cli, write_config

SQLITE_URL = 'url = "sqlite+aiosqlite:///switchyard.db"'


def test_an_empty_config_path_exits_2_instead_of_reading_the_default(tmp_path: Path) -> None:
    write_config(tmp_path)  # ./config.toml exists: `--config ""` used it
    result = run_cli(tmp_path, "db", "upgrade", "--config", "")
    expected = (2, "", "switchyard: --config: an empty path names no file\n")
    assert (result.returncode, result.stdout, result.stderr) == expected
    assert not (tmp_path / "switchyard.db").exists()


@pytest.mark.parametrize(
    ("url", "argument"),
    [
        ("postgresql+asyncpg://127.0.0.1:5432/test?foo=bar", "foo"),  # a TypeError at the first connection
        ("sqlite+aiosqlite:///switchyard.db?mode=ro", "mode"),  # ignored with a warning: not read-only at all
    ],
)
def test_a_database_url_argument_the_driver_does_not_take_exits_2_naming_it(
    tmp_path: Path, url: str, argument: str
) -> None:
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace(SQLITE_URL, f'url = "{url}"'))
    result = run_cli(tmp_path, "db", "upgrade", "--config", str(config))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"switchyard: {config}: database.url: the driver takes no argument {argument!r} (")


def test_database_url_arguments_the_drivers_take_are_accepted(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace(SQLITE_URL, 'url = "sqlite+aiosqlite:///switchyard.db?timeout=7"'))
    result = run_cli(tmp_path, "db", "upgrade", "--config", str(config))
    assert (result.returncode, result.stderr) == (0, "")
    assert query(tmp_path / "switchyard.db", "SELECT count(*) FROM alembic_version") == [(1,)]


def test_the_accepted_url_arguments_are_the_drivers_own() -> None:
    """asyncpg.connect's parameters (and SQLAlchemy's statement cache size); SQLAlchemy's pysqlite list."""
    asyncpg_parameters = set(inspect.signature(asyncpg.connect).parameters)
    assert POSTGRES_URL_ARGUMENTS - {"prepared_statement_cache_size"} <= asyncpg_parameters
    assert {"uri", "timeout", "check_same_thread"} <= SQLITE_URL_ARGUMENTS


def test_an_empty_catalog_file_list_exits_2_instead_of_emptying_the_catalog(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    assert run_cli(tmp_path, "catalog", "sync", "--config", str(config)).returncode == 0
    config.write_text(config.read_text().replace('files = ["models.toml"]', "files = []"))
    result = run_cli(tmp_path, "catalog", "sync", "--config", str(config))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"switchyard: {config}: catalog.files: an empty list names no catalog "
        "(leave the key out for the catalog bundled with the package)\n"
    )
    assert query(tmp_path / "switchyard.db", "SELECT count(*) FROM models") != [(0,)]


def test_a_downgrade_to_a_revision_that_does_not_exist_exits_2_naming_it(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    assert run_cli(tmp_path, "db", "upgrade", "--config", str(config)).returncode == 0
    result = run_cli(tmp_path, "db", "downgrade", "nonsense", "--config", str(config))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "switchyard db downgrade: nonsense: Can't locate revision identified by 'nonsense'\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (  # the window holds 3 outcomes: 10 samples never come, the breaker never opens
            'kind = "local"\nbase_url = "http://h/v1"\nbreaker_window = 3\nbreaker_min_samples = 10',
            "providers.x.breaker_min_samples: 10 is more than breaker_window (3): it would never open "
            "(lower one, raise the other)",
        ),
        (  # no variable named: the hosted provider ran without a key, in rotation
            'kind = "primalabs"\nbase_url = "http://h/v1"\napi_key_env = ""',
            "providers.x.api_key_env: names no variable (leave it out for no key)",
        ),
        (  # a key pasted in place of its variable's name: logged as "key variable <the key> is unset"
            'kind = "fastrun"\nbase_url = "https://h/v1"\napi_key_env = "fr-live-Pasted0Secret"',
            "providers.x.api_key_env: is not an environment variable's name (letters, digits and _): "
            "name the variable that holds the secret",
        ),
        (  # the paths are appended to it: POST /v1?x=1/chat/completions
            'kind = "local"\nbase_url = "http://h/v1?x=1"',
            "providers.x.base_url: must not hold a query or a fragment (`?`, `#`)",
        ),
        (  # httpx made a probe's Basic auth of it, in place of the provider's key
            'kind = "fastrun"\nbase_url = "https://alice:pw@h/v1"',
            "providers.x.base_url: must not hold a user or password (`user:password@`): the key goes in api_key_env",
        ),
    ],
)
def test_a_provider_setting_that_would_do_nothing_exits_2_naming_it(tmp_path: Path, extra: str, message: str) -> None:
    config = write_config(tmp_path, extra=f"\n[providers.x]\n{extra}\n")
    result = run_cli(tmp_path, "catalog", "sync", "--config", str(config))
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"switchyard: {config}: {message}\n")


@pytest.mark.parametrize("value", ["sy-AdminSecretPasted", ""])
def test_an_admin_key_env_that_names_no_variable_exits_2_without_repeating_it(tmp_path: Path, value: str) -> None:
    config = write_config(tmp_path, extra=f'\n[auth]\nadmin_key_env = "{value}"\n')
    result = run_cli(tmp_path, "keys", "list", "--config", str(config))
    message = "is not an environment variable's name (letters, digits and _): name the variable that holds the secret"
    assert (result.returncode, result.stdout, result.stderr) == (
        2,
        "",
        f"switchyard: {config}: auth.admin_key_env: {message}\n",
    )


def test_a_redis_url_keeps_its_query_arguments(tmp_path: Path) -> None:
    """redis-py reads options from the query (`socket_timeout`): only a provider's base URL refuses one."""
    config = write_config(tmp_path, extra='\n[redis]\nurl = "redis://127.0.0.1:6379/0?socket_timeout=5"\n')
    result = run_cli(tmp_path, "db", "upgrade", "--config", str(config))
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgresql+asyncpg://u@h/db?command_timeout=30", None),  # asyncpg reads it with float()
        ("postgresql+asyncpg://u@h/db?ssl=require&direct_tls=true", None),
        ("postgresql+asyncpg://u@/db?host=/var/run/postgresql", None),
        ("sqlite+aiosqlite:///x.db?uri=true&mode=ro", None),  # SQLite's own URI arguments
        ("sqlite+aiosqlite:///x.db?uri=false&mode=ro", "the driver takes no argument 'mode'"),  # not a URI: ignored
        (
            "sqlite+aiosqlite:///:memory:",
            "an in-memory SQLite database is gone with its connection: the ledger, keys and catalog need a file",
        ),
        (
            "sqlite+aiosqlite:///x.db?uri=true&mode=memory",
            "an in-memory SQLite database is gone with its connection: the ledger, keys and catalog need a file",
        ),
    ],
)
def test_database_url_arguments_users_write(url: str, problem: str | None) -> None:
    found = database_url_problem(url)
    assert (found if problem is None else (found or "").split(" (")[0]) == problem


def test_an_empty_switchyard_config_is_unset_for_the_workers_factory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--config` empty is a mistake; the variable set empty is the variable unset (./config.toml)."""
    write_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SWITCHYARD_CONFIG", "")
    assert isinstance(create_app_from_env(), Litestar)  # it raised "--config: an empty path names no file"


def test_a_database_a_newer_switchyard_migrated_is_named_so_by_every_command(tmp_path: Path) -> None:
    """Stamped with a revision these scripts lack: `serve` said "run `switchyard db upgrade`", which
    failed with Alembic's "Can't locate revision"; a downgrade blamed its own argument (exit 2)."""
    config = write_config(tmp_path)
    assert run_cli(tmp_path, "db", "upgrade", "--config", str(config)).returncode == 0
    with sqlite3.connect(tmp_path / "switchyard.db") as connection:
        connection.execute("UPDATE alembic_version SET version_num = '9999abcd'")
    expected = (
        "the database is at schema revision 9999abcd, which this version of Switchyard does not know "
        "(a newer version migrated it): run that version, or downgrade the database with it first"
    )
    for command in (["db", "upgrade"], ["db", "downgrade", "0001"], ["keys", "list"]):
        result = run_cli(tmp_path, *command, "--config", str(config))
        assert (result.returncode, result.stdout) == (1, ""), command
        assert result.stderr.strip().endswith(expected), (command, result.stderr)


def test_a_sqlite_file_in_a_directory_that_does_not_exist_exits_2_naming_the_key(tmp_path: Path) -> None:
    """It was taken for a database outage: with a catalog saved by an earlier start the service
    ran, recording nothing to the database."""
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace(SQLITE_URL, 'url = "sqlite+aiosqlite:///gone/switchyard.db"'))
    result = run_cli(tmp_path, "db", "upgrade", "--config", str(config))
    assert (result.returncode, result.stdout) == (2, "")
    missing = tmp_path.resolve() / "gone"
    assert result.stderr == (
        f"switchyard: {config}: database.url: the directory {missing} does not exist (SQLite makes the file, not it)\n"
    )


def test_an_escaped_sqlite_path_is_locked_where_sqlite_opens_it(tmp_path: Path) -> None:
    """SQLAlchemy reads `%41` as `A`; the migration lock opened the raw text and left an empty
    `pct%41.db` beside the database."""
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace(SQLITE_URL, 'url = "sqlite+aiosqlite:///pct%41.db"'))
    assert run_cli(tmp_path, "db", "upgrade", "--config", str(config)).returncode == 0
    assert sorted(path.name for path in tmp_path.glob("pct*")) == ["pctA.db"]


@pytest.mark.parametrize(
    ("key", "text", "url"),
    [
        ("providers.local.base_url", "http://127.0.0.1:9/v1", "http://127.0.0.1:99999/v1"),
        ("database.url", "sqlite+aiosqlite:///switchyard.db", "postgresql+asyncpg://u@127.0.0.1:65536/db"),
    ],
)
def test_a_port_out_of_range_exits_2_saying_so(tmp_path: Path, key: str, text: str, url: str) -> None:
    """urllib's "out of range" was reported as "the port is not a number" (with advice on
    percent-encoding a password the URL does not have)."""
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace(text, url, 1))
    result = run_cli(tmp_path, "db", "upgrade", "--config", str(config))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"switchyard: {config}: {key}: ")
    assert result.stderr.rstrip().endswith("(the port must be from 1 to 65535)")


def test_a_provider_priority_past_32_bits_exits_2_naming_the_key(tmp_path: Path) -> None:
    """README: every number in the config has an upper bound; a provider's priority had none (a
    catalog deployment's is a 32-bit integer)."""
    config = write_config(tmp_path, extra="priority = 9223372036854775807\n")
    result = run_cli(tmp_path, "db", "upgrade", "--config", str(config))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"switchyard: {config}: providers.hosted.priority: Expected `int` <= 2147483647\n"
    assert not (tmp_path / "switchyard.db").exists()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+asyncpg://switchyard:1234567/x@127.0.0.1:5432/db",
        "postgresql+asyncpg://switchyard:70000?x@127.0.0.1/db",
        "postgresql+asyncpg://switchyard:99999#x@127.0.0.1/db",
    ],
)
def test_a_password_whose_slash_cut_the_host_short_is_no_port_out_of_range(url: str) -> None:
    """A `/`, `?` or `#` in a password ends the host: urllib reads the password's start as the
    port. Digits past 65535 are no port out of range: the advice is to percent-encode."""
    assert database_url_problem(url) == (
        "not a database URL (the port is not a number; percent-encode `/`, `?`, `#` and `@` in a user or "
        "password: `%2F`, `%3F`, `%23`, `%40`)"
    )


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://:1234567/x@127.0.0.1:6379/0", "the port is not a number; "),
        ("http://127.0.0.1:\u00b2/v1", "the port is not a number; "),  # a digit to `isdigit`, not to urllib
        ("http://[::1]:99999/v1", "the port must be from 1 to 65535"),
        ("http://u:p@127.0.0.1:99999/v1", "the port must be from 1 to 65535"),
    ],
)
def test_a_port_problem_names_what_is_wrong(url: str, problem: str) -> None:
    assert (url_problem(url) or "").startswith(f"not a URL ({problem}")
