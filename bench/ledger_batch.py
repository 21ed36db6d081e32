"""What one ledger batch costs the writer: `LedgerStore.write` of 256 records (the writer's batch
size), timed per batch, on SQLite (a file) and PostgreSQL, through the stores the gateway uses.

    .venv/bin/python bench/ledger_batch.py [--batches 200] [--groups 1,256]

Each run migrates a fresh database (a tmp SQLite file; `switchyard_bench_batch_<pid>` on
127.0.0.1:5432, dropped afterwards), then writes `--batches` batches of new rows started in the
same hour, so after the first batch every roll-up upsert updates rows already there — the steady
state. `groups` is how many roll-up groups (key × model × api) a batch's rows fall into: 1 is the
HTTP bench's traffic (one key, one model), 256 every row its own group (the most upserts a batch
can cause). Prints the median and p90 batch time in ms and the per-row cost in µs, and the gateway
process's CPU time per batch (SQLite's work runs on the store's thread in this process; PostgreSQL's
in the server). Compare two commits by running the same command in each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.database import open_engine
from catalog.ledger_store import store_for
from catalog.migrate import upgrade_async
from catalog.records import LedgerRecord

BATCH = 256
ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


def batch(number: int, groups: int, hour: datetime) -> list[LedgerRecord]:
    records = []
    for index in range(BATCH):
        n = number * BATCH + index
        group = index % groups
        started = hour + timedelta(microseconds=n * 997 % 3_500_000_000)
        cost = Decimal(n * 7919 % 10**11).scaleb(-18)
        records.append(
            LedgerRecord(
                request_id=f"batch-{n}",
                started_at=started,
                finished_at=started + timedelta(seconds=1),
                status="ok",
                streamed=bool(n % 2),
                latency_ms=50.0 + n % 3000,
                api_key_id=f"key-{group % 64}",
                owner=f"team-{group % 64 % 10}",
                api=("unified", "openai_chat", "openai_completions", "anthropic_messages")[group // 64],
                model=f"model-{group % 8}",
                provider="fastrun",
                input_tokens=n % 4000,
                output_tokens=n % 900,
                cost_usd=cost,
                estimated_cost_usd=cost,
                cost_source="estimated",
            )
        )
    return records


async def run(url: str, batches: int, groups: int) -> tuple[list[float], float]:
    await upgrade_async(url)
    engine = open_engine(url)
    store = store_for(engine, tuple(LedgerRecord.__struct_fields__))
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    prepared = [batch(number, groups, hour) for number in range(batches + 1)]
    try:
        await store.write(prepared[0])  # connects, creates the groups: not timed
        times = []
        cpu = time.process_time()
        for records in prepared[1:]:
            began = time.perf_counter()
            await store.write(records)
            times.append((time.perf_counter() - began) * 1000)
        return times, (time.process_time() - cpu) * 1000 / batches
    finally:
        await store.close()
        await engine.dispose()


def report(label: str, times: list[float], cpu_ms: float) -> None:
    median = statistics.median(times)
    p90 = statistics.quantiles(times, n=10)[-1]
    print(
        f"{label:28} median {median:6.2f} ms  p90 {p90:6.2f} ms  "
        f"{median * 1000 / BATCH:5.1f} µs/row  gateway CPU {cpu_ms:5.2f} ms/batch"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--groups", default="1,256", help="roll-up groups per batch, comma-separated (1–256)")
    args = parser.parse_args()
    name = f"switchyard_bench_batch_{os.getpid()}"
    admin = await asyncpg.connect(ADMIN)
    try:
        for groups in (int(value) for value in args.groups.split(",")):
            with tempfile.TemporaryDirectory() as directory:
                times, cpu = await run(f"sqlite+aiosqlite:///{directory}/ledger.db", args.batches, groups)
                report(f"SQLite, {groups} groups/batch", times, cpu)
            await admin.execute(f'CREATE DATABASE "{name}"')
            try:
                times, cpu = await run(f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}", args.batches, groups)
                report(f"PostgreSQL, {groups} groups/batch", times, cpu)
            finally:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
