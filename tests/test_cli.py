"""The `switchyard` console script, run the way an operator runs it: `python -m app.cli ...` subprocesses.

Each test writes its own `config.toml`, catalog file and SQLite database into `tmp_path` and checks
what the operator sees (exit codes, messages naming the key, the JSON sync report, the canonical
log line) and what lands in the database (read back with `sqlite3`, not through our code). `serve`
runs against a `mock-upstream` subprocess (harness: `tests/support/cli.py`); every wait is bounded and
every process a test starts is killed with its process group (uvicorn's workers too) in a `finally`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from tests.support.cli import (
    Process,
    cli_env,
    complete,
    processes,
    query,
    request_lines,
    run_cli,
    start_mock,
    tables,
    write_config,
)
from tests.support.ports import free_port, occupied_port

SECRET = "sk-test-SECRET-123"
PROMPT = "PROMPT-MARKER-quetzal-7f3a"
SCHEMA = {
    "alembic_version",
    "models",
    "model_aliases",
    "deployments",
    "prices",
    "ledger",
    "keys",
    "usage_hourly",
    "usage_daily",
    "usage_hourly_models",
    "usage_hourly_model_status",
}
PRICES = "SELECT provider, model_id, effective_from, input, output, cache_read FROM prices ORDER BY id"


# --- db and catalog ------------------------------------------------------------------------------


def test_db_upgrade_creates_the_schema_and_downgrade_base_removes_it(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    db = tmp_path / "switchyard.db"

    upgraded = run_cli(tmp_path, "db", "upgrade", "--config", str(config))
    assert (upgraded.returncode, upgraded.stderr) == (0, "")
    assert tables(db) == SCHEMA
    assert query(db, "SELECT count(*) FROM alembic_version") == [(1,)]

    downgraded = run_cli(tmp_path, "db", "downgrade", "base", "--config", str(config))
    assert (downgraded.returncode, downgraded.stderr) == (0, "")
    assert tables(db) == {"alembic_version"}
    assert query(db, "SELECT count(*) FROM alembic_version") == [(0,)]


def test_catalog_sync_reports_json_and_is_idempotent(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    db = tmp_path / "switchyard.db"
    first = run_cli(tmp_path, "catalog", "sync", "--config", str(config))  # fresh SQLite: migrates first
    assert (first.returncode, first.stderr) == (0, "")
    assert json.loads(first.stdout) == {
        "models": 2,
        "aliases": 1,
        "deployments": 2,
        "models_removed": 0,
        "prices_added": 2,
        "prices_unchanged": 0,
        "prices_ignored": 0,
    }
    rows = [
        ("local", "tiny", "2026-01-01 00:00:00.000000", "1.5000000000", "3.0000000000", None),
        ("hosted", "hosted-model", "2026-01-01 00:00:00.000000", "0.2500000000", "0.7500000000", None),
    ]
    assert query(db, PRICES) == rows

    second = run_cli(tmp_path, "catalog", "sync", "--config", str(config))
    assert second.returncode == 0
    report = json.loads(second.stdout)
    assert (report["prices_added"], report["prices_unchanged"], report["models_removed"]) == (0, 2, 0)
    assert query(db, PRICES) == rows
    assert query(db, "SELECT id, is_default FROM models ORDER BY id") == [("hosted-model", 0), ("tiny", 1)]
    assert query(db, "SELECT alias, model_id FROM model_aliases") == [("tiny-alias", "tiny")]
    assert query(db, "SELECT model_id, provider, upstream_model FROM deployments ORDER BY model_id") == [
        ("hosted-model", "hosted", "hosted-upstream"),
        ("tiny", "local", "tiny-upstream"),
    ]


def test_a_changed_price_becomes_a_new_row_and_the_old_one_stays(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    db = tmp_path / "switchyard.db"
    assert run_cli(tmp_path, "catalog", "sync", "--config", str(config)).returncode == 0
    catalog = tmp_path / "models.toml"
    catalog.write_text(catalog.read_text().replace('input = "1.5"', 'input = "1.75"'))

    changed = run_cli(tmp_path, "catalog", "sync", "--config", str(config))
    assert changed.returncode == 0, changed.stderr
    report = json.loads(changed.stdout)
    assert (report["prices_added"], report["prices_unchanged"]) == (1, 1)
    rows = query(db, PRICES)
    assert [row[:2] + row[3:] for row in rows] == [
        ("local", "tiny", "1.5000000000", "3.0000000000", None),
        ("hosted", "hosted-model", "0.2500000000", "0.7500000000", None),
        ("local", "tiny", "1.7500000000", "3.0000000000", None),
    ]
    assert rows[0][2] == "2026-01-01 00:00:00.000000"
    assert rows[2][2] > rows[0][2]  # the change takes effect from the sync on, never retroactively

    again = run_cli(tmp_path, "catalog", "sync", "--config", str(config))
    assert json.loads(again.stdout)["prices_added"] == 0
    assert len(query(db, PRICES)) == 3


# --- usage and configuration errors: exit 2, naming the key --------------------------------------


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ('[server]\nport = "x"', "server.port: Expected `int`, got `str`"),
        ("[server]\nport = 70000", "server.port: Expected `int` <= 65535"),
        (
            '[providers.x]\nkind = "bogus"\nbase_url = "http://127.0.0.1:1/v1"',
            "providers.x.kind: Invalid enum value 'bogus'",
        ),
        ('[providers.x]\nkind = "local"', "providers.x: Object missing required field `base_url`"),
        ('[providers.x]\nkind = "local"\nbase_url = "ftp://h"', "providers.x.base_url: Expected `str` matching"),
        ("[server]\nprot = 8080", "server.prot: unknown key"),
        ("[providers.local.timeouts]\nconect = 1.0", "providers.local.timeouts.conect: unknown key"),
        ("[nonsense]", "nonsense: unknown key"),
        ('[providers."Bad Name"]\nkind = "local"\nbase_url = "http://h"', 'providers."Bad Name": a provider name'),
        ("[server\nport = 1", "not valid TOML"),
        # values the types took that broke start-up (a traceback): bounded now
        (
            '[providers.x]\nkind = "local"\nbase_url = "http://h"\nbreaker_window = 9223372036854775808',
            "providers.x.breaker_window: Expected `int` <= 2147483647",
        ),
        ("[routing]\nrequest_deadline_s = inf", "routing.request_deadline_s: Expected `float` <= 10000000.0"),
        ('[ledger]\njournal = "a\\u0000b"', "ledger.journal: Expected `str` matching regex"),
        # URLs the clients could not use: `serve` died with a traceback (httpx, redis-py), or
        # redis-py read `/fifteen` as database 0
        ('[providers.x]\nkind = "local"\nbase_url = "http://a:abc/v1"', "providers.x.base_url: not a URL"),
        ('[providers.x]\nkind = "local"\nbase_url = "http://a:99999/v1"', "providers.x.base_url: not a URL"),
        ('[providers.x]\nkind = "local"\nbase_url = "http://"', "providers.x.base_url: names no host"),
        ('[providers.x]\nkind = "local"\nbase_url = "http://a/v1\\nHost: b"', "providers.x.base_url: must not hold"),
        ('[redis]\nurl = "redis://127.0.0.1:abc/15"', "redis.url: not a URL"),
        ('[redis]\nurl = "redis://127.0.0.1:6379/fifteen"', "redis.url: the path is the database number"),
    ],
)
def test_an_invalid_config_exits_2_naming_the_key(tmp_path: Path, extra: str, key: str) -> None:
    config = write_config(tmp_path, extra=extra)
    commands = [["catalog", "sync"], ["db", "upgrade"], ["serve", "--port", "9"]]
    for args in commands if key.startswith("server.port") else commands[:1]:
        result = run_cli(tmp_path, *args, "--config", str(config))
        assert (result.returncode, result.stdout) == (2, ""), (args, result.stderr)
        assert result.stderr.startswith(f"switchyard: {config}: ")
        assert key in result.stderr
    assert not (tmp_path / "switchyard.db").exists()


@pytest.mark.parametrize("url", ["mysql://root@127.0.0.1/test", "not a url", "sqlite:///x.db", "postgresql://u@h/d"])
def test_a_database_url_without_an_installed_driver_exits_2_naming_the_key(tmp_path: Path, url: str) -> None:
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace('url = "sqlite+aiosqlite:///switchyard.db"', f'url = "{url}"'))
    result = run_cli(tmp_path, "catalog", "sync", "--config", str(config))
    assert (result.returncode, result.stdout) == (2, "")
    expected = "database.url: must be sqlite+aiosqlite:///PATH or postgresql+asyncpg://USER@HOST:PORT/DB, not "
    assert result.stderr.startswith(f"switchyard: {config}: {expected}{url.split(':', 1)[0]!r}")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (
            "postgresql+asyncpg://u@h:notaport/db",
            "not a database URL (the port is not a number; percent-encode `/`, `?`, `#` and `@` in a user or password: "
            "`%2F`, `%3F`, `%23`, `%40`)",
        ),
        ("sqlite+aiosqlite://db.sqlite", "(a file path after the third slash)"),
        ("sqlite+aiosqlite:///", "(a file path after the third slash)"),
        ("postgresql+asyncpg://", "(it names no database)"),  # it connected to whatever the driver picked
    ],
)
def test_a_database_url_that_names_no_database_exits_2_naming_the_key(tmp_path: Path, url: str, problem: str) -> None:
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace('url = "sqlite+aiosqlite:///switchyard.db"', f'url = "{url}"'))
    result = run_cli(tmp_path, "catalog", "sync", "--config", str(config))
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.startswith(f"switchyard: {config}: database.url: ")
    assert result.stderr.rstrip().endswith(problem)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "postgresql+asyncpg://127.0.0.1:5432/switchyard_no_such_database",
            'database error: database "switchyard_no_such_database" does not exist',
        ),
        # a directory that exists and takes no file (a missing one is exit 2: tests/test_cli_config.py)
        ("sqlite+aiosqlite:////proc/switchyard-none.db", "database error: unable to open database file"),
    ],
    ids=["postgres-missing-database", "sqlite-unopenable-file"],
)
def test_a_database_that_fails_exits_1_with_the_drivers_message_alone(tmp_path: Path, url: str, message: str) -> None:
    """The driver's words, without SQLAlchemy's statement, parameters and "Background" link."""
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace('url = "sqlite+aiosqlite:///switchyard.db"', f'url = "{url}"'))
    result = run_cli(tmp_path, "keys", "create", "--name", "k", "--config", str(config))  # one that makes a database
    assert (result.returncode, result.stdout, result.stderr) == (1, "", f"switchyard: {message}\n")


def test_a_config_file_that_is_not_utf8_exits_2_naming_it(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    config.write_bytes(b"# caf\xe9\n" + config.read_bytes())
    result = run_cli(tmp_path, "db", "upgrade", "--config", str(config))
    assert (result.returncode, result.stderr) == (
        2,
        f"switchyard: {config}: not UTF-8 (TOML is): byte 5 cannot be read\n",
    )


def test_a_float_price_in_the_catalog_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    catalog = tmp_path / "models.toml"
    catalog.write_text(catalog.read_text().replace('input = "0.25"', "input = 0.25"))
    for args in (["catalog", "sync"], ["serve", "--port", "9"]):
        result = run_cli(tmp_path, *args, "--config", str(config))
        assert result.returncode == 2, result.stderr
        assert result.stderr == (
            'switchyard: models.toml: prices[1].input: money is written as a string, e.g. "0.10" '
            "(a float is not exact)\n"
        )


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("prices/*.toml", "'prices/*.toml' matches no file under {tmp_path}"),
        ("**a", "'**a' is not a file name or glob pattern"),
    ],
)
def test_a_catalog_pattern_the_files_do_not_answer_exits_2_naming_the_config_file(
    tmp_path: Path, pattern: str, problem: str
) -> None:
    """As every other error about a setting: the operator with several config files sees which."""
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace('files = ["models.toml"]', f'files = ["{pattern}"]'))
    expected = f"switchyard: {config}: catalog.files: {problem.format(tmp_path=tmp_path)}\n"
    for args in (["catalog", "sync"], ["serve", "--port", "9"]):
        result = run_cli(tmp_path, *args, "--config", str(config))
        assert (result.returncode, result.stderr) == (2, expected), args
    result = run_cli(tmp_path, "keys", "create", "--name", "k", "--models", "m", "--config", str(config))
    assert (result.returncode, result.stderr) == (
        2,
        expected.replace(": ", ": models: the catalog cannot be read: ", 1),
    )


def test_a_missing_config_file_exits_2_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    result = run_cli(tmp_path, "catalog", "sync", "--config", str(missing))
    assert (result.returncode, result.stderr) == (2, f"switchyard: {missing}: config file not found\n")
    from_env = run_cli(tmp_path, "db", "upgrade", env=cli_env(SWITCHYARD_CONFIG=str(missing)))
    assert (from_env.returncode, from_env.stderr) == (2, f"switchyard: {missing}: config file not found\n")


def test_switchyard_config_is_honoured_and_config_flag_wins(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    by_env = run_cli(elsewhere, "catalog", "sync", env=cli_env(SWITCHYARD_CONFIG=str(config)))
    assert by_env.returncode == 0, by_env.stderr
    assert json.loads(by_env.stdout)["prices_added"] == 2
    assert (tmp_path / "switchyard.db").exists()  # relative to the config file, not the working dir
    env = cli_env(SWITCHYARD_CONFIG=str(tmp_path / "missing.toml"))
    by_flag = run_cli(elsewhere, "catalog", "sync", "--config", str(config), env=env)
    assert by_flag.returncode == 0, by_flag.stderr
    assert json.loads(by_flag.stdout)["prices_unchanged"] == 2


_INTERRUPTED_IMPORT = """
import sys
class Interrupt:  # a Ctrl-C while `app.cli` and what it imports are being imported
    def find_spec(self, name, path=None, target=None):
        if name == "app.cli":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Interrupt())
