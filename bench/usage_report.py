"""The usage report's bar (issue 12): a 30-day report over 10 million ledger rows in < 100 ms on
PostgreSQL, with memory that does not grow with the row count.

    .venv/bin/python bench/usage_report.py [--rows 10000000] [--runs 5] [--keep]
    .venv/bin/python bench/usage_report.py --database NAME --now ISO [--runs 5]

Creates a database (`switchyard_bench_usage_<pid>` on 127.0.0.1:5432, user postgres, trust; dropped
afterwards unless --keep), migrates it, and seeds N ledger rows spread evenly over the 30 days before
now in one `INSERT … SELECT … FROM generate_series`: 50 keys (each with its owner, of 10, and 2
of the 4 APIs), each using 2 of 8 models, each request on one of 3 providers (which follows the key
and the model's slot, so every model is served by every provider); ~4 % errors, 4 % cancelled;
exact 18-decimal costs, a quarter authoritative. So 30 days hold about 180,000 hourly rows (≈ 250 an
hour), ≈ 36,800 hourly rows per model (model × provider × status, ≈ 51 an hour), ≈ 13,700 per model and
status (≈ 19 an hour) and ≈ 7,700 daily ones, whatever N is. The roll-ups are then built by the
migrations' aggregates (`catalog.rollup.postgres_backfill`, then `postgres_models_backfill`,
`postgres_model_status_backfill` and `postgres_daily_backfill` from the hourly rows), which are the
sums the ledger stores keep batch by batch: seeding 10M rows through the writer would take minutes
and measure the writer, not the report (bench/ledger_batch.py measures the writer).

Each report runs `--runs` times over [now − 30 days, now), `now` at minute 37 of the current hour:
29 whole days from `usage_daily`, the other whole hours (of the first day and of today) from
`usage_hourly_model_status`, or `usage_hourly_models` when the report needs the provider, or
`usage_hourly` when it needs the key, owner or api, and raw rows for the two partial hours at the
edges (an hour of rows in all). The best and median wall times are printed with the peak RSS.
Grouped by hour, a report reads the period's hourly rows (a day row has no hours). Reports grouped
by a non-time dimension also compute latency percentiles, which read and sort the period's raw rows
(catalog/usage_report.py says why); they are timed both ways.

`--database NAME --now ISO` measures a database kept by an earlier `--keep` run (the `now` it
printed), seeding nothing: so another commit's report code can be timed on the same rows.
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
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.database import open_engine
from catalog.migrate import upgrade_async
from catalog.rollup import (
    postgres_backfill,
    postgres_daily_backfill,
    postgres_model_status_backfill,
    postgres_models_backfill,
)
from catalog.usage_query import UsageQuery
from catalog.usage_report import usage_report

ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
REPORTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("totals", {}),
    ("day,model", {"group_by": ("day", "model")}),
    ("hour", {"group_by": ("hour",)}),
    ("hour,model", {"group_by": ("hour", "model")}),
    ("hour,provider", {"group_by": ("hour", "provider")}),
    ("hour, one key", {"group_by": ("hour",), "key": ("key-7",)}),
    ("model (no percentiles)", {"group_by": ("model",), "latency": False}),
    ("key (no percentiles)", {"group_by": ("key",), "latency": False}),
    ("model, with p50/p95", {"group_by": ("model",)}),
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
        await connection.execute("TRUNCATE usage_hourly, usage_hourly_models, usage_hourly_model_status, usage_daily")
        await connection.execute(postgres_backfill())
        await connection.execute(postgres_models_backfill())
        await connection.execute(postgres_model_status_backfill())
        await connection.execute(postgres_daily_backfill())
        counts = {}
        for table in ("ledger", "usage_hourly", "usage_hourly_models", "usage_hourly_model_status", "usage_daily"):
            await connection.execute(f"VACUUM ANALYZE {table}")
            counts[table] = await connection.fetchval(f"SELECT count(*) FROM {table}")  # noqa: S608
        print(
            f"seeded {rows:,} rows ({counts['usage_hourly']:,} hourly, {counts['usage_hourly_models']:,} "
            f"hourly per model, {counts['usage_hourly_model_status']:,} hourly per model and status, "
            f"{counts['usage_daily']:,} daily roll-up rows) in {time.perf_counter() - began:.1f} s"
        )
    finally:
        await connection.close()


async def measure(url: str, now: datetime, runs: int) -> None:
    engine = open_engine(url)
    start = now - timedelta(days=30)
    try:
        for label, fields in REPORTS:
            query = UsageQuery(start=start, end=now, **fields)
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
    parser.add_argument("--database", help="measure this kept database (seeding nothing); needs --now")
    parser.add_argument("--now", type=datetime.fromisoformat, help="the `now` the kept database was seeded for")
    args = parser.parse_args()
    if args.database:
        print(f"measuring {args.database} at now = {args.now.isoformat()}")
        await measure(URL.format(name=args.database), args.now, args.runs)
        return
    name = f"switchyard_bench_usage_{os.getpid()}"
    admin = await asyncpg.connect(ADMIN)
    await admin.execute(f'CREATE DATABASE "{name}"')
    now = datetime.now(UTC).replace(minute=37, second=12, microsecond=0)
    try:
        await upgrade_async(URL.format(name=name))
        await seed(name, args.rows, now)
        print(f"database {name}, now = {now.isoformat()}")
        print(f"peak RSS before the reports: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
        await measure(URL.format(name=name), now, args.runs)
    finally:
        if not args.keep:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
