"""The per-request context: who asked, through which door, when, and until when.

One `RequestContext` is made at the HTTP edge, once the request is decoded, and read everywhere
after it (pipeline, accounting, the ledger row, the canonical log line); nothing fills in its
fields later. The request's own data (messages, tools …) stays in `CompletionRequest`; what
happened to it is the pipeline's `Outcome`. The ledger row is a function of those two
(`app.pipeline.accounting.ledger_record`).

`Principal` is the caller's identity: the API key that authenticated the request at the edge
(`app.access`), `ANONYMOUS` with `[auth] mode = "none"`.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Literal

from msgspec import Struct

Ingress = Literal["unified", "openai_chat", "openai_completions", "anthropic_messages"]  # ingress.md


class Principal(Struct, frozen=True):
    """The caller, as the ledger and the limits see it; `None` fields mean "not known"."""

    key_id: str | None = None
    owner: str | None = None


ANONYMOUS = Principal()


class RequestContext(Struct, frozen=True, kw_only=True):
    request_id: str
    ingress: Ingress
    stream: bool
    deadline: float  # `loop.time()` by which the failover loop must have an answer started
    principal: Principal = ANONYMOUS
    started_at: datetime  # wall clock, for the ledger and the price in effect
    started: float  # `time.perf_counter()`, for latency and time to first token


def new_context(
    request_id: str, ingress: Ingress, *, stream: bool, deadline: float, principal: Principal = ANONYMOUS
) -> RequestContext:
    return RequestContext(
        request_id=request_id,
        ingress=ingress,
        stream=stream,
        deadline=deadline,
        principal=principal,
        started_at=datetime.now(UTC),
        started=time.perf_counter(),
    )