from app.console import main
sys.exit(main())
"""


def test_a_ctrl_c_while_the_command_imports_ends_it_quietly() -> None:
    """The console script (`app.console:main`) exits 1 with nothing printed, as a Ctrl-C later
    does: it used to print the import's traceback (the first half second of every command)."""
    done = subprocess.run([sys.executable, "-c", _INTERRUPTED_IMPORT], capture_output=True, text=True, env=cli_env())
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "")
    usage = "import sys; from app.console import main; sys.argv = ['switchyard', 'db', 'sideways']; sys.exit(main())"
    forwarded = subprocess.run([sys.executable, "-c", usage], capture_output=True, text=True, env=cli_env())
    assert forwarded.returncode == 2, forwarded.stderr
    assert "invalid choice: 'sideways'" in forwarded.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["launch"],
        [],
        ["db"],
        ["db", "sideways"],
        ["catalog"],
        ["serve", "--port", "x"],
        ["mock-upstream", "--port", "70000"],  # it listened on 70000 modulo 65536
        ["mock-upstream", "--fail-status", "99"],  # it answered a status no client reads
        ["mock-upstream", "--latency-ms", "-5"],
        ["mock-upstream", "--chunk-delay-ms", "nan"],
    ],
)
def test_bad_usage_exits_2(tmp_path: Path, args: list[str]) -> None:
    result = run_cli(tmp_path, *args)
    assert result.returncode == 2
    assert "usage: switchyard" in result.stderr
    assert result.stdout == ""


