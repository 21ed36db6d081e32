"""Latency percentiles (`p50_ms`, `p95_ms`): the nearest rank — the ⌈p·n⌉-th smallest of a group's
n values — on SQLite (a window) and PostgreSQL (`percentile_disc`, whose rank is computed in
floating point: n = 20 must give the 19th value for p95, not the 20th), with one value, two,
around 20, ties across the rank, and every n up to 60 against the oracle.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.ledger_write import write_records
from catalog.records import LedgerRecord
from catalog.usage_query import parse_query
from catalog.usage_report import usage_report
from tests.catalog.usage_oracle import expected, ledger_rows

START = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
PERIOD = {"from": "2026-11-28", "to": "2026-11-29"}
# n -> the ranks of p50 and p95: ⌈n/2⌉ and ⌈0.95·n⌉
RANKS = {1: (1, 1), 2: (1, 2), 19: (10, 19), 20: (10, 19), 21: (11, 20), 40: (20, 38), 100: (50, 95)}
TIES = {
    "ties-19": [1.0] * 19 + [2.0],  # p95 is the 19th of 20: 1.0 (the 20th would be 2.0)
    "ties-mid": [3.5] * 5 + [8.0] * 10 + [9.0] * 5,  # p50 the 10th: 8.0; p95 the 19th: 9.0
    "ties-all": [42.125] * 7,
}


def _records(latencies: dict[str, list[float]], seed: int) -> list[LedgerRecord]:
    rng = random.Random(seed)  # noqa: S311  # shuffled insertion order, not a secret
    records = []
    for model, values in latencies.items():
        shuffled = list(values)
        rng.shuffle(shuffled)
        for value in shuffled:
            started = START + timedelta(seconds=len(records))
            records.append(
                LedgerRecord(
                    request_id=f"lat-{len(records):05d}",
                    started_at=started,
                    finished_at=started + timedelta(milliseconds=value),
                    status="ok",
                    streamed=False,
                    latency_ms=value,
                    model=model,
                    provider="local",
                )
            )
    return records


def _value(rank: int) -> float:
    return 10.0 * rank + 0.25


async def test_ranks_for_one_two_nineteen_twenty_twenty_one_and_ties(engine: AsyncEngine) -> None:
    latencies = {f"n{n:03d}": [_value(rank) for rank in range(1, n + 1)] for n in RANKS}
    await write_records(engine, _records({**latencies, **TIES}, seed=1))
    query = parse_query({**PERIOD, "group_by": "model"}, START)
    answer = msgspec.to_builtins(await usage_report(engine, query))
    got = {row["model"]: (row["p50_ms"], row["p95_ms"]) for row in answer["rows"]}
    assert got == {
        **{f"n{n:03d}": (_value(p50), _value(p95)) for n, (p50, p95) in RANKS.items()},
        "ties-19": (1.0, 1.0),
        "ties-mid": (8.0, 9.0),
        "ties-all": (42.125, 42.125),
    }
    assert answer == {**answer, **expected(await ledger_rows(engine), query)}


@pytest.mark.parametrize("group_by", ["model", "model,provider,status", "provider"])
async def test_every_group_size_up_to_sixty_against_the_oracle(engine: AsyncEngine, group_by: str) -> None:
    rng = random.Random(60)  # noqa: S311
    latencies = {
        f"s{n:02d}": [rng.choice([1.5, 2.0, 2.5]) * rng.randrange(1, 40) for _ in range(n)] for n in range(1, 61)
    }
    await write_records(engine, _records(latencies, seed=2))
    query = parse_query({"from": "2026-11-28T10:00:00.5Z", "to": "2026-11-28T23:00:00Z", "group_by": group_by}, START)
    answer = msgspec.to_builtins(await usage_report(engine, query))
    assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(await ledger_rows(engine), query)
    assert answer["totals"]["requests"] == 60 * 61 // 2 - 1  # the first row starts before `from`
