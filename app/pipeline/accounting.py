"""Accounting for one finished request: its cost, its ledger row and its canonical log line.

Cost rules (cost.md): a request served by a provider with `gpu_hour_usd` costs its share of that
provider's busy time (`amortized`, `app.pipeline.gpu_time`) — the operator's own GPU bill wins over
any per-token figure, and it is charged with or without usage, since the GPU time was spent. Else
an upstream-reported billed cost is `authoritative`; otherwise the catalog estimate from the price
row in effect at the request's start is `estimated`; no usage or no usable price is unpriced (None).
The estimate is computed whenever there is usage — once per request, into a `Cost` — and kept in
the ledger beside an authoritative (or amortized) cost. Unknown usage stays NULL in the ledger,
never 0.

`ledger_record` is a function of the request's context and its outcome only; the canonical log
line is that record (`log_line`, or `app.logging.LineWriter.request_line` from its JSON). What
settles an API key's reservation is the outcome's too (`settlement`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import msgspec

from app.context import RequestContext
from app.pipeline.events import UNPRICED, Cost, Outcome
from catalog.exact import COST_PRECISION, COST_SCALE
from catalog.pricing import estimate_cost
from catalog.records import LedgerRecord, storable_id
from catalog.snapshot import CatalogSnapshot
from providers.events import Usage

_LEDGER_COST_LIMIT = Decimal(10) ** (COST_PRECISION - COST_SCALE)  # the ledger's cost column holds less


def price(
    snapshot: CatalogSnapshot,
    provider: str,
    model: str,
    started_at: datetime,
    usage: Usage | None,
    billed: Decimal | None,
    amortized: Decimal | None = None,
) -> Cost:
    """The request's `Cost`: `amortized` (its share of a GPU's time) wins, then `billed` (the
    upstream's own figure), then the catalog estimate."""
    if usage is None:
        return UNPRICED if amortized is None else Cost(amortized, "amortized")
    row = snapshot.price_at(provider, model, started_at)
    estimate = estimate_cost(
        row,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
    )
    if estimate is not None and estimate >= _LEDGER_COST_LIMIT:  # a catalog price no real bill reaches
        estimate = None
    price_id = row.id if row is not None else None
    if amortized is not None:
        return Cost(amortized, "amortized", estimate, price_id)
    if billed is not None:
        return Cost(billed, "authoritative", estimate, price_id)
    if estimate is not None:
        return Cost(estimate, "estimated", estimate, price_id)
    return Cost(price_id=price_id)


def ledger_record(ctx: RequestContext, outcome: Outcome) -> LedgerRecord:
    usage, error, cost = outcome.usage, outcome.error, outcome.cost
    first = outcome.first_content
    return LedgerRecord(  # by position, in the fields' order: `catalog.records.POSITIONAL` says why
        ctx.request_id,  # request_id
        ctx.started_at,  # started_at
        ctx.started_at + timedelta(seconds=outcome.finished - ctx.started),  # finished_at: start + elapsed
        outcome.status,  # status
        ctx.stream,  # streamed
        round((outcome.finished - ctx.started) * 1000, 3),  # latency_ms
        outcome.attempts,  # attempts
        ctx.principal.key_id,  # api_key_id
        ctx.principal.owner,  # owner
        ctx.ingress,  # api
        outcome.model,  # model
        outcome.provider,  # provider
        outcome.upstream_model,  # upstream_model
        storable_id(outcome.upstream_request_id),  # upstream_request_id
        error.type if error is not None else None,  # error_type
        error.status_code if error is not None else None,  # error_status
        outcome.stop_reason,  # stop_reason
        usage.input_tokens if usage else None,  # input_tokens
        usage.output_tokens if usage else None,  # output_tokens
        usage.reasoning_tokens if usage else None,  # reasoning_tokens
        usage.cache_read_tokens if usage else None,  # cache_read_tokens
        usage.cache_write_tokens if usage else None,  # cache_write_tokens
        outcome.usage_estimated,  # usage_estimated
        cost.usd,  # cost_usd
        cost.estimate_usd,  # estimated_cost_usd
        cost.source,  # cost_source
        cost.price_id,  # price_id
        round((first - ctx.started) * 1000, 3) if first is not None else None,  # ttft_ms
    )


def log_line(log: Any, record: LedgerRecord) -> None:
    """The canonical line through structlog's chain, for a pipeline without the service's
    `LineWriter` (which writes the same fields from the record's JSON: `LineWriter.request_line`)."""
    log.info("request", **msgspec.to_builtins(record))


_ZERO = Decimal(0)


def settlement(outcome: Outcome) -> tuple[Decimal | None, int | None]:
    """What settles a key's reservation (access.md): the real cost and token count. A failure with
    no usage settles to 0, and so does a cancellation with nothing counted (the client gone while
    its request queued for a backend; one gone mid-answer has counted usage). Where a figure is
    unknown otherwise (an answer whose upstream reported no usage, tokens in a bucket the catalog
    has no price for) it is None: the reservation, the worst case the request was admitted on,
    stands for it, so an unknown cost never spends a budget's money for free. The ledger keeps
    NULL (cost.md: unknown is not zero)."""
    usage, usd = outcome.usage, outcome.cost.usd
    if usage is None:  # an answer's is unknown; a failure's, or a cancellation's before any output, 0
        answered = outcome.status == "ok"
        return (usd if usd is not None else None if answered else _ZERO), (None if answered else 0)
    return usd, (
        usage.input_tokens
        + usage.output_tokens
        + usage.reasoning_tokens
        + usage.cache_read_tokens
        + usage.cache_write_tokens
    )
