"""The ledger's row type and its enums: what the app hands the ledger writer for one request.

Kept apart from the writer (`catalog.ledger`) and the stores (`catalog.ledger_store`) so that both,
and the app's accounting, import the type without importing each other.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Literal

import msgspec

LedgerStatus = Literal["ok", "error", "cancelled"]
CostSource = Literal["authoritative", "estimated", "amortized"]  # amortized: a share of GPU time


POSITIONAL = 16
"""A call with this many keyword arguments or more costs CPython 3.11 ~0.7 µs more than one with
15, Python functions and msgspec Structs alike, and more the more there are (this row's 28: 18,000
instructions against 3,200 made by position, counted by callgrind). The request path makes its
Structs of more fields by position (`app.pipeline.accounting.ledger_record`, the pipeline's
`Outcome`) or with fewer keywords and the rest set after; `tests/test_architecture.py` finds a
call of 16 keywords or more anywhere in the service."""


class LedgerRecord(msgspec.Struct, frozen=True):
    """One `ledger` row. Token buckets are None when the upstream did not report them. Made by
    position on the request path, so the fields' order is part of its contract (`POSITIONAL`)."""

    request_id: str
    started_at: datetime
    finished_at: datetime
    status: LedgerStatus
    streamed: bool
    latency_ms: float  # milliseconds, sub-millisecond precision kept for benchmarks
    attempts: int = 1
    api_key_id: str | None = None
    owner: str | None = None  # the key's owner when the request was made (migration 0005)
    api: str | None = None  # the ingress that took the request (`unified`, `openai_chat` …)
    model: str | None = None
    provider: str | None = None
    upstream_model: str | None = None
    upstream_request_id: str | None = None
    error_type: str | None = None
    error_status: int | None = None
    stop_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    usage_estimated: bool = False  # the buckets were counted by the gateway, not reported upstream
    cost_usd: Decimal | None = None
    estimated_cost_usd: Decimal | None = None
    cost_source: CostSource | None = None
    price_id: int | None = None
    ttft_ms: float | None = None


UPSTREAM_ID_MAX = 300  # the width of `ledger.upstream_request_id`


def storable_id(upstream_id: str | None) -> str | None:
    """An upstream's id for its request as the column keeps it: at most `UPSTREAM_ID_MAX`
    characters, no NUL. The upstream chooses it, and PostgreSQL refuses the row of a longer one or
    of a NUL in text (SQLite keeps either): the row would be lost for the sake of an id."""
    if upstream_id is None or (len(upstream_id) <= UPSTREAM_ID_MAX and "\x00" not in upstream_id):
        return upstream_id
    return upstream_id.replace("\x00", "")[:UPSTREAM_ID_MAX]


RECORD_JSON = msgspec.json.Encoder()
"""The one encoder of a record's JSON: the journal's line, and the canonical log line the pipeline
writes from the same bytes (encoded once per request)."""
