"""`kill -9` under load: after a restart every response a client read to its end has its row."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ledger_journal.conftest import Load, ServeGateway, ledger_ids
from tests.support.cli import Process
from tests.support.waiting import wait_until_sync


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_kill_9_under_load_loses_no_row_of_a_completed_response(
    dialect: str, tmp_path: Path, mock_upstream: tuple[int, list[Process]], pg_url: str
) -> None:
    port, started = mock_upstream
    url = f"sqlite+aiosqlite:///{tmp_path / 'switchyard.db'}" if dialect == "sqlite" else pg_url
    gateway = ServeGateway(tmp_path, started, port, url)
    first = gateway.start()
    with Load(gateway.base) as load:
        wait_until_sync(lambda: len(load.completed) >= 300, 60.0, what="300 completed responses")
        first.kill()  # SIGKILL, mid-load: rows of the last answers are in no database yet
    completed = list(load.completed)
    assert len(completed) >= 300

    gateway.start()  # replays what the killed process journaled

    def all_written() -> bool:
        return set(completed) <= set(ledger_ids(url))

    wait_until_sync(all_written, 30.0, what=lambda: f"{len(set(completed) - set(ledger_ids(url)))} rows missing")
    ids = ledger_ids(url)
    assert len(ids) == len(set(ids))  # exactly one row each
    # the killed process's segment is deleted once replayed: by the writer, just after the commit
    # that the test saw (so waited for, not read at once)
    wait_until_sync(lambda: len(gateway.segments()) == 1, 10.0, what=lambda: f"segments {gateway.segments()}")
