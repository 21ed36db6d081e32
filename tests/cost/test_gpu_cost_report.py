"""`GET /api/v1/catalog/gpu-cost` and `switchyard catalog gpu-cost`: amortized $/Mtok on your GPU
beside the hosted providers' catalog prices for the same model, against hand-computed Decimals over
ledger rows seeded on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from catalog.records import LedgerRecord
from tests.cost.test_drift import seed
from tests.support.catalog import catalog_toml, model, price
from tests.support.cli import cli_env, run_cli
from tests.support.gateway import StartGateway

FROM, TO = "2026-04-01T00:00:00Z", "2026-05-01T00:00:00Z"
START = datetime(2026, 4, 1, tzinfo=UTC)
CATALOG = catalog_toml(
    model("m1", ("gpu", "up-m1"), ("hosted-a", "a-m1"), ("hosted-b", "b-m1")),
    model("m2", ("gpu", "up-m2")),
    prices=[
        price("gpu", "m1", "0.01", "0.02"),  # the GPU's own catalog row is not a hosted price
        price("hosted-a", "m1", "0.50", "1.50"),
        price("hosted-a", "m1", "0.45", "1.35", effective_from="2026-05-01"),  # at `to`, which is exclusive
        price("hosted-a", "m1", "0.40", "1.20", effective_from="2026-06-01"),  # after the period
        price("hosted-b", "m1", "0.20", "0.80", cache_read="0.05"),
    ],
)


def row(n: int, model: str, cost: str, source: str = "amortized", **changes: Any) -> LedgerRecord:
    at = changes.pop("started_at", START + timedelta(hours=n))
    fields: dict[str, Any] = {
        "request_id": f"019ad1c4-0000-7000-8000-{n:012d}",
        "started_at": at,
        "finished_at": at + timedelta(seconds=1),
        "status": "ok",
        "streamed": True,
        "latency_ms": 1000.0,
        "provider": "gpu",
        "model": model,
        "cost_usd": Decimal(cost),
        "cost_source": source,
        **changes,
    }
    return LedgerRecord(**fields)


def tokens(input: int, output: int, cache_read: int = 0) -> dict[str, int]:
    return {
        "input_tokens": input,
        "output_tokens": output,
        "reasoning_tokens": 0,
        "cache_read_tokens": cache_read,
        "cache_write_tokens": 0,
    }


SEEDED = [
    row(1, "m1", "0.000012345678901234", **tokens(1000, 500)),
    row(2, "m1", "0.0001", **tokens(3000, 1500, cache_read=200)),
    row(3, "m1", "0.000001", status="error"),  # no usage reported: its GPU time still counts
    row(4, "m2", "0.00000075", **tokens(5, 4)),
    # not amortized, or outside the period:
    row(10, "m1", "7", source="estimated", **tokens(1, 1)),
    row(11, "m1", "7", started_at=START - timedelta(seconds=1), **tokens(1, 1)),
]

# m1: 6,200 tokens (4,000 input, 2,000 output, 200 cache reads) for 0.000113345678901234 USD:
#   GPU        0.000113345678901234 x 1e6 / 6200 = 0.01828156111310...   -> 0.0182815611
#   hosted-a   4000 x 0.50 + 2000 x 1.50 + 200 x 0.50 (cache reads at the input rate) = 5100 per 1e6
#              = 0.0051 USD; x 1e6 / 6200 = 0.82258064516...             -> 0.8225806452
#   hosted-b   4000 x 0.20 + 2000 x 0.80 + 200 x 0.05 = 2410 per 1e6 = 0.00241 USD
#              x 1e6 / 6200 = 0.38870967741...                           -> 0.3887096774
# m2: 9 tokens for 0.00000075 USD: 0.75 / 9 = 0.08333...                 -> 0.0833333333
EXPECTED = {
    "from": FROM,
    "to": TO,
    "rows": [
        {
            "provider": "gpu",
            "model": "m1",
            "requests": 3,
            "tokens": 6200,
            "amortized_usd": "0.000113345678901234",
            "usd_per_mtok": "0.0182815611",
            "hosted": [
                {
                    "provider": "hosted-a",
                    "input_usd_per_mtok": "0.5",
                    "output_usd_per_mtok": "1.5",
                    "same_usage_usd": "0.0051",
                    "usd_per_mtok": "0.8225806452",
                },
                {
                    "provider": "hosted-b",
                    "input_usd_per_mtok": "0.2",
                    "output_usd_per_mtok": "0.8",
                    "same_usage_usd": "0.00241",
                    "usd_per_mtok": "0.3887096774",
                },
            ],
        },
        {
            "provider": "gpu",
            "model": "m2",
            "requests": 1,
            "tokens": 9,
            "amortized_usd": "0.00000075",
            "usd_per_mtok": "0.0833333333",
            "hosted": [],
        },
    ],
}


async def test_gpu_cost_beside_hosted_prices_on_both_databases(report_db: str, start_gateway: StartGateway) -> None:
    await seed(report_db, SEEDED)
    gw = await start_gateway(providers={}, catalog=CATALOG, database_url=report_db)
    response = await gw.client.get("/api/v1/catalog/gpu-cost", params={"from": FROM, "to": TO})
    assert response.status_code == 200, response.text
    assert response.json() == EXPECTED
    assert Decimal("0.000113345678901234") * 1_000_000 / 6200 == Decimal("0.01828156111310225806451612903")


def test_cli_gpu_cost_json_and_table(tmp_path: Path) -> None:
    (tmp_path / "models.toml").write_text(CATALOG)
    config = tmp_path / "config.toml"
    config.write_text('[database]\nurl = "sqlite+aiosqlite:///switchyard.db"\n\n[catalog]\nfiles = ["models.toml"]\n')
    env = cli_env(SWITCHYARD_CONFIG=str(config))
    assert run_cli(tmp_path, "catalog", "sync", env=env).returncode == 0
    asyncio.run(seed(f"sqlite+aiosqlite:///{tmp_path / 'switchyard.db'}", SEEDED))

    done = run_cli(tmp_path, "catalog", "gpu-cost", "--from", FROM, "--to", TO, "--format", "json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == EXPECTED

    table = run_cli(tmp_path, "catalog", "gpu-cost", "--from", FROM, "--to", TO, env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith(f"GPU cost {FROM} .. {TO}")
    assert [line.split() for line in lines[1:]] == [
        ["provider", "model", "requests", "tokens", "usd", "usd_per_mtok"],
        ["gpu", "m1", "3", "6200", "0.000113345678901234", "0.0182815611"],
        ["vs", "hosted-a", "in", "0.5", "out", "1.5", "0.0051", "0.8225806452"],
        ["vs", "hosted-b", "in", "0.2", "out", "0.8", "0.00241", "0.3887096774"],
        ["gpu", "m2", "1", "9", "0.00000075", "0.0833333333"],
    ]
