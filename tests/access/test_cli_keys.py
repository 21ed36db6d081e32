"""`switchyard keys create|list|update|revoke` on the configured (SQLite) database, no server; a
running server without Redis sees CLI changes within 5 seconds; `serve` refuses several workers
with limited keys and no Redis."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.support.cli import Process, cli_env, processes, query, run_cli, start_mock, write_config
from tests.support.client import COMPLETIONS, body
from tests.support.ports import free_port
from tests.support.waiting import wait_until_sync

KEYS_MODE = '\n[auth]\nmode = "keys"\n'


def _keys(tmp_path: Path, *args: str) -> str:
    result = run_cli(tmp_path, "keys", *args, "--config", str(tmp_path / "config.toml"))
    assert result.returncode == 0, result.stderr
    return result.stdout


def _list(tmp_path: Path) -> list[dict[str, Any]]:
    keys: list[dict[str, Any]] = json.loads(_keys(tmp_path, "list", "--format", "json"))
    return keys


def test_create_list_update_revoke(tmp_path: Path) -> None:
    write_config(tmp_path, extra=KEYS_MODE)
    secret = _keys(tmp_path, "create", "--name", "ci", "--owner", "team-a", "--models", "tiny,hosted-model",
                   "--budget-usd", "50", "--budget-period", "month", "--rpm", "600", "--tpm", "200000",
                   "--max-concurrency", "20", "--expires", "2027-01-01")  # fmt: skip
    assert secret.count("\n") == 1
    secret = secret.strip()
    assert secret.startswith("sy-")
    (key,) = _list(tmp_path)
    assert {k: v for k, v in key.items() if k not in ("id", "prefix", "created_at", "updated_at")} == {
        "name": "ci",
        "owner": "team-a",
        "models": ["tiny", "hosted-model"],
        "budget_usd": "50",
        "budget_period": "month",
        "rpm": 600,
        "tpm": 200000,
        "max_concurrency": 20,
        "expires_at": "2027-01-01T00:00:00Z",
        "revoked_at": None,
    }
    assert key["prefix"] == secret[:7]
    table = _keys(tmp_path, "list").splitlines()
    assert table[0].split() == ["id", "name", "owner", "prefix", "models", "budget", "rpm", "tpm",
                                "max_concurrency", "expires", "state"]  # fmt: skip
    assert table[1].split()[:7] == [
        key["id"],
        "ci",
        "team-a",
        f"{secret[:7]}…",
        "tiny,hosted-model",
        "$50/month",
        "600",
    ]

    updated = json.loads(_keys(tmp_path, "update", key["id"], "--rpm", "5", "--models", "none", "--format", "json"))
    assert (updated["rpm"], updated["models"], updated["tpm"]) == (5, None, 200000)
    revoked = _keys(tmp_path, "revoke", key["id"])
    assert revoked.splitlines()[1].split()[-1] == "revoked"
    assert _list(tmp_path)[0]["revoked_at"] is not None

    rows = query(tmp_path / "switchyard.db", "SELECT * FROM keys")
    assert hashlib.sha256(secret.encode()).hexdigest() in rows[0]
    assert not any(secret in str(value) or secret[7:] in str(value) for value in rows[0])


def test_create_json_and_bad_options(tmp_path: Path) -> None:
    write_config(tmp_path, extra=KEYS_MODE)
    created = json.loads(_keys(tmp_path, "create", "--name", "j", "--expires", "2027-01-01T12:00:00+02:00",
                               "--format", "json"))  # fmt: skip
    assert created["secret"].startswith("sy-")
    assert created["expires_at"] == "2027-01-01T10:00:00Z"
    config = str(tmp_path / "config.toml")
    for bad in (
        ["--rpm", "x"],
        ["--budget-period", "day"],
        ["--expires", "soon"],
        ["--expires", "9999-12-31T23:00:00-12:00"],  # the year 10000 in UTC: it was a traceback
        ["--rpm", "9223372036854775808"],  # past the INTEGER column: it was an OverflowError
        ["--budget-usd", "1e309"],  # past what the column and the limiter hold: it was an SQL dump
        ["--budget-usd", "1.00000000015"],  # below a nano-dollar's precision: it was rounded silently
        ["--budget-usd", "-1"],
        ["--budget-usd", "0.0000000000001"],  # below a nano-dollar: it was stored as 0
        ["--models", "tiny,nosuch"],  # not in the catalog: it was stored, and matched nothing
        ["--models", ""],  # no model at all: it was stored as [], and allowed none
    ):
        result = run_cli(tmp_path, "keys", "create", "--name", "b", *bad, "--config", config)
        assert result.returncode == 2, (bad, result.stderr)
        assert result.stderr.startswith("switchyard: ")
    superscript = run_cli(tmp_path, "keys", "create", "--name", "b", "--max-concurrency", "\u00b3", "--config", config)
    # a digit to `isdigit`, not a number to `int`: it was a message naming no option
    assert (superscript.returncode, superscript.stderr) == (
        2,
        "switchyard: --max-concurrency: '\u00b3' is not a whole number\n",
    )
    for loose in ("5_0", " 5", "1e3"):  # Decimal() read them as 50, 5 and 1000
        result = run_cli(tmp_path, "keys", "create", "--name", "b", "--budget-usd", loose, "--config", config)
        message = f"switchyard: --budget-usd: '{loose}' is not an amount (digits, a point and digits: 25 or 25.50)\n"
        assert (result.returncode, result.stderr) == (2, message)
    blank = run_cli(tmp_path, "keys", "create", "--name", " ", "--config", config)
    assert (blank.returncode, blank.stderr) == (2, "switchyard: name: must not be empty\n")
    budget = json.loads(_keys(tmp_path, "create", "--name", "b", "--budget-usd", "1", "--format", "json"))
    no_period = run_cli(tmp_path, "keys", "update", budget["id"], "--budget-period", "none", "--config", config)
    assert no_period.returncode == 2
    assert no_period.stderr.startswith("switchyard: budget_period: a budget needs a period")
    aliased = json.loads(_keys(tmp_path, "create", "--name", "a", "--models", "tiny-alias", "--format", "json"))
    assert aliased["models"] == ["tiny"]  # the catalog id
    expired = json.loads(_keys(tmp_path, "create", "--name", "old", "--expires", "2020-01-01", "--format", "json"))
    states = {line.split()[0]: line.split()[-1] for line in _keys(tmp_path, "list").splitlines()[1:]}
    assert (states[expired["id"]], states[created["id"]]) == ("expired", "active")
    missing = run_cli(tmp_path, "keys", "revoke", "key_nope", "--config", config)
    assert (missing.returncode, missing.stderr) == (1, "switchyard: no key 'key_nope'\n")
    pasted = run_cli(tmp_path, "keys", "revoke", created["secret"], "--config", config)  # the secret, not the id
    assert (pasted.returncode, pasted.stderr) == (1, "switchyard: no key with that id (it is a secret)\n")
    long = run_cli(tmp_path, "keys", "create", "--name", "n" * 201, "--config", config)  # PostgreSQL refused it: exit 1
    assert (long.returncode, long.stderr) == (2, "switchyard: name: at most 200 characters\n")
    assert len(_list(tmp_path)) == 4


def test_update_or_revoke_run_beside_no_database_make_none(tmp_path: Path) -> None:
    """Run from a directory without the database (the bundled config, another config), they made an
    empty one there and said "no key", as if the key did not exist; a listing says what is wrong."""
    config = str(write_config(tmp_path))
    for command in (["revoke", "key_0123456789abcdef"], ["update", "key_0123456789abcdef", "--rpm", "5"]):
        result = run_cli(tmp_path, "keys", *command, "--config", config)
        assert (result.returncode, result.stdout) == (1, ""), command
        assert "no database at " in result.stderr, (command, result.stderr)
        assert not (tmp_path / "switchyard.db").exists(), command


def test_serve_refuses_workers_with_limited_keys_and_no_redis(tmp_path: Path) -> None:
    config = write_config(tmp_path, extra=KEYS_MODE)
    _keys(tmp_path, "create", "--name", "free-for-all")
    _keys(tmp_path, "create", "--name", "limited", "--rpm", "10")
    result = run_cli(tmp_path, "serve", "--config", str(config), "--port", str(free_port()), "--workers", "2")
    assert result.returncode == 2
    assert "need [redis]" in result.stderr


def test_a_running_server_sees_cli_changes_within_5_seconds(tmp_path: Path) -> None:
    with processes() as started:
        config = write_config(tmp_path, start_mock(tmp_path, started), extra=KEYS_MODE)
        port = free_port()
        started.append(server := Process(tmp_path, "serve", ["serve", "--config", str(config), "--port", str(port)],
                                         cli_env()))  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        server.wait_http(f"{base}/healthz")
        secret = _keys(tmp_path, "create", "--name", "late").strip()

        def status() -> int:
            headers = {"authorization": f"Bearer {secret}"}
            return httpx.post(f"{base}{COMPLETIONS}", json=body("tiny"), headers=headers, timeout=10).status_code

        wait_until_sync(lambda: status() == 200, within=5.0, what="the new key accepted")
        _keys(tmp_path, "revoke", _list(tmp_path)[0]["id"])
        wait_until_sync(lambda: status() == 401, within=5.0, what="the revoked key refused")


def test_a_change_redis_cannot_announce_is_said(tmp_path: Path) -> None:
    """With `[redis]` configured but unreachable, the CLI still changes the key in the database and
    says that running servers see it only at their next poll."""
    port = free_port()  # nothing listens there
    write_config(tmp_path, extra=KEYS_MODE + f'\n[redis]\nurl = "redis://127.0.0.1:{port}/0"\n')
    config = str(tmp_path / "config.toml")
    created = run_cli(tmp_path, "keys", "create", "--name", "k", "--format", "json", "--config", config)
    assert created.returncode == 0, created.stderr
    assert created.stderr == (
        "switchyard: warning: Redis could not be reached, so running servers see this change at their "
        "next poll (every 0.5 s; 10 s at the latest), not at once\n"
    )
    key = json.loads(created.stdout)
    revoked = run_cli(tmp_path, "keys", "revoke", key["id"], "--config", config)
    assert revoked.returncode == 0
    assert "Redis could not be reached" in revoked.stderr
    assert _list(tmp_path)[0]["revoked_at"] is not None


def test_create_names_the_new_keys_id_and_warns_of_a_past_expiry(tmp_path: Path) -> None:
    """The secret alone on stdout (for `$(…)`); the id the other commands take was nowhere but in
    `keys list`, and a key created expired said nothing."""
    write_config(tmp_path, extra=KEYS_MODE)
    created = run_cli(
        tmp_path,
        "keys",
        "create",
        "--name",
        "old",
        "--expires",
        "2020-01-01",
        "--config",
        str(tmp_path / "config.toml"),
    )
    assert created.returncode == 0, created.stderr
    (key,) = _list(tmp_path)
    assert created.stdout == f"{created.stdout.strip()}\n"
    assert created.stdout.startswith(key["prefix"])
    assert created.stderr == (
        f"switchyard: created {key['id']}; the secret is shown this once\n"
        f"switchyard: warning: {key['id']} has expired already\n"
    )


def test_a_reader_that_goes_away_is_no_error(tmp_path: Path) -> None:
    """`switchyard keys list | head -1`: the list's reader is gone before it ends; the command
    printed a BrokenPipeError (or Python's "Exception ignored" at exit, status 120). It ends
    quietly, with a shell tool's status (141: not a success, for `keys create`: its secret was
    never read), and says nothing of a key it could not show."""
    write_config(tmp_path, extra=KEYS_MODE)
    for n in range(3):
        _keys(tmp_path, "create", "--name", f"k{n}")
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    listing = subprocess.run(
        [sys.executable, "-m", "app.cli", "keys", "list", "--config", str(tmp_path / "config.toml")],
        cwd=tmp_path, env=cli_env(), stdout=write, stderr=subprocess.PIPE, text=True, timeout=60,
    )  # fmt: skip
    assert (listing.returncode, listing.stderr) == (141, "")
    made = subprocess.run(
        [sys.executable, "-m", "app.cli", "keys", "create", "--name", "x", "--config", str(tmp_path / "config.toml")],
        cwd=tmp_path, env=cli_env(), stdout=write, stderr=subprocess.PIPE, text=True, timeout=60,
    )  # fmt: skip
    os.close(write)
    assert (made.returncode, made.stderr) == (141, "")  # no "created", no success: the secret was lost


def test_a_limit_several_processes_without_redis_cannot_keep_is_refused_by_the_cli_too(tmp_path: Path) -> None:
    """As the admin API refuses it: created, it made the deployment unstartable (`serve` exits 2)."""
    config = write_config(tmp_path, extra=KEYS_MODE + "\n[server]\nreplicas = 2\n")
    refused = run_cli(tmp_path, "keys", "create", "--name", "b", "--max-concurrency", "3", "--config", str(config))
    message = "switchyard: --max-concurrency: limits need [redis] here: 2 processes share them\n"
    assert (refused.returncode, refused.stdout, refused.stderr) == (2, "", message)
    plain = json.loads(_keys(tmp_path, "create", "--name", "p", "--format", "json"))
    budget = run_cli(tmp_path, "keys", "update", plain["id"], "--budget-usd", "1", "--config", str(config))
    assert (budget.returncode, budget.stderr) == (
        2,
        "switchyard: --budget-usd: limits need [redis] here: 2 processes share them\n",
    )
    assert [(key["name"], key["budget_usd"], key["max_concurrency"]) for key in _list(tmp_path)] == [("p", None, None)]
    write_config(
        tmp_path, extra="\n[server]\nreplicas = 2\n"
    )  # no keys mode: `serve` counts no limit, so none is refused
    later = run_cli(tmp_path, "keys", "create", "--name", "l", "--rpm", "5", "--config", str(config))
    assert (later.returncode, later.stderr.startswith("switchyard: created key_")) == (0, True)
