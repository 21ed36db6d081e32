"""The SQLite ledger writer's own process (`catalog.sqlite_child`): the writer's batches go
through it, a child that dies is an outage that heals, and a child never outlives its gateway.

The rows' encoding and every column are asserted through the same process by
tests/catalog/test_ledger_writer.py (its SQLite cases); here, what the process adds.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from catalog.database import open_engine
from catalog.ledger import LedgerWriter
from catalog.migrate import upgrade_async
from tests.catalog.test_ledger_writer import ledger, record
from tests.gateway.conftest import CATALOG
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import StartGateway, provider_table
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream, upstream_fixture
from tests.support.waiting import wait_until

primary = upstream_fixture("primary")

ROOT = Path(__file__).resolve().parents[2]


def writer_children(parent: int) -> list[int]:
    """The pids of `parent`'s SQLite writer processes, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"catalog.sqlite_child" in command:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def sqlite_engine(tmp_path: Path) -> AsyncEngine:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    await upgrade_async(url)
    return create_async_engine(url)


async def test_the_child_starts_with_the_writer_writes_its_batches_and_ends_with_it(tmp_path: Path) -> None:
    engine = await sqlite_engine(tmp_path)
    assert writer_children(os.getpid()) == []
    writer = LedgerWriter(engine, flush_interval=0.01)
    writer.start()
    await wait_until(lambda: len(writer_children(os.getpid())) == 1)  # before any batch
    (child,) = writer_children(os.getpid())
    writer.submit(record(1))
    await asyncio.wait_for(writer.flush(), timeout=10)
    assert writer_children(os.getpid()) == [child]
    assert await ledger(engine) == [record(1)]
    await writer.close()
    assert not alive(child)
    await engine.dispose()


async def one_row_written(tmp_path: Path) -> tuple[AsyncEngine, LedgerWriter, int]:
    """A started writer on a new SQLite file, `record(1)` written, and its child's pid."""
    engine = await sqlite_engine(tmp_path)
    writer = LedgerWriter(engine, flush_interval=0.01)
    writer.start()
    writer.submit(record(1))
    await asyncio.wait_for(writer.flush(), timeout=10)
    (child,) = writer_children(os.getpid())
    return engine, writer, child


async def test_a_child_that_dies_is_an_outage_and_the_next_child_writes_every_row_once(tmp_path: Path) -> None:
    engine, writer, first = await one_row_written(tmp_path)
    os.kill(first, signal.SIGKILL)
    await wait_until(lambda: not alive(first))
    for n in range(2, 6):
        writer.submit(record(n))
    await asyncio.wait_for(writer.flush(), timeout=10)  # the dead child's pipe fails: retried with a new one
    (second,) = writer_children(os.getpid())
    assert second != first
    assert await ledger(engine) == [record(n) for n in range(1, 6)]
    assert writer.rejected == []
    await writer.close()
    await engine.dispose()


async def test_the_child_ignores_the_interrupt_that_reaches_the_process_group(tmp_path: Path) -> None:
    """A Ctrl-C reaches every process of the group: the gateway shuts down and writes its last
    batch, so the child must still be there to take it."""
    engine, writer, child = await one_row_written(tmp_path)
    os.kill(child, signal.SIGINT)
    os.kill(child, signal.SIGTERM)
    await asyncio.sleep(0.2)
    writer.submit(record(2))
    await asyncio.wait_for(writer.flush(), timeout=10)
    assert writer_children(os.getpid()) == [child]
    assert await ledger(engine) == [record(1), record(2)]
    await writer.close()
    await engine.dispose()


def test_the_child_exits_when_its_gateway_is_killed(tmp_path: Path) -> None:
    """`kill -9` of the gateway: the child reads the end of its input and exits (no orphan)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    asyncio.run(upgrade_async(url))
    script = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        from catalog.ledger import LedgerWriter
        from sqlalchemy.ext.asyncio import create_async_engine
        from tests.catalog.test_ledger_writer import record

        async def main():
            writer = LedgerWriter(create_async_engine({url!r}), flush_interval=0.01)
            writer.start()
            writer.submit(record(1))
            await writer.flush()
            print("written", flush=True)
            sys.stdin.readline()  # the test has found the child
            os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
        """
    )
    gateway = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert gateway.stdin is not None
    assert gateway.stdout is not None
    assert gateway.stdout.readline() == b"written\n"
    children = writer_children(gateway.pid)
    assert len(children) == 1
    gateway.stdin.write(b"kill\n")
    gateway.stdin.close()
    assert gateway.wait(timeout=10) == -signal.SIGKILL
    deadline = asyncio.run(_gone(children[0]))
    assert deadline, "the SQLite writer process outlived its gateway"


async def _gone(pid: int) -> bool:
    for _ in range(100):
        if not alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_writer_that_gets_no_rows_starts_no_child(tmp_path: Path) -> None:
    """`[ledger] enabled = false` runs an idle writer: no process for it. A writer that will get
    rows, started beside it, shows how long a child takes to appear."""
    (tmp_path / "idle").mkdir()
    engines = [await sqlite_engine(tmp_path / "idle"), await sqlite_engine(tmp_path)]
    idle, busy = LedgerWriter(engines[0], idle=True), LedgerWriter(engines[1])
    idle.start()
    busy.start()
    await wait_until(lambda: len(writer_children(os.getpid())) >= 1)
    await asyncio.sleep(0.2)
    assert len(writer_children(os.getpid())) == 1
    await idle.close()
    await busy.close()
    for engine in engines:
        await engine.dispose()


async def test_a_gateway_whose_log_cannot_be_written_still_ends_its_writer_process(
    start_gateway: StartGateway, primary: ReplayUpstream
) -> None:
    """stdout closed under the service (a pipe whose reader is gone): the shutdown still closes
    the ledger, writing its rows and ending the writer process, instead of stopping at the log's
    last flush and leaving the process behind."""
    gw = await start_gateway(providers=provider_table({"primary": primary}), catalog=CATALOG)
    primary.set_default(answer("ok"))
    assert (await gw.client.post(COMPLETIONS, json=body("chat-1"))).status_code == 200
    (child,) = writer_children(os.getpid())
    assert gw.service.log_writer is not None
    gone = io.BytesIO()
    gone.close()
    gw.service.log_writer._file = gone  # the stdout the service writes to, closed
    engine = open_engine(gw.service.settings.database.url)
    await gw.close()
    assert not alive(child)
    async with engine.connect() as connection:
        assert (await connection.execute(text("SELECT count(*) FROM ledger"))).scalar() == 1
    await engine.dispose()
