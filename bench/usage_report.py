"""The usage report's bar (issue 12): a 30-day report over 10 million ledger rows in < 100 ms on
PostgreSQL, with memory that does not grow with the row count.

    .venv/bin/python bench/usage_report.py [--rows 10000000] [--runs 5] [--keep]

Creates a database (`switchyard_bench_usage_<pid>` on 127.0.0.1:5432, user postgres, trust; dropped
afterwards unless --keep), migrates it, and seeds N ledger rows spread evenly over the 30 days before
now in one `INSERT … SELECT … FROM generate_series`: 50 keys (each with its owner, of 10, and its
API, of 4), each using 2 of 8 models on that model's provider (of 3); ~4 % errors, 4 % cancelled;
exact 18-decimal costs, a quarter authoritative. So an hour has up to 50 × 2 × 3 = 300 roll-up rows
and 30 days about 180,000 hourly rows, a day about as many daily ones (≈ 7,700 for 30 days),
whatever N is. The roll-ups are then built by the migrations' own aggregates
(`catalog.rollup.postgres_backfill`, then `postgres_daily_backfill` from the hourly rows), which are
the sums the ledger stores keep batch by batch: seeding 10M rows through the writer would take
minutes and measure the writer, not the report (bench/ledger_batch.py measures the writer).

Each report runs `--runs` times over [now − 30 days, now), `now` at minute 37 of the current hour:
29 whole days from `usage_daily`, the other whole hours (of the first day and of today) from
`usage_hourly`, and raw rows for the two partial hours at the edges (an hour of rows in all). The best and median wall
times are printed with the peak RSS. Grouped by hour, a report reads the period's hourly rows (a
day row has no hours). Reports grouped by a non-time dimension also compute latency percentiles,
which read and sort the period's raw rows (catalog/usage_report.py says why); they are timed both
ways.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.database import open_engine
from catalog.migrate import upgrade_async
from catalog.rollup import postgres_backfill, postgres_daily_backfill
from catalog.usage_query import UsageQuery
from catalog.usage_report import usage_report

ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
REPORTS = (
    ("totals", (), True),
    ("day,model", ("day", "model"), True),
    ("hour", ("hour",), True),
    ("model (no percentiles)", ("model",), False),
    ("key (no percentiles)", ("key",), False),
    ("model, with p50/p95", ("model",), True),
)

SEED = """
INSERT INTO ledger (request_id, started_at, finished_at, api_key_id, owner, api, model, provider, streamed,
  status, input_tokens, output_tokens, reasoning_tokens, cache_read_tokens, cache_write_tokens,
  cost_usd, estimated_cost_usd, cost_source, latency_ms, attempts, usage_estimated)
SELECT 'bench-' || g,
  $1::timestamptz + (g * $2::double precision) * interval '1 microsecond',
  $1::timestamptz + (g * $2::double precision) * interval '1 microsecond' + interval '1 second',
  'key-' || (g % 50), 'team-' || (g % 10),
  (ARRAY['unified', 'openai_chat', 'openai_completions', 'anthropic_messages'])[1 + g % 4],
  'model-' || ((g % 50 + (g / 1000) % 2) % 8),
  (ARRAY['local', 'fastrun', 'primalabs'])[1 + (g % 50 + (g / 1000) % 2) % 3],
  g % 2 = 0,
  CASE WHEN g % 25 = 0 THEN 'cancelled' WHEN g % 12 = 0 THEN 'error' ELSE 'ok' END,
  g % 4000, g % 900, g % 300, g % 2000, g % 100,
  CASE WHEN g % 12 = 0 AND g % 25 <> 0 THEN NULL ELSE ((g * 7919) % 100000000000)::numeric / 1e18 END,
  CASE WHEN g % 12 = 0 AND g % 25 <> 0 THEN NULL ELSE ((g * 7919) % 100000000000)::numeric / 1e18 END,
  CASE WHEN g % 12 = 0 AND g % 25 <> 0 THEN NULL WHEN g % 4 = 0 THEN 'authoritative' ELSE 'estimated' END,
  50 + (g * 31) % 3000, 1, false
FROM generate_series(1, $3::bigint) AS g
"""


async def seed(name: str, rows: int, now: datetime) -> None:
    connection = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:5432/{name}")
    try:
        start = now - timedelta(days=30)
        step_us = timedelta(days=30) / timedelta(microseconds=1) / (rows + 1)
        began = time.perf_counter()
        await connection.execute(SEED, start, step_us, rows)
        await connection.execute("TRUNCATE usage_hourly, usage_daily")
        await connection.execute(postgres_backfill())
        await connection.execute(postgres_daily_backfill())
        for table in ("ledger", "usage_hourly", "usage_daily"):
            await connection.execute(f"VACUUM ANALYZE {table}")
        hourly = await connection.fetchval("SELECT count(*) FROM usage_hourly")
        daily = await connection.fetchval("SELECT count(*) FROM usage_daily")
        print(
            f"seeded {rows:,} rows ({hourly:,} hourly, {daily:,} daily roll-up rows) "
            f"in {time.perf_counter() - began:.1f} s"
        )
    finally:
        await connection.close()


async def measure(url: str, now: datetime, runs: int) -> None:
    engine = open_engine(url)
    start = now - timedelta(days=30)
    try:
        for label, groups, latency in REPORTS:
            query = UsageQuery(start=start, end=now, group_by=groups, latency=latency)
            times = []
            for _ in range(runs):
                began = time.perf_counter()
                report = await usage_report(engine, query)
                times.append((time.perf_counter() - began) * 1000)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(
                f"{label:26} best {min(times):8.1f} ms  median {statistics.median(times):8.1f} ms  "
                f"rows {len(report.rows):5}  requests {report.totals.requests:,}  peak RSS {rss:.0f} MB"
            )
    finally:
        await engine.dispose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the database")
    args = parser.parse_args()
    name = f"switchyard_bench_usage_{os.getpid()}"
    admin = await asyncpg.connect(ADMIN)
    await admin.execute(f'CREATE DATABASE "{name}"')
    now = datetime.now(UTC).replace(minute=37, second=12, microsecond=0)
    try:
        await upgrade_async(URL.format(name=name))
        await seed(name, args.rows, now)
        print(f"peak RSS before the reports: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
        await measure(URL.format(name=name), now, args.runs)
    finally:
        if not args.keep:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
