"""`GET /api/v1/models`: the catalog as clients and operators see it, with live backend state.

Each model lists its aliases, limits, capabilities, the prices in effect now (exact decimals as
strings, without the storage scale's trailing zeros) and every deployment with the state of its
backend: ready or not and why (provider disabled, breaker open, failed probe, cooling until when),
requests in flight and queued, and the concurrency limit.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from msgspec import Struct

from app.routing.router import Backend, Router


class BackendView(Struct, omit_defaults=True):
    provider: str
    upstream_model: str
    priority: int
    ready: bool
    in_flight: int
    queued: int
    limit: int
    breaker_open: bool
    probe_failed: bool
    unlisted: bool  # its provider's `/models` leaves its upstream model out (fastrun, primalabs)
    cooling_until: str | None = None
    cooling_reason: str | None = None
    disabled_reason: str | None = None
    upstream_queue_depth: float | None = None


class PriceView(Struct, omit_defaults=True):
    provider: str
    effective_from: str
    input: str | None = None
    output: str | None = None
    cache_read: str | None = None
    cache_write: str | None = None
    reasoning: str | None = None


class ModelView(Struct):
    id: str
    aliases: list[str]
    context_window: int | None
    max_output: int | None
    capabilities: list[str]
    default: bool
    ready: bool
    deployments: list[BackendView]
    prices: list[PriceView]
    object: str = "model"


class ModelList(Struct):
    data: list[ModelView]
    object: str = "list"


def model_list(router: Router, now: float) -> ModelList:
    wall = datetime.now(UTC)
    views = []
    for entry in router.snapshot.models:
        deployments = [_backend_view(b, now, wall) for b in router.backends(entry)]
        prices = [
            PriceView(
                provider=p.provider,
                effective_from=p.effective_from.isoformat(),
                input=money(p.input),
                output=money(p.output),
                cache_read=money(p.cache_read),
                cache_write=money(p.cache_write),
                reasoning=money(p.reasoning),
            )
            for p in router.snapshot.prices_for(entry.id).values()
        ]
        views.append(
            ModelView(
                id=entry.id,
                aliases=list(entry.aliases),
                context_window=entry.context_window,
                max_output=entry.max_output,
                capabilities=sorted(entry.capabilities),
                default=entry.is_default,
                ready=any(d.ready for d in deployments),
                deployments=deployments,
                prices=prices,
            )
        )
    return ModelList(views)


def _backend_view(backend: Backend, now: float, wall: datetime) -> BackendView:
    state = backend.state
    cooling = state.cooling(now)
    return BackendView(
        provider=backend.name,
        upstream_model=backend.upstream_model,
        priority=backend.priority,
        ready=backend.ready(now),
        in_flight=state.in_flight,
        queued=state.queued,
        limit=state.limit,
        breaker_open=state.breaker_open,
        probe_failed=state.probe_failed,
        unlisted=state.unlisted,
        cooling_until=(wall + timedelta(seconds=state.cooling_until - now)).isoformat() if cooling else None,
        cooling_reason=state.cool_reason if cooling else None,
        disabled_reason=backend.provider.state.disabled_reason,
        upstream_queue_depth=state.queue_depth if backend.provider.config.kind == "local" else None,
    )


def money(value: Decimal | None) -> str | None:
    """Exact, without the storage scale's trailing zeros: Decimal("0.1000000000") → "0.1"."""
    return None if value is None else format(value.normalize(), "f")
