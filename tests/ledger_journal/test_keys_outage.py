"""Keys mode with PostgreSQL out of reach (a `TcpProxy` the test cuts): the key ring starts from the
copy of the key table saved beside the journal, as the catalog does from its own, so a start (or a
worker uvicorn restarts) during an outage serves the keys it knew; without a copy the start fails
in one line that says why."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx

from tests.ledger_journal.conftest import ServeGateway, ledger_query, with_port
from tests.ledger_journal.test_outage import events, wait_for_rows
from tests.support.cli import Process, run_cli
from tests.support.client import COMPLETIONS, body
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import wait_until_sync

KEYS = """
[auth]
mode = "keys"
"""


def create_key(gateway: ServeGateway, *options: str) -> tuple[str, str]:
    """A key made by the CLI on the gateway's database: (its id, its secret)."""
    made = run_cli(gateway.directory, "keys", "create", "--config", str(gateway.config), "--format", "json", *options)
    assert made.returncode == 0, made.stderr
    record = json.loads(made.stdout)
    return record["id"], record["secret"]


def answers(gateway: ServeGateway, secret: str) -> bool:
    response = httpx.get(f"{gateway.base}/api/v1/keys/me", headers={"authorization": f"Bearer {secret}"})
    return response.status_code == 200


def test_a_start_with_the_database_down_serves_the_saved_keys(
    tmp_path: Path, mock_upstream: tuple[int, list[Process]], pg_url: str
) -> None:
    port, started = mock_upstream
    with TcpProxy(5432) as proxy:
        gateway = ServeGateway(tmp_path, started, port, with_port(pg_url, proxy.port), KEYS)
        first = gateway.start()
        key_id, secret = create_key(gateway, "--name", "team", "--rpm", "100")
        wait_until_sync(lambda: answers(gateway, secret), 5.0, what="the new key in the ring")
        earlier = gateway.complete(key=secret)
        assert first.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
        proxy.cut()
        second = gateway.start()
        during = {gateway.complete(key=secret, stream=n % 2 == 0) for n in range(6)}
        refused = httpx.post(f"{gateway.base}/api/v1/completions", headers={"authorization": "Bearer sy-not-a-key"})
        assert refused.status_code == 401
        proxy.restore()
        wait_for_rows(pg_url, during | {earlier})
    owners = set(ledger_query(pg_url, "SELECT api_key_id FROM ledger"))
    assert owners == {(key_id,)}
    assert {"database_unreachable", "catalog_from_saved_snapshot", "keys_from_saved_snapshot"} <= set(events(second))
    saved = gateway.journal / "keys-snapshot.json"
    assert oct(saved.stat().st_mode & 0o777) == "0o600"
    assert secret not in saved.read_text()


def test_a_key_revoked_by_the_cli_while_no_server_ran_stays_revoked_in_an_outage(
    tmp_path: Path, mock_upstream: tuple[int, list[Process]], pg_url: str
) -> None:
    """The copy is rewritten by a running server's reads of the table; a revocation made while none
    ran reached only the database, and a start in an outage took the key from the older copy."""
    port, started = mock_upstream
    with TcpProxy(5432) as proxy:
        gateway = ServeGateway(tmp_path, started, port, with_port(pg_url, proxy.port), KEYS)
        key_id, secret = create_key(gateway, "--name", "leaver")
        kept_id, kept = create_key(gateway, "--name", "stayer")
        first = gateway.start()
        gateway.complete(key=secret)
        assert first.stop(signal.SIGTERM) == 0
        revoked = run_cli(gateway.directory, "keys", "revoke", key_id, "--config", str(gateway.config))
        assert revoked.returncode == 0, revoked.stderr
        proxy.cut()
        gateway.start()
        headers = {"authorization": f"Bearer {secret}"}
        refused = httpx.post(f"{gateway.base}{COMPLETIONS}", json=body("tiny"), headers=headers, timeout=20)
        assert refused.status_code == 401  # it was served (200) from the older copy
        gateway.complete(key=kept)
    assert kept_id != key_id