# --- serve ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_answers_logs_one_line_per_request_and_stops_on_a_signal(tmp_path: Path, signum: signal.Signals) -> None:
    with processes() as started:
        config = write_config(tmp_path, start_mock(tmp_path, started))
        port = free_port()
        env = cli_env(SWITCHYARD_CONFIG=str(config), SWITCHYARD_TEST_HOSTED_KEY=SECRET)
        started.append(serve := Process(tmp_path, "serve", ["serve", "--port", str(port)], env))
        base = f"http://127.0.0.1:{port}"
        serve.wait_http(f"{base}/healthz")
        health = httpx.get(f"{base}/healthz")
        assert health.json() == {"status": "ok"}
        assert "server" not in health.headers  # the stack is not advertised
        assert "date" in health.headers
        ready = {"status": "ok", "database": True, "backends": True, "ledger": "ok"}
        assert httpx.get(f"{base}/readyz").json() == ready
        bodies = [complete(base, "tiny-alias", PROMPT), complete(base, "hosted-model", PROMPT)]
        assert [(b["model"], b["provider"]) for b in bodies] == [("tiny", "local"), ("hosted-model", "hosted")]
        assert bodies[0]["message"]["content"] == [{"kind": "text", "data": "alpha beta gamma delta"}]
        assert serve.stop(signum) in (0, -signum)
        stdout, stderr = serve.output()
    lines = request_lines(stdout)
    assert [(line["request_id"], line["model"], line["provider"]) for line in lines] == [
        (b["id"], b["model"], b["provider"]) for b in bodies
    ]
    for line, body, (rate_in, rate_out) in zip(lines, bodies, [("1.5", "3"), ("0.25", "0.75")], strict=True):
        usage = body["usage"]
        assert (line["status"], line["input_tokens"], line["output_tokens"]) == ("ok", usage["input_tokens"], 4)
        expected = (usage["input_tokens"] * Decimal(rate_in) + 4 * Decimal(rate_out)) / 1_000_000
        assert Decimal(line["cost_usd"]) == expected == Decimal(str(body["cost_usd"]))
        assert isinstance(line["latency_ms"], int | float)
        assert line["latency_ms"] >= 0
    for text in (stdout, stderr):
        assert PROMPT not in text
        assert SECRET not in text
    assert "HTTP Request:" not in stderr  # no per-request lines besides the canonical one


