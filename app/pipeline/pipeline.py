"""The request pipeline: route → failover loop → fold events → accounting → ledger row and log line.

This is the only module that touches both `providers` and `catalog`. The flow is one direction:

    Router.route()     the model's backends, in priority order
    _open()            one retry loop (`app.routing.failover`): take a slot on the next eligible backend,
                       start an attempt, and pull events until the first *content* event; a failure
                       before that updates the backend's state and moves on (or stops, for a client
                       error). The first content event commits the request to that backend — from
                       then on a failure is an `error` event (or a 502), never a failover.
    fold               every event goes through one `Assembly` (frames for SSE, the message for both)
    _close()           in a `finally`: the slot is released, the ledger row queued (off the request
                       path) and the canonical log line written — so success, upstream error and
                       client cancellation all leave exactly one row.

`request_deadline_s` bounds the whole loop: queue waits and attempts before the first content.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from app.edge import unified_format as wire
from app.edge.validation import check_capabilities
from app.errors import AllBackendsFailed, GatewayError, InvalidRequest, UpstreamTimeout, stream_error_view
from app.metrics import Metrics
from app.pipeline.accounting import ledger_record, log_line, response_cost
from app.pipeline.fold import STOP_REASONS, Assembly
from app.routing.failover import Candidates, apply_failure, exhausted
from app.routing.router import Backend, Route, Router
from catalog.records import LedgerRecord, LedgerStatus
from catalog.snapshot import ModelEntry
from providers import events as ev
from providers.errors import Failure, UpstreamError
from providers.types import CompletionRequest

_CONTENT = (ev.TextDelta, ev.ReasoningDelta, ev.ToolCallStart, ev.ToolCallArgs, ev.Finish)
Events = AsyncGenerator[ev.Event, None]


class Exchange:
    """Everything known about one request while it runs; becomes its ledger row."""

    __slots__ = (
        "attempts",
        "backend",
        "error",
        "estimate",
        "first_content",
        "model",
        "request",
        "request_id",
        "route",
        "slot",
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
        self.slot: Backend | None = None  # the backend whose concurrency slot this request holds
        self.status: LedgerStatus = "error"
        self.error: GatewayError | None = None
        self.estimate: tuple[ev.Usage, Decimal | None, int | None] | None = None  # see accounting.estimate


class Pipeline:
    def __init__(
        self,
        router: Router,
        record: Callable[[LedgerRecord], None],
        log: Any,
        metrics: Metrics,
        deadline_s: float,
        probe_interval_s: float = 10.0,
    ) -> None:
        self.router = router
        self._record = record
        self._log = log
        self.metrics = metrics
        self._deadline_s = deadline_s
        self._probe_interval_s = probe_interval_s

    async def complete(self, exchange: Exchange) -> wire.CompletionResponse:
        """A non-streaming completion: the fold of the same event stream, returned whole."""
        assembly: Assembly | None = None
        try:
            assembly, events = await self._open(exchange, emit=False)
            try:
                async for event in events:
                    assembly.feed(event)
            except UpstreamError as exc:
                self._attempt_failed(exchange, exc)
                raise _mid_answer_error(exc) from None
            finally:
                await events.aclose()
            response = self._finish(exchange, assembly)
            self._attempt_ok(exchange)
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
            assert exchange.backend is not None
            assert exchange.model is not None
            start = wire.StreamStart(exchange.request_id, exchange.model.id, exchange.backend.name)
            yield wire.frame(start) + _drain(assembly)
            try:
                async for event in events:
                    assembly.feed(event)
                    if assembly.out:
                        yield _drain(assembly)
            except UpstreamError as exc:
                self._attempt_failed(exchange, exc)
                exchange.error = error = _mid_answer_error(exc)
                assembly.close()  # every opened block is closed before the error event
                yield _drain(assembly) + wire.frame(wire.ErrorEvent(error=stream_error_view(error)))
                return
            finally:
                await events.aclose()
            response = self._finish(exchange, assembly)
            self._attempt_ok(exchange)
            finish = wire.FinishEvent(
                finish_reason=assembly.final_finish_reason(),
                stop_reason=response.stop_reason,
                usage=response.usage,
                response=response,
            )
            yield _drain(assembly) + wire.frame(finish)
        except GatewayError as exc:
            exchange.error = exc
            raise
        except (asyncio.CancelledError, GeneratorExit):
            exchange.status = "cancelled"
            raise
        finally:
            self._close(exchange, assembly)

    async def _open(self, exchange: Exchange, *, emit: bool) -> tuple[Assembly, Events]:
        loop = asyncio.get_running_loop()
        now = loop.time()
        request = exchange.request
        exchange.model = model = self.router.resolve_model(request.model, now)
        check_capabilities(request, model.id, model.capabilities)
        exchange.route = route = self.router.route(model, request.provider)
        candidates = Candidates(route.backends, now, self._probe_interval_s)
        deadline = now + self._deadline_s
        failures: list[tuple[str, UpstreamError]] = []
        while loop.time() < deadline and (backend := await candidates.next(deadline)) is not None:
            exchange.slot = exchange.backend = backend
            exchange.attempts += 1
            if exchange.attempts > 1:
                self.metrics.retries.inc((model.id,))
            assembly = Assembly(emit=emit)
            events = backend.provider.adapter.events(request, backend.upstream_model, stream=exchange.stream)
            try:
                async with asyncio.timeout_at(deadline):
                    await _until_content(events, assembly, exchange)
            except TimeoutError:
                # The request's own deadline ran out: not the backend's fault, so no cool-down.
                await events.aclose()
                self._release(exchange)
                failures.append((backend.name, UpstreamError(Failure.TIMEOUT, "the request deadline passed")))
                break
            except UpstreamError as exc:
                await events.aclose()
                self._release(exchange)
                self._attempt_failed(exchange, exc)
                if exc.kind is Failure.CLIENT:
                    raise InvalidRequest(exc.message) from None
                failures.append((backend.name, exc))
                continue
            except BaseException:  # cancelled (the client went away) or a bug: close the upstream now
                await events.aclose()
                raise
            if exchange.attempts > 1:
                self.metrics.failovers.inc((model.id, backend.name))
            return assembly, events
        raise exhausted(failures, candidates)

    def _attempt_ok(self, exchange: Exchange) -> None:
        exchange.status = "ok"
        if exchange.backend is not None:
            exchange.backend.state.record(True)
            self.metrics.attempts.inc((exchange.backend.name, "ok"))

    def _attempt_failed(self, exchange: Exchange, exc: UpstreamError) -> None:
        backend = exchange.backend
        if backend is not None:
            apply_failure(backend, exc, asyncio.get_running_loop().time(), self.metrics, self._log)
            self.metrics.attempts.inc((backend.name, exc.kind.value))

    def _release(self, exchange: Exchange) -> None:
        if exchange.slot is not None:
            exchange.slot.state.release()
            exchange.slot = None

    def _finish(self, exchange: Exchange, assembly: Assembly) -> wire.CompletionResponse:
        model, backend = exchange.model, exchange.backend
        assert model is not None
        assert backend is not None
        message = assembly.close()
        report = assembly.usage
        cost, source = response_cost(self.router.snapshot, exchange, report)
        return wire.CompletionResponse(
            id=exchange.request_id,
            model=model.id,
            provider=backend.name,
            message=message,
            stop_reason=STOP_REASONS[assembly.final_finish_reason()],
            usage=report.usage if report is not None else ev.Usage(),
            output=assembly.structured_output(message) if exchange.request.schema is not None else None,
            cost_usd=cost,
            cost_source=source,
        )

    def _close(self, exchange: Exchange, assembly: Assembly | None) -> None:
        """Release the slot, queue the ledger row, count and log the request. Never raises."""
        self._release(exchange)
        try:
            record = ledger_record(self.router.snapshot, exchange, assembly)
            self._record(record)
            self.metrics.requests.inc((record.model or "", record.provider or "", record.status))
            log_line(self._log, record)
        except Exception:
            self._log.exception("ledger_record_failed", request_id=exchange.request_id)


async def _until_content(events: Events, assembly: Assembly, exchange: Exchange) -> None:
    """Pull events until the first content event (or the end of the answer)."""
    async for event in events:
        assembly.feed(event)
        if isinstance(event, _CONTENT):
            exchange.first_content = time.perf_counter()
            return


def _drain(assembly: Assembly) -> bytes:
    data = b"".join(assembly.out)
    assembly.out.clear()
    return data


def _mid_answer_error(exc: UpstreamError) -> GatewayError:
    if exc.kind is Failure.TIMEOUT:
        return UpstreamTimeout("the upstream timed out")
    return AllBackendsFailed(f"the upstream failed mid-answer: {exc.message}")
