"""Starting the service the way an operator does: a config copied away from the repository, the
`listening` line, and failed starts that leave no database file behind.

`switchyard` runs as a subprocess (`tests/support/cli.py`); the database is read back with `sqlite3`.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from app.settings import (
    AuthSettings,
    CatalogSettings,
    DatabaseSettings,
    LedgerSettings,
    ProviderSettings,
    RedisSettings,
    RoutingSettings,
    ServerSettings,
    TimeoutSettings,
)
from tests.support.cli import REPO, Process, cli_env, processes, run_cli, tables, write_config
from tests.support.client import COMPLETIONS, body
from tests.support.ports import free_port
from tests.support.waiting import wait_until_sync

SQLITE_FILES = ("switchyard.db", "switchyard.db-wal", "switchyard.db-shm", "switchyard.db-journal")


def _leftovers(directory: Path) -> list[str]:
    return [name for name in SQLITE_FILES if (directory / name).exists()]


def _log_lines(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_the_example_config_copied_elsewhere_syncs_and_serves_the_bundled_catalog(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    config = etc / "config.toml"
    shutil.copy(REPO / "config.example.toml", config)  # no catalog/ folder beside it
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    env = cli_env(SWITCHYARD_CONFIG=str(config))
    bundled = tomllib.loads((REPO / "catalog" / "models.toml").read_text())

    synced = run_cli(elsewhere, "catalog", "sync", env=env)
    assert (synced.returncode, synced.stderr) == (0, "")
    report = json.loads(synced.stdout)
    assert (report["models"], report["prices_added"]) == (len(bundled["models"]), len(bundled["prices"]))
    assert "ledger" in tables(etc / "switchyard.db")  # the database is relative to the config file

    with processes() as started:
        port = free_port()
        started.append(serve := Process(elsewhere, "serve", ["serve", "--port", str(port)], env))
        base = f"http://127.0.0.1:{port}"
        serve.wait_http(f"{base}/healthz")
        models = {model["id"] for model in httpx.get(f"{base}/api/v1/models").json()["data"]}
        assert models == set(bundled["models"])
        assert serve.stop(signal.SIGTERM) == 0  # config.md: 0 success (uvicorn's re-raised SIGTERM made it -15)
        stdout, stderr = serve.output()
    lines = _log_lines(stdout)
    listening = [line for line in lines if line["event"].startswith("listening on ")]
    assert [(line["event"], line["url"]) for line in listening] == [(f"listening on {base}", base)]
    events = [line["event"] for line in lines]
    assert events.index("started") < events.index(f"listening on {base}")
    assert "Traceback" not in stderr


def test_two_workers_log_listening_once_with_the_bound_address(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    with processes() as started:
        port = free_port()
        args = ["serve", "--config", str(config), "--port", str(port), "--workers", "2"]
        started.append(serve := Process(tmp_path, "serve", args, cli_env()))
        base = f"http://127.0.0.1:{port}"
        serve.wait_http(f"{base}/healthz")
        assert serve.stop(signal.SIGTERM) == 0
        stdout, _ = serve.output()
    listening = [line for line in _log_lines(stdout) if line["event"].startswith("listening on ")]
    assert [(line["event"], line["level"]) for line in listening] == [(f"listening on {base}", "info")]
    warned = [line for line in _log_lines(stdout) if line["event"] == "metrics_per_worker"]
    assert [(line["level"], line["workers"]) for line in warned] == [("warning", 2)]  # no [redis] here


def test_a_catalog_error_leaves_no_database_file(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    catalog = tmp_path / "models.toml"
    catalog.write_text(catalog.read_text().replace('provider = "hosted"\nmodel = "hosted-model"', 'provider = "x"'))
    for args in (["catalog", "sync"], ["serve", "--port", str(free_port())]):
        result = run_cli(tmp_path, *args, "--config", str(config))
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("switchyard: models.toml: prices[1]")
        assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_start_that_cannot_bind_removes_the_database_it_created_and_keeps_one_it_found(
    tmp_path: Path, workers: str
) -> None:
    config = write_config(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        serve = ["serve", "--config", str(config), "--port", port, "--workers", workers]
        fresh = run_cli(tmp_path, *serve)
        assert fresh.returncode == 1, fresh.stderr
        assert "address already in use" in fresh.stderr.lower()
        assert _leftovers(tmp_path) == []  # it was migrated and synced before the bind failed

        assert run_cli(tmp_path, "catalog", "sync", "--config", str(config)).returncode == 0
        existing = run_cli(tmp_path, *serve)
        assert existing.returncode == 1, existing.stderr
    assert "ledger" in tables(tmp_path / "switchyard.db")  # not this start's to remove


def test_access_log_is_refused_naming_the_key(tmp_path: Path) -> None:
    config = write_config(tmp_path, extra="[server]\naccess_log = true\n")
    result = run_cli(tmp_path, "serve", "--config", str(config), "--port", str(free_port()))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"switchyard: {config}: server.access_log: no longer a setting "
        "(the `request` log line is the access log); delete it\n"
    )
    assert _leftovers(tmp_path) == []


def test_every_config_key_is_in_the_example() -> None:
    """config.md: config.example.toml shows every key (commented where it is optional)."""
    text = (REPO / "config.example.toml").read_text()
    sections = (
        ServerSettings,
        DatabaseSettings,
        AuthSettings,
        CatalogSettings,
        LedgerSettings,
        TimeoutSettings,
        ProviderSettings,
        RedisSettings,
        RoutingSettings,
    )
    missing = [
        f"{section.__name__}.{name}"
        for section in sections
        for name in section.__struct_fields__
        if not re.search(rf"^#? *({name} *=|\[.*\.{name}\])", text, re.MULTILINE)  # a key, or a table
    ]
    assert missing == []


def listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on `port` (IPv4), from /proc/net/tcp."""
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return {row[9] for row in rows if row[1].endswith(f":{port:04X}") and row[3] == "0A"}