def test_serve_with_two_workers_answers(tmp_path: Path) -> None:
    with processes() as started:
        config = write_config(tmp_path, start_mock(tmp_path, started))
        port = free_port()
        args = ["serve", "--config", str(config), "--port", str(port), "--workers", "2"]
        started.append(serve := Process(tmp_path, "serve", args, cli_env(SWITCHYARD_TEST_HOSTED_KEY=SECRET)))
        base = f"http://127.0.0.1:{port}"
        serve.wait_http(f"{base}/healthz")
        ready = {"status": "ok", "database": True, "backends": True, "ledger": "ok"}
        assert httpx.get(f"{base}/readyz").json() == ready
        ids = {complete(base, "tiny", PROMPT)["id"] for _ in range(4)}
        assert serve.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
        stdout, stderr = serve.output()
    lines = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    assert [line["event"] for line in lines].count("started") == 2  # one per worker process
    assert {line["request_id"] for line in request_lines(stdout)} == ids
    assert SECRET not in stdout + stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_a_port_in_use_exits_1(tmp_path: Path, workers: str) -> None:
    config = write_config(tmp_path)
    with occupied_port() as port:
        result = run_cli(tmp_path, "serve", "--config", str(config), "--port", str(port), "--workers", workers)
    assert (result.returncode, result.stdout) == (1, "")
    message = f"switchyard: cannot listen on 127.0.0.1:{port}: Address already in use (--host/--port)\n"
    assert result.stderr == message  # one line, uvicorn's own (a second, in another format) no more


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (("--workers", "-1"), "argument --workers: must be from 1 to 64, not -1"),
        (("--workers", "0"), "argument --workers: must be from 1 to 64, not 0"),
        (("--workers", "65"), "argument --workers: must be from 1 to 64, not 65"),
        (("--port", "99999"), "argument --port: must be from 0 to 65535, not 99999"),
        (("--port", "http"), "argument --port: not an integer: 'http'"),
    ],
)
def test_serve_options_out_of_range_are_usage_errors(tmp_path: Path, option: tuple[str, str], message: str) -> None:
    """Exit 2 naming the option, as a bad config value does (a negative worker count used to log
    `listening` with no worker behind it; 0 fell back to the config's count)."""
    result = run_cli(tmp_path, "serve", "--config", str(write_config(tmp_path)), *option)
    assert result.returncode == 2
    assert message in result.stderr
