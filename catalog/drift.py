"""Price drift (cost.md): what upstreams billed against what the catalog estimated for the same usage.

A ledger row with `cost_source = authoritative` holds the upstream's billed cost in `cost_usd` and
the catalog's estimate for the same usage in `estimated_cost_usd` (`app.pipeline.accounting`).
`price_drift` compares the two per provider and model over a period, in one SQL aggregate:

- `requests`: the rows compared — authoritative, with both a billed cost and an estimate (a row
  the catalog could not price has nothing to compare, and is left out of both sums);
- `billed_usd`, `estimated_usd`: exact decimal strings of the two sums (`catalog.exact_sum`);
- `ratio`: billed / estimated as a decimal string rounded half-even to 6 decimal places
  (`"1.031250"`), a string like the sums so JSON readers never see a float; null when the estimate
  sums to zero;
- `flagged`: |billed - estimated| > 2 % of estimated, decided on the exact sums (not on the
  rounded ratio); a zero estimate with a non-zero bill is flagged.

The period is on `started_at` (the price row in effect at a request's start is the one it was
estimated with). Rows are ordered flagged first, then by provider and model.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, localcontext

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.exact_sum import ExactSum, decimal_text
from catalog.report_period import Period
from catalog.tables import LedgerRow

FLAG_THRESHOLD = Decimal("0.02")
RATIO_QUANTUM = Decimal("0.000001")


class DriftRow(msgspec.Struct, frozen=True):
    provider: str
    model: str
    requests: int
    billed_usd: str
    estimated_usd: str
    ratio: str | None
    flagged: bool


class DriftReport(msgspec.Struct, frozen=True):
    start: str = msgspec.field(name="from")
    end: str = msgspec.field(name="to")
    threshold: str = decimal_text(FLAG_THRESHOLD)
    rows: list[DriftRow] = msgspec.field(default_factory=list)


def drift_row(provider: str, model: str, requests: int, billed: Decimal, estimated: Decimal) -> DriftRow:
    """One provider/model's comparison from its two exact sums."""
    with localcontext(prec=60, rounding=ROUND_HALF_EVEN):
        ratio = (billed / estimated).quantize(RATIO_QUANTUM) if estimated else None
        flagged = abs(billed - estimated) > FLAG_THRESHOLD * abs(estimated)
    return DriftRow(
        provider=provider,
        model=model,
        requests=requests,
        billed_usd=decimal_text(billed),
        estimated_usd=decimal_text(estimated),
        ratio=format(ratio, "f") if ratio is not None else None,
        flagged=flagged,
    )


async def price_drift(engine: AsyncEngine, period: Period) -> DriftReport:
    """Billed against estimated, per provider and model, over `period` (one grouped query)."""
    billed = ExactSum(LedgerRow.cost_usd, "billed", engine.dialect.name)
    estimated = ExactSum(LedgerRow.estimated_cost_usd, "estimated", engine.dialect.name)
    query = (
        select(LedgerRow.provider, LedgerRow.model, func.count().label("requests"), *billed.columns, *estimated.columns)
        .where(
            LedgerRow.started_at >= period.start,
            LedgerRow.started_at < period.end,
            LedgerRow.cost_source == "authoritative",
            LedgerRow.cost_usd.is_not(None),
            LedgerRow.estimated_cost_usd.is_not(None),
            LedgerRow.provider.is_not(None),
            LedgerRow.model.is_not(None),
        )
        .group_by(LedgerRow.provider, LedgerRow.model)
    )
    async with engine.connect() as connection:
        result = await connection.execute(query)
        zero = Decimal(0)
        rows = [
            drift_row(row.provider, row.model, row.requests, billed.read(row) or zero, estimated.read(row) or zero)
            for row in result
        ]
    rows.sort(key=lambda row: (not row.flagged, row.provider, row.model))
    return DriftReport(start=msgspec.to_builtins(period.start), end=msgspec.to_builtins(period.end), rows=rows)