def workers_of(master: Process) -> set[int]:
    """The uvicorn workers of `master` (its children that multiprocessing spawned; not its resource tracker)."""
    children = Path(f"/proc/{master.popen.pid}/task/{master.popen.pid}/children").read_text().split()
    return {int(pid) for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()}


def test_a_worker_restarted_during_an_outage_starts_and_the_service_stays_up(
    tmp_path: Path, mock_upstream: tuple[int, list[Process]], pg_url: str
) -> None:
    """uvicorn restarts a worker that died; that worker's start read the key table, failed with the
    database down, and uvicorn then stopped the whole service ("Child process failed to start")."""
    port, started = mock_upstream
    with TcpProxy(5432) as proxy:
        gateway = ServeGateway(tmp_path, started, port, with_port(pg_url, proxy.port), KEYS)
        _key_id, secret = create_key(gateway, "--name", "team")
        master = gateway.start("--workers", "2")
        wait_until_sync(lambda: len(workers_of(master)) == 2, 20.0, what="two workers")
        wait_until_sync(lambda: answers(gateway, secret), 5.0, what="the key in the ring")
        proxy.cut()
        before = workers_of(master)
        os.kill(min(before), signal.SIGKILL)
        wait_until_sync(lambda: len(workers_of(master) - before) == 1, 20.0, what="a restarted worker")
        wait_until_sync(lambda: len(workers_of(master)) == 2, 20.0, what="two workers again")
        during = {gateway.complete(key=secret) for _ in range(20)}  # either worker answers
        assert master.popen.poll() is None
        proxy.restore()
        wait_for_rows(pg_url, during)
    stdout, _ = master.output()
    restarted = [json.loads(line) for line in stdout.splitlines() if '"worker_restarted"' in line]
    assert [(line["pid"], line["exit_code"], line["level"]) for line in restarted] == [
        (min(before), -signal.SIGKILL, "warning")
    ]


def test_no_database_and_no_saved_keys_is_a_failed_start_that_says_why(
    tmp_path: Path, mock_upstream: tuple[int, list[Process]], pg_url: str
) -> None:
    port, started = mock_upstream
    with TcpProxy(5432) as proxy:
        gateway = ServeGateway(tmp_path, started, port, with_port(pg_url, proxy.port))
        gateway.start().stop(signal.SIGTERM)  # auth none: the catalog is saved, no key ring ran
        gateway.config.write_text(gateway.config.read_text() + KEYS)
        proxy.cut()
        result = run_cli(tmp_path, "serve", "--config", str(gateway.config), "--port", str(gateway.port))
    assert result.returncode == 1
    assert f"the database is unreachable and no key snapshot was saved in {gateway.journal}" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_keys_me_during_an_outage_answers_at_once(
    tmp_path: Path, mock_upstream: tuple[int, list[Process]], pg_url: str
) -> None:
    """`GET /api/v1/keys/me` of a key without a budget flushes this process's rows first, so the
    ledger's sum includes them: with the database out of reach the flush never ended, and neither
    did the request (8 s and more in the re-run of the journal audit). It waits 2 s at most, then
    the ledger's read says the database is down: 503."""
    port, started = mock_upstream
    with TcpProxy(5432) as proxy:
        gateway = ServeGateway(tmp_path, started, port, with_port(pg_url, proxy.port), KEYS)
        gateway.start()
        _, secret = create_key(gateway, "--name", "team", "--rpm", "100")
        wait_until_sync(lambda: answers(gateway, secret), 5.0, what="the new key in the ring")
        proxy.cut()
        gateway.complete(key=secret)  # a row the flush cannot write
        began = time.monotonic()
        response = httpx.get(
            f"{gateway.base}/api/v1/keys/me", headers={"authorization": f"Bearer {secret}"}, timeout=30
        )
        assert time.monotonic() - began < 6.0
        assert response.status_code == 503, response.text
        proxy.restore()
