"""Price drift (cost.md): `GET /api/v1/catalog/drift` and `switchyard catalog drift` against
hand-computed Decimals, over ledger rows seeded on SQLite and on PostgreSQL; and end to end, from
an upstream that reports its billed cost to the drift report.

The seeded sums carry digits a float would lose (1e-18 on 0.3, 30 significant digits), so a sum
that went through floats anywhere fails here.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from catalog.database import open_engine
from catalog.ledger_write import write_records
from catalog.records import LedgerRecord
from tests.support.catalog import catalog_toml, model, price
from tests.support.cli import cli_env, run_cli
from tests.support.client import stream
from tests.support.gateway import StartGateway, provider_table
from tests.support.upstream import ReplayUpstream

FROM, TO = "2026-04-01T00:00:00Z", "2026-05-01T00:00:00Z"
START = datetime(2026, 4, 1, tzinfo=UTC)
PERIOD = {"from": FROM, "to": TO}
EMPTY_CATALOG = catalog_toml(model("m1"))


def row(n: int, provider: str, model: str, billed: str, estimate: str | None, **changes: Any) -> LedgerRecord:
    at = changes.pop("started_at", START + timedelta(hours=n))
    fields: dict[str, Any] = {
        "request_id": f"019ad1c4-0000-7000-8000-{n:012d}",
        "started_at": at,
        "finished_at": at + timedelta(seconds=1),
        "status": "ok",
        "streamed": False,
        "latency_ms": 1000.0,
        "provider": provider,
        "model": model,
        "input_tokens": 10,
        "output_tokens": 5,
        "cost_usd": Decimal(billed),
        "estimated_cost_usd": Decimal(estimate) if estimate is not None else None,
        "cost_source": "authoritative",
        **changes,
    }
    return LedgerRecord(**fields)


SEEDED = [
    row(1, "alpha", "m1", "0.100000000000000001", "0.1", started_at=START),  # `from` is inclusive
    row(2, "alpha", "m1", "0.200000000000000002", "0.2"),
    row(3, "alpha", "m2", "1.03", "1.00"),  # 3 % over: flagged
    row(4, "beta", "m1", "0.98", "1"),  # exactly 2 % under: not flagged (more than 2 % is)
    row(5, "beta", "m2", "0.979999999999999999", "1"),  # just over 2 % under: flagged
    row(6, "gamma", "m1", "123456789012.123456789012345678", "123456789012"),
    row(7, "gamma", "m1", "123456789012.123456789012345678", "123456789012"),
    row(8, "delta", "m1", "0.01", "0"),  # billed with a zero estimate: no ratio, flagged
    # not compared:
    row(20, "alpha", "m1", "5", "5", cost_source="estimated"),
    row(21, "alpha", "m1", "5", None),  # the catalog could not price it
    row(22, "alpha", "m1", "5", "1", started_at=START - timedelta(microseconds=1)),
    row(23, "alpha", "m1", "5", "1", started_at=datetime(2026, 5, 1, tzinfo=UTC)),  # `to` is exclusive
]

EXPECTED = [
    {
        "provider": "alpha",
        "model": "m2",
        "requests": 1,
        "billed_usd": "1.03",
        "estimated_usd": "1",
        "ratio": "1.030000",
        "flagged": True,
    },
    {
        "provider": "beta",
        "model": "m2",
        "requests": 1,
        "billed_usd": "0.979999999999999999",
        "estimated_usd": "1",
        "ratio": "0.980000",
        "flagged": True,
    },
    {
        "provider": "delta",
        "model": "m1",
        "requests": 1,
        "billed_usd": "0.01",
        "estimated_usd": "0",
        "ratio": None,
        "flagged": True,
    },
    {
        "provider": "alpha",
        "model": "m1",
        "requests": 2,
        "billed_usd": "0.300000000000000003",
        "estimated_usd": "0.3",
        "ratio": "1.000000",
        "flagged": False,
    },
    {
        "provider": "beta",
        "model": "m1",
        "requests": 1,
        "billed_usd": "0.98",
        "estimated_usd": "1",
        "ratio": "0.980000",
        "flagged": False,
    },
    {
        "provider": "gamma",
        "model": "m1",
        "requests": 2,
        "billed_usd": "246913578024.246913578024691356",
        "estimated_usd": "246913578024",
        "ratio": "1.000000",
        "flagged": False,
    },
]


async def seed(url: str, records: list[LedgerRecord]) -> None:
    engine = open_engine(url)
    try:
        await write_records(engine, records)
    finally:
        await engine.dispose()


async def test_drift_report_is_exact_on_both_databases(report_db: str, start_gateway: StartGateway) -> None:
    await seed(report_db, SEEDED)
    gw = await start_gateway(providers={}, catalog=EMPTY_CATALOG, database_url=report_db)
    response = await gw.client.get("/api/v1/catalog/drift", params=PERIOD)
    assert response.status_code == 200, response.text
    assert response.json() == {"from": FROM, "to": TO, "threshold": "0.02", "rows": EXPECTED}
    # The ratio is billed / estimated of the exact sums, rounded half-even to 6 places.
    assert Decimal("0.300000000000000003") / Decimal("0.3") == Decimal("1.00000000000000001")


async def test_default_period_is_the_last_30_days(report_db: str, start_gateway: StartGateway) -> None:
    now = datetime.now(UTC)
    recent = [
        row(1, "alpha", "m1", "2", "1", started_at=now - timedelta(days=29, hours=23)),
        row(2, "alpha", "m1", "9", "9", started_at=now - timedelta(days=30, minutes=1)),
    ]
    await seed(report_db, recent)
    gw = await start_gateway(providers={}, catalog=EMPTY_CATALOG, database_url=report_db)
    body = (await gw.client.get("/api/v1/catalog/drift")).json()
    end = datetime.fromisoformat(body["to"])
    assert end - datetime.fromisoformat(body["from"]) == timedelta(days=30)
    assert abs(end - now) < timedelta(minutes=1)
    assert [(r["billed_usd"], r["estimated_usd"], r["ratio"], r["flagged"]) for r in body["rows"]] == [
        ("2", "1", "2.000000", True)
    ]


async def test_bad_period_is_a_400_naming_the_parameter(start_gateway: StartGateway) -> None:
    gw = await start_gateway(providers={}, catalog=EMPTY_CATALOG)
    for params, param in [
        ({"from": "yesterday"}, "from"),
        ({"to": "2026-13-01"}, "to"),
        ({"from": TO, "to": FROM}, "from"),  # as the usage report (one parser: catalog.report_period)
        ({"form": FROM}, "form"),  # a misspelt parameter is not the default period
        ({"from": [FROM, TO]}, "from"),  # given twice: neither is taken silently
        ({"to": [TO, TO]}, "to"),
    ]:
        for path in ("/api/v1/catalog/drift", "/api/v1/catalog/gpu-cost"):
            response = await gw.client.get(path, params=params)
            assert response.status_code == 400, (path, params)
            error = response.json()["error"]
            assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", 400, param)
            assert error["message"].startswith(f"{param}: ")
            assert response.json()["errors"][0]["code"] == "invalid_request_error"


def test_cli_drift_json_table_and_bad_option(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'switchyard.db'}"
    assert run_cli(tmp_path, "db", "upgrade", env=cli_env(SWITCHYARD_CONFIG=str(_config(tmp_path)))).returncode == 0
    asyncio.run(seed(url, SEEDED))
    env = cli_env(SWITCHYARD_CONFIG=str(_config(tmp_path)))

    done = run_cli(tmp_path, "catalog", "drift", "--from", FROM, "--to", TO, "--format", "json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"from": FROM, "to": TO, "threshold": "0.02", "rows": EXPECTED}

    table = run_cli(tmp_path, "catalog", "drift", "--from", FROM, "--to", TO, env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == f"price drift {FROM} .. {TO} (flagged: more than 0.02 off)"
    assert lines[1].split() == ["provider", "model", "requests", "billed_usd", "estimated_usd", "ratio"]
    assert [line.split() for line in lines[2:]] == [
        ["alpha", "m2", "1", "1.03", "1", "1.030000", "DRIFT"],
        ["beta", "m2", "1", "0.979999999999999999", "1", "0.980000", "DRIFT"],
        ["delta", "m1", "1", "0.01", "0", "-", "DRIFT"],
        ["alpha", "m1", "2", "0.300000000000000003", "0.3", "1.000000"],
        ["beta", "m1", "1", "0.98", "1", "0.980000"],
        ["gamma", "m1", "2", "246913578024.246913578024691356", "246913578024", "1.000000"],
    ]

    bad = run_cli(tmp_path, "catalog", "drift", "--from", "soon", env=env)
    assert bad.returncode == 2
    assert "--from: not an ISO 8601 date or time" in bad.stderr


def _config(tmp_path: Path) -> Path:
    (tmp_path / "models.toml").write_text(EMPTY_CATALOG)
    path = tmp_path / "config.toml"
    path.write_text('[database]\nurl = "sqlite+aiosqlite:///switchyard.db"\n\n[catalog]\nfiles = ["models.toml"]\n')
    return path


# End to end: the upstream reports what it billed (a recorded OpenRouter stream: 42 input and 17
# output tokens, usage.cost 0.000123456789012345678), the ledger keeps it beside the catalog's
# estimate for the same usage, and the drift report compares the two.
HONEST = ("1.00", "4.79")  # 42 x 1.00 + 17 x 4.79 = 123.43 per 1e6: 0.00012343, billed/estimate 1.000217
STALE = ("0.15", "0.60")  # 42 x 0.15 + 17 x 0.60 = 16.5 per 1e6: 0.0000165, billed 7.5 x that
BILLED = "0.000123456789012346"  # the reported cost at the ledger's 18 places, half-even


async def test_authoritative_cost_keeps_the_estimate_and_drift_flags_the_stale_price(
    start_gateway: StartGateway,
) -> None:
    async with ReplayUpstream() as honest, ReplayUpstream() as stale:
        catalog = catalog_toml(
            model("m-honest", ("honest", "up-honest")),
            model("m-stale", ("stale", "up-stale")),
            prices=[price("honest", "m-honest", *HONEST), price("stale", "m-stale", *STALE)],
        )
        providers = provider_table({"honest": honest, "stale": stale})
        gw = await start_gateway(providers=providers, catalog=catalog)
        for upstream, name in ((honest, "m-honest"), (stale, "m-stale"), (stale, "m-stale")):
            upstream.enqueue("openrouter_cost_stream")
            _, frames = await stream(gw, name)
            assert frames[-1][1]["usage"] == {
                "input_tokens": 42,
                "output_tokens": 17,
                "reasoning_tokens": 0,
                "cache_read_tokens": 0,
                "cache_write_tokens": 0,
            }
        rows = {(r["provider"], r["request_id"]): r for r in await gw.ledger_rows()}
        assert len(rows) == 3
        for (provider, _), ledger in rows.items():
            assert ledger["cost_source"] == "authoritative"
            assert Decimal(ledger["cost_usd"]) == Decimal(BILLED)
            expected = Decimal("0.00012343") if provider == "honest" else Decimal("0.0000165")
            assert Decimal(ledger["estimated_cost_usd"]) == expected

        response = await gw.client.get("/api/v1/catalog/drift")
        assert response.status_code == 200, response.text
        assert response.json()["rows"] == [
            {
                "provider": "stale",
                "model": "m-stale",
                "requests": 2,
                "billed_usd": "0.000246913578024692",
                "estimated_usd": "0.000033",
                "ratio": "7.482230",
                "flagged": True,
            },
            {
                "provider": "honest",
                "model": "m-honest",
                "requests": 1,
                "billed_usd": BILLED,
                "estimated_usd": "0.00012343",
                "ratio": "1.000217",
                "flagged": False,
            },
        ]


def test_cli_reports_bring_the_schema_up_to_date_as_the_other_commands_do(tmp_path: Path) -> None:
    """`catalog drift` and `gpu-cost` on a database not migrated yet: SQLite's `auto_migrate`
    migrates it (they used to print an SQL error of 2 KB); with `auto_migrate = false`, the one
    line that says to run `switchyard db upgrade`, as `serve` and `catalog sync` say it."""
    env = cli_env(SWITCHYARD_CONFIG=str(_config(tmp_path)))
    (tmp_path / "switchyard.db").touch()  # there, never migrated (a report makes no database: tests/test_cli_usage.py)
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "switchyard.db").touch()
    for command in ("drift", "gpu-cost"):
        done = run_cli(tmp_path, "catalog", command, "--format", "json", env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["rows"] == []
    fresh = tmp_path / "fresh"
    config = _config(fresh)
    config.write_text(config.read_text().replace("\n\n[catalog]", "\nauto_migrate = false\n\n[catalog]"))
    for command in ("drift", "gpu-cost"):
        refused = run_cli(fresh, "catalog", command, env=cli_env(SWITCHYARD_CONFIG=str(config)))
        assert (refused.returncode, refused.stdout) == (1, "")
        assert refused.stderr == (
            "switchyard: SchemaNotCurrent: the database has no Switchyard schema: run `switchyard db upgrade` first\n"
        )
