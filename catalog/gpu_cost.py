"""GPU cost against hosted prices (cost.md, "Local GPU cost"): what a million tokens cost on your GPU.

A provider with `gpu_hour_usd` prices its requests by their share of its busy time
(`cost_source = amortized`, `app.pipeline.gpu_time`). `gpu_costs` sums those ledger rows per
provider and model over a period, in one SQL aggregate, and sets beside each the catalog prices of
every *other* provider that sells the same model:

- `tokens`: every token of the amortized rows, all five buckets (a row whose upstream reported no
  usage adds its cost but no tokens: the GPU time was spent all the same);
- `amortized_usd`: the exact sum of their costs (a decimal string);
- `usd_per_mtok`: amortized_usd / tokens x 1e6, rounded half-even to 10 decimal places (the
  catalog's own price scale), null with no tokens;
- `hosted`: per other provider with a price row for the model in effect at the period's last
  instant (a microsecond before its exclusive end: a price change at midnight belongs to the next
  day; or now, when that is earlier): its `input`/`output` rates (USD per million tokens, as the catalog
  holds them), and `same_usage_usd` — what the GPU's exact token mix (the five bucket sums) would
  have cost at that provider's prices (`catalog.pricing.estimate_cost`, null when the row has no
  rate for a bucket that has tokens) — with its own `usd_per_mtok`, so both sides are priced on the
  same tokens: like with like.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from typing import Any

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.exact_sum import ExactSum, decimal_text
from catalog.pricing import estimate_cost
from catalog.report_period import Period
from catalog.snapshot import CatalogSnapshot, PriceRow, load_snapshot
from catalog.tables import LedgerRow

PER_MTOK_QUANTUM = Decimal("1E-10")
_BUCKETS = ("input_tokens", "output_tokens", "reasoning_tokens", "cache_read_tokens", "cache_write_tokens")
_LAST_INSTANT = timedelta(microseconds=1)  # a period's last instant is this before its exclusive end


class HostedPrice(msgspec.Struct, frozen=True):
    provider: str
    input_usd_per_mtok: str | None
    output_usd_per_mtok: str | None
    same_usage_usd: str | None
    usd_per_mtok: str | None


class GpuModelCost(msgspec.Struct, frozen=True):
    provider: str
    model: str
    requests: int
    tokens: int
    amortized_usd: str
    usd_per_mtok: str | None
    hosted: list[HostedPrice]


class GpuCostReport(msgspec.Struct, frozen=True):
    start: str = msgspec.field(name="from")
    end: str = msgspec.field(name="to")
    rows: list[GpuModelCost] = msgspec.field(default_factory=list)


def per_mtok(usd: Decimal, tokens: int) -> str | None:
    """USD per million tokens, rounded half-even to 10 places; None without tokens."""
    if tokens <= 0:
        return None
    with localcontext(prec=60, rounding=ROUND_HALF_EVEN):
        return decimal_text((usd * 1_000_000 / tokens).quantize(PER_MTOK_QUANTUM))


def _hosted(row: PriceRow, buckets: dict[str, int], tokens: int) -> HostedPrice:
    same = estimate_cost(row, **buckets)
    return HostedPrice(
        provider=row.provider,
        input_usd_per_mtok=decimal_text(row.input) if row.input is not None else None,
        output_usd_per_mtok=decimal_text(row.output) if row.output is not None else None,
        same_usage_usd=decimal_text(same) if same is not None else None,
        usd_per_mtok=per_mtok(same, tokens) if same is not None else None,
    )


def _model_cost(row: Any, cost: Decimal, snapshot: CatalogSnapshot, gpu: set[str], when: datetime) -> GpuModelCost:
    buckets = {name: int(getattr(row, name) or 0) for name in _BUCKETS}
    tokens = sum(buckets.values())
    prices = snapshot.prices_for(row.model, when)
    hosted = [_hosted(price, buckets, tokens) for provider, price in sorted(prices.items()) if provider not in gpu]
    return GpuModelCost(
        provider=row.provider,
        model=row.model,
        requests=row.requests,
        tokens=tokens,
        amortized_usd=decimal_text(cost),
        usd_per_mtok=per_mtok(cost, tokens),
        hosted=hosted,
    )


async def gpu_costs(engine: AsyncEngine, period: Period) -> GpuCostReport:
    """Amortized $/Mtok per GPU provider and model over `period`, beside the hosted prices."""
    cost = ExactSum(LedgerRow.cost_usd, "cost", engine.dialect.name)
    sums = [func.sum(getattr(LedgerRow, name)).label(name) for name in _BUCKETS]
    query = (
        select(LedgerRow.provider, LedgerRow.model, func.count().label("requests"), *sums, *cost.columns)
        .where(
            LedgerRow.started_at >= period.start,
            LedgerRow.started_at < period.end,
            LedgerRow.cost_source == "amortized",
            LedgerRow.cost_usd.is_not(None),
            LedgerRow.provider.is_not(None),
            LedgerRow.model.is_not(None),
        )
        .group_by(LedgerRow.provider, LedgerRow.model)
        .order_by(LedgerRow.provider, LedgerRow.model)
    )
    async with engine.connect() as connection:
        grouped = list(await connection.execute(query))
    snapshot = await load_snapshot(engine)
    gpu = {row.provider for row in grouped}
    when = min(period.end - _LAST_INSTANT, datetime.now(UTC))  # a price from `end` on is not the period's
    rows = [_model_cost(row, cost.read(row) or Decimal(0), snapshot, gpu, when) for row in grouped]
    return GpuCostReport(start=msgspec.to_builtins(period.start), end=msgspec.to_builtins(period.end), rows=rows)