def holders(inodes: set[str]) -> set[str]:
    """The command lines of the processes holding a descriptor of one of `inodes`."""
    found = set()
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            target = fd.readlink().name
        except OSError:  # gone, or not ours to read
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            found.add(fd.parent.parent.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode())
    return found


def test_a_sqlite_gateway_holds_its_port_alone_and_a_sigterm_stop_exits_0_keeping_its_database(
    tmp_path: Path,
) -> None:
    """uvicorn's listening socket is inheritable and uvloop's spawn keeps it, so the SQLite writer
    (`catalog.sqlite_child`) held the port: once the server closed it to drain, new connections
    were accepted and never answered, and a new server could not bind the port until the drain
    ended. uvicorn re-raises the SIGTERM it handled after its shutdown: that killed the process
    (-15), and once it exited 0 instead the start guard took the run for a failed start and removed
    the SQLite database this start had created, the ledger and the keys with it."""
    config = write_config(tmp_path)
    with processes() as started:
        port = free_port()
        args = ["serve", "--config", str(config), "--port", str(port)]
        started.append(serve := Process(tmp_path, "serve", args, cli_env()))
        serve.wait_http(f"http://127.0.0.1:{port}/healthz")
        [holder] = holders(listening_inodes(port))
        assert holder.startswith(f"{sys.executable} -m app.cli serve")
        assert serve.stop(signal.SIGTERM) == 0
    assert "ledger" in tables(tmp_path / "switchyard.db")


def test_ca_certificates_that_cannot_be_loaded_are_a_failed_start(tmp_path: Path) -> None:
    """`SSL_CERT_FILE` naming a missing file failed every https attempt as a connection failure
    (cool-downs, `probe_failed`), not the start."""
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace('base_url = "http://', 'base_url = "https://', 1))
    missing = tmp_path / "no-such-ca.pem"
    env = cli_env(SSL_CERT_FILE=str(missing))
    result = run_cli(tmp_path, "serve", "--config", str(config), "--port", str(free_port()), env=env)
    assert (result.returncode, len(result.stderr.splitlines())) == (1, 1), result.stderr
    said = f"the CA certificates for https providers cannot be loaded (SSL_CERT_FILE={missing}"
    assert said in result.stderr


def refused(url: str) -> bool:
    """Whether a connection to `url` is refused (not accepted, nor left unanswered)."""
    try:
        httpx.get(url, timeout=0.3)
    except httpx.ConnectError:
        return True
    except httpx.TransportError:  # accepted into a backlog nobody takes from (unanswered, or reset as it closes)
        return False
    return False


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_draining_service_refuses_new_connections(tmp_path: Path, workers: str) -> None:
    """With several workers the parent kept its copy of the listening socket through the workers'
    drain: new connections waited in the backlog, unanswered, until it exited."""
    with processes() as started:
        mock_port, port = free_port(), free_port()
        mock_args = ["mock-upstream", "--port", str(mock_port), "--chunks", "20", "--chunk-delay-ms", "200"]
        started.append(mock := Process(tmp_path, "mock", mock_args, cli_env()))
        mock.wait_http(f"http://127.0.0.1:{mock_port}/health")
        config = write_config(tmp_path, mock_port)
        args = ["serve", "--config", str(config), "--port", str(port), "--workers", workers]
        started.append(serve := Process(tmp_path, "serve", args, cli_env()))
        base = f"http://127.0.0.1:{port}"
        serve.wait_http(f"{base}/healthz")
        with httpx.stream("POST", f"{base}{COMPLETIONS}", json=body("tiny", stream=True), timeout=20) as stream:
            assert stream.status_code == 200
            serve.popen.send_signal(signal.SIGTERM)  # a 4 s stream in flight: the drain lasts that long
            wait_until_sync(lambda: refused(f"{base}/healthz"), 2.5, what="new connections refused in the drain")
            assert b'"type":"finish"' in b"".join(stream.iter_bytes())  # the stream in flight completes
        assert serve.popen.wait(timeout=20) == 0
