"""The request pipeline: route → attempt loop → fold events → cost → ledger row and log line.

This is the only module that touches both `providers` and `catalog`. The flow is one direction:

    Router.route() → Backend list
    _open(): one retry loop over the backends; an attempt that fails *before its first content
             event* moves on (or stops, for a client error); the first content event commits the
             request to that backend — from then on a failure is an `error` event, never a failover
    fold:    every event goes through one `Assembly` (frames for SSE, the message for both)
    close:   usage and cost are computed once, the ledger row is queued (off the request path),
             and the canonical log line is written — in a `finally`, so success, upstream error
             and client cancellation all leave exactly one row.

Status mapping when every attempt failed before content (api.md): all at capacity → 429 with the
soonest Retry-After; all timed out → 504; otherwise 502. Nothing to try → 503 (raised by routing).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from app import wire
from app.assembly import STOP_REASONS, Assembly
from app.errors import (
    AllBackendsFailed,
    AtCapacity,
    GatewayError,
    InternalError,
    InvalidRequest,
    UpstreamTimeout,
    stream_error_view,
)
from app.routing import Backend, Route, Router
from app.validation import check_capabilities
from catalog.ledger import CostSource, LedgerRecord, LedgerStatus
from catalog.pricing import estimate_cost
from catalog.snapshot import ModelEntry
from providers import events as ev
from providers.errors import Failure, UpstreamError
from providers.types import CompletionRequest

_CONTENT = (ev.TextDelta, ev.ReasoningDelta, ev.ToolCallStart, ev.ToolCallArgs, ev.Finish)


class Exchange:
    """Everything known about one request while it runs; becomes its ledger row."""

    __slots__ = (
        "attempts",
        "backend",
        "error",
        "first_content",
        "model",
        "request",
        "request_id",
        "route",
        "started",
        "started_at",
        "status",
        "stream",
    )

    def __init__(self, request_id: str, request: CompletionRequest) -> None:
        self.request_id = request_id
        self.request = request
        self.stream = bool(request.stream)
        self.started_at = datetime.now(UTC)
        self.started = time.perf_counter()
        self.first_content: float | None = None
        self.attempts = 0
        self.model: ModelEntry | None = None
        self.route: Route | None = None
        self.backend: Backend | None = None
        self.status: LedgerStatus = "error"
        self.error: GatewayError | None = None


class Pipeline:
    def __init__(self, router: Router, record: Callable[[LedgerRecord], None], log: Any) -> None:
        self.router = router
        self._record = record
        self._log = log

    async def complete(self, exchange: Exchange) -> wire.CompletionResponse:
        """A non-streaming completion: the fold of the same event stream, returned whole."""
        assembly: Assembly | None = None
        try:
            assembly, events = await self._open(exchange, emit=False)
            try:
                async for event in events:
                    assembly.feed(event)
            except UpstreamError as exc:
                raise _mid_answer_error(exc) from None
            finally:
                await events.aclose()
            response = self._finish(exchange, assembly)
            exchange.status = "ok"
            return response
        except GatewayError as exc:
            exchange.error = exc
            raise
        finally:
            self._close(exchange, assembly)

    async def stream(self, exchange: Exchange) -> AsyncIterator[bytes]:
        """SSE frames. Raises `GatewayError` before the first frame when no backend produced
        content (an ordinary HTTP error); afterwards failures become an `error` event."""
        assembly: Assembly | None = None
        try:
            assembly, events = await self._open(exchange, emit=True)
            backend = exchange.backend
            assert backend is not None
            assert exchange.route is not None
            start = wire.StreamStart(exchange.request_id, exchange.route.model.id, backend.name)
            yield wire.frame(start) + _drain(assembly)
            try:
                async for event in events:
                    assembly.feed(event)
                    if assembly.out:
                        yield _drain(assembly)
            except UpstreamError as exc:
                error = _mid_answer_error(exc)
                exchange.error = error
                assembly.close()  # every opened block is closed before the error event
                yield _drain(assembly) + wire.frame(wire.ErrorEvent(error=stream_error_view(error)))
                return
            finally:
                await events.aclose()
            response = self._finish(exchange, assembly)
            exchange.status = "ok"
            yield _drain(assembly) + wire.frame(
                wire.FinishEvent(
                    finish_reason=assembly.final_finish_reason(),
                    stop_reason=response.stop_reason,
                    usage=response.usage,
                    response=response,
                )
            )
        except GatewayError as exc:
            exchange.error = exc
            raise
        except (asyncio.CancelledError, GeneratorExit):
            exchange.status = "cancelled"
            raise
        finally:
            self._close(exchange, assembly)

    async def _open(self, exchange: Exchange, *, emit: bool) -> tuple[Assembly, AsyncGenerator[ev.Event, None]]:
        request = exchange.request
        exchange.model = model = self.router.resolve_model(request.model)
        check_capabilities(request, model.id, model.capabilities)
        exchange.route = route = self.router.route(model, request.provider)
        failures: list[UpstreamError] = []
        for backend in route.backends:
            exchange.attempts += 1
            exchange.backend = backend
            assembly = Assembly(emit=emit)
            events = backend.provider.adapter.events(request, backend.upstream_model, stream=exchange.stream)
            try:
                async for event in events:
                    assembly.feed(event)
                    if isinstance(event, _CONTENT):
                        exchange.first_content = time.perf_counter()
                        return assembly, events
                return assembly, events
            except UpstreamError as exc:
                await events.aclose()
                if exc.kind is Failure.CLIENT:
                    raise InvalidRequest(exc.message) from None
                failures.append(exc)
        raise _exhausted(failures)

    def _finish(self, exchange: Exchange, assembly: Assembly) -> wire.CompletionResponse:
        route, backend = exchange.route, exchange.backend
        assert route is not None
        assert backend is not None
        message = assembly.close()
        report = assembly.usage
        cost, source = self._cost(exchange, report)
        return wire.CompletionResponse(
            id=exchange.request_id,
            model=route.model.id,
            provider=backend.name,
            message=message,
            stop_reason=STOP_REASONS[assembly.final_finish_reason()],
            usage=report.usage if report is not None else ev.Usage(),
            output=assembly.structured_output(message) if exchange.request.schema is not None else None,
            cost_usd=cost,
            cost_source=source,
        )

    def _cost(self, exchange: Exchange, report: ev.UsageReport | None) -> tuple[Decimal | None, Any]:
        if report is None:
            return None, None
        if report.cost_usd is not None:
            return report.cost_usd, "authoritative"
        estimate, _ = self._estimate(exchange, report.usage)
        return (estimate, "estimated") if estimate is not None else (None, None)

    def _estimate(self, exchange: Exchange, usage: ev.Usage) -> tuple[Decimal | None, int | None]:
        route, backend = exchange.route, exchange.backend
        assert route is not None
        assert backend is not None
        price = self.router.snapshot.price_at(backend.name, route.model.id, exchange.started_at)
        cost = estimate_cost(
            price,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
        )
        return cost, (price.id if price is not None else None)

    def _close(self, exchange: Exchange, assembly: Assembly | None) -> None:
        """Queue the ledger row and write the canonical log line. Never raises."""
        try:
            record = self._ledger_record(exchange, assembly)
            self._record(record)
            self._log_line(record)
        except Exception:
            self._log.exception("ledger_record_failed", request_id=exchange.request_id)

    def _ledger_record(self, exchange: Exchange, assembly: Assembly | None) -> LedgerRecord:
        now = time.perf_counter()
        backend, error = exchange.backend, exchange.error
        report = assembly.usage if assembly is not None else None
        usage = report.usage if report is not None else None
        estimate, price_id = self._estimate(exchange, usage) if usage is not None else (None, None)
        authoritative = report.cost_usd if report is not None else None
        finish = assembly.final_finish_reason() if assembly is not None and assembly.finish_reason else None
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
            cost_usd=authoritative if authoritative is not None else estimate,
            estimated_cost_usd=estimate,
            cost_source=_cost_source(authoritative, estimate),
            price_id=price_id,
            latency_ms=round((now - exchange.started) * 1000, 3),
            ttft_ms=round((exchange.first_content - exchange.started) * 1000, 3)
            if exchange.first_content is not None
            else None,
            attempts=exchange.attempts,
        )

    def _log_line(self, record: LedgerRecord) -> None:
        self._log.info(
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


def _cost_source(authoritative: Decimal | None, estimate: Decimal | None) -> CostSource | None:
    if authoritative is not None:
        return "authoritative"
    return "estimated" if estimate is not None else None


def _drain(assembly: Assembly) -> bytes:
    data = b"".join(assembly.out)
    assembly.out.clear()
    return data


def _mid_answer_error(exc: UpstreamError) -> GatewayError:
    if exc.kind is Failure.TIMEOUT:
        return UpstreamTimeout("the upstream timed out")
    return AllBackendsFailed(f"the upstream failed mid-answer: {exc.message}")


def _exhausted(failures: list[UpstreamError]) -> GatewayError:
    if not failures:
        return InternalError("no attempt was made")
    if all(f.kind is Failure.CAPACITY for f in failures):
        hints = [f.retry_after for f in failures if f.retry_after is not None]
        return AtCapacity("all backends for this model are at capacity", retry_after=min(hints, default=1.0))
    if all(f.kind is Failure.TIMEOUT for f in failures):
        return UpstreamTimeout("the upstream timed out before answering")
    return AllBackendsFailed("all backends refused the request")
