"""The usage report's printed money and its order (cost.md "Reporting"), on SQLite (joined, printed
and sorted in Python) and PostgreSQL (printed and sorted by the report's SQL): costs negative,
zero, NULL, with 18 decimals, in the billions, and parts that cancel to zero; ties in cost broken by
the group values as Python compares text (by code point: upper case before lower, non-ASCII
last), a null group value last among them, also in a PostgreSQL database whose own collation
sorts otherwise — each group's parts in a partial hour (raw rows) and a whole hour (the roll-ups),
whether the report sums the sources again (by model) or not (by hour).
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import asyncpg
import msgspec
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.database import open_engine
from catalog.ledger_write import write_records
from catalog.migrate import upgrade_async
from catalog.records import LedgerRecord
from catalog.usage_query import parse_query
from catalog.usage_report import usage_report
from tests.catalog.conftest import PG_ADMIN_DSN, PG_URL, PgDatabases
from tests.catalog.usage_oracle import expected, ledger_rows

START = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
PERIOD = {"from": "2026-11-28T10:30:00Z", "to": "2026-11-28T12:30:00Z"}  # 10:30-11 and 12-12:30 raw, 11-12 whole
RAW, WHOLE = START + timedelta(minutes=45), START + timedelta(hours=1, minutes=15)
# model: its costs, one in a partial hour and one in a whole hour (None: no cost)
COSTS: dict[str | None, tuple[str | None, str | None]] = {
    "omega": ("4000000000.123456789012345678", "3999999999.999999999999999999"),
    "Zeta": ("1.5", "0"),
    "alpha-2": ("0.75", "0.750000000000000000"),
    "élan": ("1.499999999999999999", "0.000000000000000001"),
    None: ("1.25", None),  # with the model "" below: one null group, 1.5 in all
    "": (None, "0.25"),
    "alpha": ("0.000000000000000001", "-0.000000000000000001"),
    "gamma": ("-2.000000000000000001", "0.000000000000000001"),
    "beta": (None, None),
}
ORDER = ["omega", "Zeta", "alpha-2", "élan", None, "alpha", "gamma", "beta"]


def _records() -> list[LedgerRecord]:
    records = []
    for model, costs in COSTS.items():
        for started, cost in zip((RAW, WHOLE), costs, strict=True):
            price = None if cost is None else Decimal(cost)
            records.append(
                LedgerRecord(
                    request_id=f"order-{len(records):03d}",
                    started_at=started + timedelta(seconds=len(records)),
                    finished_at=started + timedelta(seconds=len(records) + 1),
                    status="ok",
                    streamed=False,
                    latency_ms=100.0 + len(records),
                    model=model,
                    provider="local",
                    input_tokens=len(records),
                    cost_usd=price,
                    estimated_cost_usd=price,
                    cost_source=None if price is None else "authoritative" if len(records) % 3 else "estimated",
                )
            )
    return records


@pytest.mark.parametrize("group_by", ["model", "hour,model", "model,status"])
async def test_money_and_order_against_the_oracle(engine: AsyncEngine, group_by: str) -> None:
    await write_records(engine, _records())
    query = parse_query({**PERIOD, "group_by": group_by}, START)
    answer = msgspec.to_builtins(await usage_report(engine, query))
    assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(await ledger_rows(engine), query)
    if group_by != "hour,model":
        assert [row["model"] for row in answer["rows"]] == ORDER
        costs = [row["cost_usd"] for row in answer["rows"]]
        assert costs == ["8000000000.123456789012345677", "1.5", "1.5", "1.5", "1.5", "0", "-2", None]
    assert answer["totals"]["cost_usd"] == "8000000004.123456789012345677"


async def test_code_point_order_in_a_database_that_collates_otherwise(pg_databases: PgDatabases) -> None:
    """ICU English, the database's default collation here, puts `alpha-2` and `élan` before `Zeta`."""
    name = f"switchyard_test_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await admin.execute(
            f"CREATE DATABASE \"{name}\" TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en' LOCALE 'C.UTF-8'"
        )
        pg_databases.names.append(name)
    finally:
        await admin.close()
    url = PG_URL.format(name=name)
    await upgrade_async(url)
    engine = open_engine(url)
    try:
        await write_records(engine, _records())
        async with engine.connect() as connection:
            collated = await connection.exec_driver_sql(
                "SELECT string_agg(m, ' ' ORDER BY m) FROM unnest(ARRAY['Zeta', 'alpha-2']) m"
            )
            assert collated.scalar() == "alpha-2 Zeta"
        for group_by in ("hour,model", "model"):
            query = parse_query({**PERIOD, "group_by": group_by}, START)
            answer = msgspec.to_builtins(await usage_report(engine, query))
            assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(await ledger_rows(engine), query)
        assert [row["model"] for row in answer["rows"]] == ORDER
    finally:
        await engine.dispose()
