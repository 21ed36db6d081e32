"""The usage report (cost.md "Reporting") against the same aggregate computed directly over the
ledger rows, on SQLite and PostgreSQL: every group_by, every filter, periods with partial hours at
both edges, inside one hour, on whole hours and on whole days — to the last decimal place
(tests/catalog/test_usage_daily.py has more periods made of days, hours and partial hours).

The ledger is written through the real stores (`write_records`), part of it twice and in batches
holding a request id twice, so the roll-ups the report reads must have counted each row once.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.context import Ingress
from catalog.database import open_engine
from catalog.ledger_write import write_records
from catalog.migrate import upgrade_async
from catalog.records import LedgerRecord
from catalog.report_period import QueryError
from catalog.usage_query import APIS, GROUPS, parse_query
from catalog.usage_report import usage_report
from tests.catalog.usage_oracle import (
    LEVELS,
    TOKENS,
    expected,
    expected_rollup,
    ledger_rows,
    rollup_rows,
    seeded_records,
)

NOW = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)
EDGES = {"from": "2026-11-28T03:17:42.5Z", "to": "2026-11-30T18:45:00+02:00"}


@pytest.fixture
async def seeded(engine: AsyncEngine) -> list[dict[str, Any]]:
    records = seeded_records()
    await write_records(engine, records[:250])
    await write_records(engine, records[200:450])  # 50 replayed: skipped, and not counted again
    await write_records(engine, [records[450], *records[450:]])  # one request id twice in a batch
    await write_records(engine, records)
    return await ledger_rows(engine)


async def check(engine: AsyncEngine, rows: list[dict[str, Any]], params: dict[str, str]) -> dict[str, Any]:
    query = parse_query(params, NOW)
    answer = msgspec.to_builtins(await usage_report(engine, query))
    assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(rows, query), params
    return answer


async def test_the_seeded_ledger_has_every_row_once(engine: AsyncEngine, seeded: list[dict[str, Any]]) -> None:
    assert len(seeded) == 600
    answer = await check(engine, seeded, {"from": "2026-11-01", "to": "2026-12-01"})
    assert answer["totals"]["requests"] == 600
    assert answer["totals"]["unpriced_requests"] > 0
    assert answer["totals"]["authoritative_cost_usd"] != "0"


@pytest.mark.parametrize("group", GROUPS)
async def test_each_group_by_with_partial_hours_at_both_edges(
    engine: AsyncEngine, seeded: list[dict[str, Any]], group: str
) -> None:
    answer = await check(engine, seeded, {**EDGES, "group_by": group})
    assert len(answer["rows"]) > 1
    assert ("p50_ms" in answer["rows"][0]) is (group not in ("day", "hour"))


async def test_several_groups_at_once_and_none(engine: AsyncEngine, seeded: list[dict[str, Any]]) -> None:
    await check(engine, seeded, {**EDGES, "group_by": "model,provider,key,owner,api,status"})
    await check(engine, seeded, {**EDGES, "group_by": "day,model"})
    await check(engine, seeded, {**EDGES, "group_by": "status,hour"})
    none = await check(engine, seeded, EDGES)
    assert len(none["rows"]) == 1
    assert "p50_ms" not in none["totals"]


@pytest.mark.parametrize(
    "filters",
    [
        {"model": "gemma"},
        {"model": "gemma,qwen", "group_by": "model"},
        {"provider": "fastrun", "group_by": "key"},
        {"key": "key-b", "group_by": "owner"},
        {"owner": "team-y", "group_by": "day"},
        {"api": "openai_chat", "group_by": "model"},
        {"status": "error,cancelled", "group_by": "status"},
        {"model": "llama", "provider": "local", "key": "key-a", "owner": "team-x", "status": "ok"},
        {"model": "no-such-model", "group_by": "model"},
        # grouped by hour: every whole hour from an hourly level, the one per model unless a key or
        # owner or api is grouped by or filtered on
        {"model": "gemma", "group_by": "hour"},
        {"api": "openai_chat,unified", "status": "ok", "group_by": "hour,model"},
        {"provider": "local", "group_by": "hour,api,status"},
        {"key": "key-b", "group_by": "hour"},
        {"owner": "team-x", "group_by": "hour,api"},
        {"provider": "primalabs", "group_by": "hour,key"},
        {"model": "qwen", "owner": "team-y", "group_by": "hour,owner"},
    ],
)
async def test_each_filter(engine: AsyncEngine, seeded: list[dict[str, Any]], filters: dict[str, str]) -> None:
    await check(engine, seeded, {**EDGES, **filters})


@pytest.mark.parametrize(
    "period",
    [
        {"from": "2026-11-28T05:00:00Z", "to": "2026-11-29T07:00:00Z"},  # whole hours only
        {"from": "2026-11-28T05:10:00Z", "to": "2026-11-28T05:50:00Z"},  # inside one hour
        {"from": "2026-11-28T05:10:00Z", "to": "2026-11-28T06:20:00Z"},  # two partial hours, none whole
        {"from": "2026-11-28", "to": "2026-11-29"},  # one whole day
        {"from": "2026-11-28", "to": "2026-11-30"},  # whole days only
        {"from": "2026-11-27T22:00:00Z", "to": "2026-11-30T05:00:00Z"},  # whole hours around whole days
        {"from": "2026-11-27T21:59:59.999Z", "to": "2026-11-30T05:00:00.001Z"},  # and partial hours
    ],
)
async def test_periods(engine: AsyncEngine, seeded: list[dict[str, Any]], period: dict[str, str]) -> None:
    await check(engine, seeded, {**period, "group_by": "hour,model"})
    await check(engine, seeded, {**period, "group_by": "day,status"})
    await check(engine, seeded, {**period, "group_by": "provider"})


async def test_a_restricted_key_sees_only_its_rows(engine: AsyncEngine, seeded: list[dict[str, Any]]) -> None:
    query = parse_query({**EDGES, "group_by": "key"}, NOW, only_key="key-c")
    answer = msgspec.to_builtins(await usage_report(engine, query))
    assert [row["key"] for row in answer["rows"]] == ["key-c"]
    assert answer["rows"] == expected(seeded, query)["rows"]
    for params in ({"group_by": "hour"}, {"group_by": "model"}, {"model": "gemma"}):  # no key named, still one key
        query = parse_query({**EDGES, **params}, NOW, only_key="key-c")
        answer = msgspec.to_builtins(await usage_report(engine, query))
        assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(seeded, query), params
        assert (
            answer["totals"]["requests"] < expected(seeded, parse_query({**EDGES, **params}, NOW))["totals"]["requests"]
        )


async def test_the_roll_up_holds_exactly_the_ledgers_sums(engine: AsyncEngine, seeded: list[dict[str, Any]]) -> None:
    """Direct SQL over both tables: per hour, the roll-up's counts and token sums are the ledger's."""
    hour = (
        "date_trunc('hour', started_at, 'UTC')" if engine.dialect.name == "postgresql" else "substr(started_at, 1, 13)"
    )
    rolled_hour = "hour" if engine.dialect.name == "postgresql" else "substr(hour, 1, 13)"
    sums = ", ".join(f"SUM({name})" for name in TOKENS)
    async with engine.connect() as connection:
        raw = await connection.execute(text(f"SELECT {hour}, COUNT(*), {sums} FROM ledger GROUP BY 1 ORDER BY 1"))  # noqa: S608
        rolled = await connection.execute(
            text(f"SELECT {rolled_hour}, SUM(requests), {sums} FROM usage_hourly GROUP BY 1 ORDER BY 1")  # noqa: S608
        )
        assert [tuple(row) for row in rolled] == [tuple(value or 0 for value in row) for row in raw]
        if engine.dialect.name == "postgresql":  # NUMERIC sums: the money too, in SQL
            money = "SELECT SUM(cost_usd), SUM(cost_usd) FILTER (WHERE cost_source = 'authoritative') FROM ledger"
            rolled_money = "SELECT SUM(cost_usd), SUM(authoritative_cost_usd) FROM usage_hourly"
            assert (await connection.execute(text(rolled_money))).one() == (await connection.execute(text(money))).one()
    # every group of every level, every column, money included, on both databases
    for level in LEVELS:
        assert await rollup_rows(engine, level) == expected_rollup(seeded, level), level


async def test_an_empty_period(engine: AsyncEngine, seeded: list[dict[str, Any]]) -> None:
    answer = await check(engine, seeded, {"from": "2025-01-01", "to": "2025-02-01", "group_by": "model"})
    assert answer["rows"] == []
    assert answer["totals"]["cost_usd"] is None
    assert answer["totals"]["p50_ms"] is None


@pytest.mark.parametrize("group_by", ["hour,model,key", "key,owner", "day"])
async def test_max_rows_is_counted_by_the_database(
    engine: AsyncEngine, seeded: list[dict[str, Any]], group_by: str
) -> None:
    """`max_rows` (the HTTP report's bound): a report of exactly that many rows is the unbounded
    one; one more row is a QueryError naming `group_by` (PostgreSQL orders before its `LIMIT`,
    SQLite after: either way only the count is used). The database stops at `max_rows + 1` groups
    (its statement says `LIMIT`): reading them all first is the memory the bound is for."""
    query = parse_query({**EDGES, "group_by": group_by}, NOW)
    whole = await usage_report(engine, query)
    assert len(whole.rows) > 2
    assert await usage_report(engine, query, max_rows=len(whole.rows)) == whole
    sent: list[str] = []

    def statement(_connection: Any, _cursor: Any, sql: str, *_: Any) -> None:
        sent.append(sql)

    event.listen(engine.sync_engine, "before_cursor_execute", statement)
    try:
        with pytest.raises(QueryError) as caught:
            await usage_report(engine, query, max_rows=len(whole.rows) - 1)
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", statement)
    assert sum(statement.endswith(f" LIMIT {len(whole.rows)}") for statement in sent) == 1
    assert (caught.value.param, caught.value.message) == (
        "group_by",
        f"group_by: the report has more than {len(whole.rows) - 1} rows: narrow the period, the filters or the groups",
    )


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"group_by": "model,colour"}, "group_by"),
        ({"from": "yesterday"}, "from"),
        ({"to": "2026-13-01"}, "to"),
        ({"from": "2026-11-02", "to": "2026-11-01"}, "from"),
        ({"status": "okay"}, "status"),
        ({"modle": "gemma"}, "modle"),
        ({"owner": "team\x00"}, "owner"),  # a NUL: PostgreSQL's error, a 500, before
        ({"key": "\x00"}, "key"),
        ({"model": "x\udcfe"}, "model"),  # a byte that is not UTF-8, from the command line
    ],
)
def test_a_bad_parameter_is_named(params: dict[str, str], param: str) -> None:
    with pytest.raises(QueryError) as caught:
        parse_query(params, NOW)
    assert caught.value.param == param


def test_the_api_filter_knows_every_door() -> None:
    """`APIS` (catalog) spells out `app.context.Ingress` (the catalog does not import the app):
    a door added there and not here would make its own name a 400 in the usage report."""
    assert get_args(Ingress) == APIS
    assert parse_query({"api": ",".join(APIS)}, NOW).api == APIS


def test_the_default_period_is_the_last_30_days() -> None:
    query = parse_query({}, NOW)
    assert (query.start, query.end) == (datetime(2026, 11, 1, tzinfo=UTC), NOW)
    assert parse_query({"to": "2026-11-30T12:00:00"}, NOW).end == datetime(2026, 11, 30, 12, tzinfo=UTC)


async def test_sqlite_through_the_engine_counts_each_row_once(tmp_path: Path) -> None:
    """A SQLite URI filename is written through the engine's own connection (`EngineStore`)."""
    url = f"sqlite+aiosqlite:///file:{tmp_path / 'uri.db'}?uri=true"
    await upgrade_async(url)
    engine = open_engine(url)
    try:
        records = seeded_records(200, seed=3)
        await write_records(engine, records[:120])
        await write_records(engine, [records[100], *records[100:]])
        rows = await ledger_rows(engine)
        assert len(rows) == 200
        for level in LEVELS:  # every roll-up level, kept through the engine too
            assert await rollup_rows(engine, level) == expected_rollup(rows, level)
        await check(engine, rows, {**EDGES, "group_by": "hour,owner"})
        await check(engine, rows, {**EDGES, "group_by": "hour,model"})
        await check(engine, rows, {"from": "2026-11-27", "to": "2026-12-01", "group_by": "model"})
    finally:
        await engine.dispose()


async def test_costs_past_nine_billion_dollars_sum_exactly(engine: AsyncEngine) -> None:
    """SQLite sums money in integer pieces: whole nano-dollars went past 2^63 at $9.2 billion, and
    SQLite then made their product a float silently (one row) or its SUM raised (two rows)."""
    moment = datetime(2026, 11, 28, 10, 30, tzinfo=UTC)
    costs = [
        Decimal("12345678901.123456789123456789"),
        Decimal("5000000000"),
        Decimal("-4999999999.000000000000000001"),
    ]
    records = [
        LedgerRecord(
            request_id=f"big-{index}-{hours}",
            started_at=moment + timedelta(hours=hours),
            finished_at=moment + timedelta(hours=hours, seconds=1),
            status="ok",
            streamed=False,
            latency_ms=1.0,
            model="m",
            provider="p",
            input_tokens=1,
            cost_usd=cost,
            estimated_cost_usd=cost,
            cost_source="authoritative",
        )
        for index, cost in enumerate(costs)
        for hours in (0, 2, 30)  # read as raw rows, from the hourly and from the daily roll-ups
    ]
    await write_records(engine, records)
    one = "12345678902.123456789123456788"  # by hand: Decimal's default 28 digits would round the sum
    for params, each in (
        ({"from": "2026-11-28T10:15:00Z", "to": "2026-11-28T10:45:00Z"}, one),  # raw rows
        ({"from": "2026-11-28T10:00:00Z", "to": "2026-11-28T11:00:00Z"}, one),  # the hourly roll-up
        ({"from": "2026-11-27", "to": "2026-12-01"}, "37037036706.370370367370370364"),  # days and hours
    ):
        totals = (await usage_report(engine, parse_query(params, NOW))).totals
        assert (totals.cost_usd, totals.authoritative_cost_usd) == (each, each), params


@pytest.mark.parametrize(
    ("given", "values"),
    [
        ("team\\, EU", ("team, EU",)),
        ("team\\, EU,ops", ("team, EU", "ops")),
        ("a\\\\,b", ("a\\", "b")),  # an escaped backslash, then the list's comma
        ("C:\\dir", ("C:\\dir",)),  # any other backslash is itself
        ("a,b", ("a", "b")),
    ],
)
def test_a_filter_value_may_hold_an_escaped_comma(given: str, values: tuple[str, ...]) -> None:
    assert parse_query({"owner": given}, NOW).owner == values


async def test_an_owner_with_a_comma_is_filtered_on(engine: AsyncEngine) -> None:
    """An owner is free text: `owner=team,c` was split into `team` and `c`, with no way to ask for it."""
    moment = datetime(2026, 11, 28, 10, 30, tzinfo=UTC)
    records = [
        LedgerRecord(
            request_id=f"owned-{index}",
            started_at=moment,
            finished_at=moment,
            status="ok",
            streamed=False,
            latency_ms=1.0,
            owner=owner,
            model="m",
            cost_usd=Decimal(index + 1),
        )
        for index, owner in enumerate(["team,c", "team", "c", "team,c"])
    ]
    await write_records(engine, records)
    period = {"from": "2026-11-28", "to": "2026-11-29"}
    report = await usage_report(engine, parse_query({**period, "owner": "team\\,c"}, NOW))
    assert (report.totals.requests, report.totals.cost_usd) == (2, "5")
    report = await usage_report(engine, parse_query({**period, "owner": "team,c", "group_by": "owner"}, NOW))
    assert [(row.owner, row.requests) for row in report.rows] == [("c", 1), ("team", 1)]
