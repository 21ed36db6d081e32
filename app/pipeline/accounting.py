"""Accounting for one finished request: usage, cost, the ledger row and the canonical log line.

Cost rules (cost.md): an upstream-reported billed cost is `authoritative` and wins; otherwise the
catalog estimate from the price row in effect at the request's start is `estimated`; no usage or
no usable price is `null`. The estimate is always computed when there is usage, and kept in the
ledger beside an authoritative cost. Unknown usage stays NULL in the ledger, never 0.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from app.pipeline.fold import STOP_REASONS, Assembly
from catalog.pricing import estimate_cost
from catalog.records import CostSource, LedgerRecord
from catalog.snapshot import CatalogSnapshot
from providers import events as ev

if TYPE_CHECKING:
    from app.pipeline.pipeline import Exchange


def estimate(snapshot: CatalogSnapshot, exchange: Exchange, usage: ev.Usage) -> tuple[Decimal | None, int | None]:
    """The catalog estimate and the price row's id; computed once per request (the response and
    the ledger row both need it)."""
    memo = exchange.estimate
    if memo is not None and memo[0] is usage:
        return memo[1], memo[2]
    backend, model = exchange.backend, exchange.model
    if backend is None or model is None:
        return None, None
    price = snapshot.price_at(backend.name, model.id, exchange.started_at)
    cost = estimate_cost(
        price,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
    )
    price_id = price.id if price is not None else None
    exchange.estimate = (usage, cost, price_id)
    return cost, price_id


def response_cost(
    snapshot: CatalogSnapshot, exchange: Exchange, report: ev.UsageReport | None
) -> tuple[Decimal | None, CostSource | None]:
    if report is None:
        return None, None
    if report.cost_usd is not None:
        return report.cost_usd, "authoritative"
    cost, _ = estimate(snapshot, exchange, report.usage)
    return (cost, "estimated") if cost is not None else (None, None)


def ledger_record(snapshot: CatalogSnapshot, exchange: Exchange, assembly: Assembly | None) -> LedgerRecord:
    now = time.perf_counter()
    backend, error = exchange.backend, exchange.error
    report = assembly.usage if assembly is not None else None
    usage = report.usage if report is not None else None
    cost, price_id = estimate(snapshot, exchange, usage) if usage is not None else (None, None)
    authoritative = report.cost_usd if report is not None else None
    finish = assembly.final_finish_reason() if assembly is not None and assembly.finish_reason else None
    first = exchange.first_content
    return LedgerRecord(
        request_id=exchange.request_id,
        started_at=exchange.started_at,
        finished_at=datetime.now(UTC),
        api_key_id=None,
        model=exchange.model.id if exchange.model is not None else None,
        provider=backend.name if backend is not None else None,
        upstream_model=backend.upstream_model if backend is not None else None,
        upstream_request_id=assembly.upstream_request_id if assembly is not None else None,
        streamed=exchange.stream,
        status=exchange.status,
        error_type=error.type if error is not None else None,
        error_status=error.status_code if error is not None else None,
        stop_reason=STOP_REASONS[finish] if finish is not None else None,
        input_tokens=usage.input_tokens if usage else None,
        output_tokens=usage.output_tokens if usage else None,
        reasoning_tokens=usage.reasoning_tokens if usage else None,
        cache_read_tokens=usage.cache_read_tokens if usage else None,
        cache_write_tokens=usage.cache_write_tokens if usage else None,
        cost_usd=authoritative if authoritative is not None else cost,
        estimated_cost_usd=cost,
        cost_source="authoritative" if authoritative is not None else ("estimated" if cost is not None else None),
        price_id=price_id,
        latency_ms=round((now - exchange.started) * 1000, 3),
        ttft_ms=round((first - exchange.started) * 1000, 3) if first is not None else None,
        attempts=exchange.attempts,
    )


def log_line(log: Any, record: LedgerRecord) -> None:
    log.info(
        "request",
        request_id=record.request_id,
        model=record.model,
        provider=record.provider,
        status=record.status,
        error_status=record.error_status,
        streamed=record.streamed,
        input_tokens=record.input_tokens,
        output_tokens=record.output_tokens,
        reasoning_tokens=record.reasoning_tokens,
        cache_read_tokens=record.cache_read_tokens,
        cache_write_tokens=record.cache_write_tokens,
        cost_usd=str(record.cost_usd) if record.cost_usd is not None else None,
        latency_ms=record.latency_ms,
        ttft_ms=record.ttft_ms,
        attempts=record.attempts,
    )
