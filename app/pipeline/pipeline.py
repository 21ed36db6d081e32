"""The request pipeline: route → failover loop → fold → `Outcome` → ledger row, metrics, log line.

This is where a request's flow meets both `providers` (the adapter's attempt and its events) and
`catalog` (the price and the ledger row), and it knows no wire format: it takes a `RequestContext`
and a request from an ingress (a `CompletionRequest`, or a `TextCompletionRequest` for a raw
prompt: the pipeline reads only `model` and `provider` and hands the request to admission and the
adapter) and gives back canonical events (`app.pipeline.events`) that the ingress renders.

    complete(ctx, request) -> Outcome     a JSON answer: the fold of the whole event stream
    stream(ctx, request)   -> head, batches   lists of events: Started, block events …, the Outcome
                                          last; the `StreamHead` told the model and the key's rate
                                          headers as admission learns them, before any batch

The flow is one direction:

    Router.route()     the model's backends, in priority order; `admit` checks the request fits
    _open()            the key's reservation (`app.access.gate`), then `_failover()`: one retry
                       loop (`app.routing.failover`): take a slot on the next eligible backend,
                       start an attempt, and pull events until the first *content* event; a
                       failure before that updates the backend's state and moves on (or stops,
                       for a client error). The first content event commits the request to that
                       backend — from then on a failure ends the answer with an error `Outcome`
                       (streaming) or a 502/504 (JSON), never a failover.
    Fold               every upstream event of the committed attempt (`app.pipeline.fold`)
    _close()           once, before the Outcome is handed out (or in a `finally` when the request
                       ends otherwise): the slot is released (and the attempt's GPU-time ticket,
                       `app.pipeline.gpu_time`, when its provider sets `gpu_hour_usd`), the ledger
                       row queued (off the request path), the request counted, its canonical line
                       logged and the key's reservation settled to the real cost — so success,
                       upstream error and client cancellation all leave exactly one row.

Errors before the answer starts are raised (`GatewayError`): each ingress renders them as an ordinary HTTP error in
its own shape. `ctx.deadline` bounds the loop: queue waits and attempts before the first content. A cancelled request
(the client went away) is recorded `cancelled`; when its upstream never reported usage, the ledger gets the prompt's
estimate and the deltas already relayed, marked `usage_estimated` (app/pipeline/estimate.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from app.access.gate import AccessGate, Ticket
from app.context import RequestContext
from app.errors import AllBackendsFailed, GatewayError, InvalidRequest, UpstreamTimeout
from app.logging import LineWriter
from app.metrics import Metrics
from app.pipeline.accounting import ledger_record, log_line, price, settlement
from app.pipeline.admission import admit
from app.pipeline.estimate import estimate_input_tokens
from app.pipeline.events import UNPRICED, Event, Outcome, Started, StreamHead, header_texts
from app.pipeline.fold import Fold
from app.pipeline.gpu_time import GpuTicket, GpuTime
from app.routing.failover import Candidates, apply_failure, exhausted, log_attempt
from app.routing.router import Backend, Router
from catalog.records import RECORD_JSON, LedgerRecord, LedgerStatus
from catalog.snapshot import ModelEntry
from providers import events as ev
from providers.errors import Failure, UpstreamError
from providers.timers import deadline_at
from providers.types import AnyRequest, Message

_CONTENT = frozenset((ev.TextDelta, ev.ReasoningDelta, ev.RefusalDelta, ev.ToolCallStart, ev.ToolCallArgs, ev.Finish))
Upstream = AsyncGenerator[list[ev.Event], None]  # the adapter's batches (`Provider.batches`)


class _Run:
    """What is known about one request while it runs; private to the pipeline, it becomes the
    request's `Outcome` once (`Pipeline._close`)."""

    __slots__ = (
        "attempting",
        "attempts",
        "backend",
        "ctx",
        "error",
        "first_content",
        "fold",
        "gpu",
        "head",
        "message",
        "model",
        "outcome",
        "request",
        "slot",
        "status",
        "ticket",
    )

    def __init__(self, ctx: RequestContext, request: AnyRequest) -> None:
        self.ctx = ctx
        self.request = request
        self.attempts = 0
        self.attempting = False  # an attempt is out that `switchyard_attempts_total` has not counted
        self.model: ModelEntry | None = None
        self.backend: Backend | None = None
        self.slot: Backend | None = None  # the backend whose concurrency slot this request holds
        self.fold: Fold | None = None  # the latest attempt's
        self.gpu: GpuTicket | None = None  # the latest attempt's, on a provider with `gpu_hour_usd`
        self.first_content: float | None = None
        self.message: Message | None = None
        self.status: LedgerStatus = "error"
        self.error: GatewayError | None = None
        self.outcome: Outcome | None = None
        self.ticket: Ticket | None = None  # the API key's reservation, settled in `_close`
        self.head: StreamHead | None = None  # a stream's, told the model and the rate headers


class Pipeline:
    def __init__(
        self,
        router: Router,
        record: Callable[[LedgerRecord, bytes], None],
        log: Any,
        metrics: Metrics,
        probe_interval_s: float = 10.0,
        gpu_time: GpuTime | None = None,
        access: AccessGate | None = None,
        lines: LineWriter | None = None,
        quota_recheck_s: float = 300.0,
    ) -> None:
        self.router = router
        self.access = access
        self._record = record
        self._log = log
        self._lines = lines  # the canonical lines' writer; None: through `log` (an embedding app's logging)
        self.metrics = metrics
        self._probe_interval_s = probe_interval_s
        self._quota_recheck_s = quota_recheck_s
        self._gpu_time = gpu_time or GpuTime({})

    async def complete(self, ctx: RequestContext, request: AnyRequest) -> Outcome:
        """A whole answer. Raises `GatewayError` when there is none (mid-answer failures too)."""
        run = _Run(ctx, request)
        try:
            upstream = await self._open(run, emit=False)
            fold = run.fold
            assert fold is not None
            try:
                async for batch in upstream:
                    for event in batch:
                        fold.feed(event)
            except UpstreamError as exc:
                self._attempt_failed(run, exc)
                raise _mid_answer_error(exc) from None
            finally:
                await upstream.aclose()
            run.message = fold.close()
            self._attempt_ok(run)
            return self._close(run)
        except GatewayError as exc:
            run.error = _with_headers(exc, run.ticket)
            raise
        except asyncio.CancelledError:
            run.status = "cancelled"
            raise
        finally:
            self._close(run)

    def stream(self, ctx: RequestContext, request: AnyRequest) -> tuple[StreamHead, AsyncGenerator[list[Event], None]]:
        """The request's `StreamHead` (what the response's head may need before the first batch),
        and its canonical events in batches (`_stream`)."""
        head = StreamHead()
        return head, self._stream(ctx, request, head)

    async def _stream(
        self, ctx: RequestContext, request: AnyRequest, head: StreamHead
    ) -> AsyncGenerator[list[Event], None]:
        """Canonical events in batches (never an empty one): `Started` alone first, then the
        events of each upstream read, the `Outcome` last. Raises `GatewayError` before the first
        batch when no backend produced content; afterwards a failure is an `Outcome` with its
        `error`. `head` learns the model and the API key's rate headers once the request is
        admitted, before any batch."""
        run = _Run(ctx, request)
        run.head = head
        try:
            upstream = await self._open(run, emit=True)
            fold = run.fold
            assert fold is not None
            assert run.model is not None
            assert run.backend is not None
            yield [Started(run.model.id, run.backend.name)]
            try:
                if fold.out:
                    yield fold.take()
                async for batch in upstream:
                    for event in batch:
                        fold.feed(event)
                    if fold.out:
                        yield fold.take()
            except UpstreamError as exc:
                self._attempt_failed(run, exc)
                run.error = _mid_answer_error(exc)
            finally:
                await upstream.aclose()
            run.message = fold.close()  # every open block is closed, before the error too
            if run.error is None:
                self._attempt_ok(run)
            last = fold.take()
            last.append(self._close(run))
            yield last
        except GatewayError as exc:
            run.error = _with_headers(exc, run.ticket)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            run.status = "cancelled"
            raise
        finally:
            self._close(run)

    async def _open(self, run: _Run, *, emit: bool) -> Upstream:
        now = asyncio.get_running_loop().time()
        request = run.request
        run.model = model = self.router.resolve_model(request.model, now, request.provider)
        admit(request, model)
        access = self.access
        entry = access.permit(run.ctx, model) if access is not None else None
        route = self.router.route(model, request.provider)
        if access is not None and entry is not None and entry.limited:
            ticket = access.reserve(entry, run.ctx, request, model, route.names, self.router.snapshot)
            run.ticket = ticket if isinstance(ticket, Ticket) else await access.admit(entry, run.ctx, ticket)
            if request.max_tokens is None and model.max_output and (entry.budget_nano >= 0 or entry.tpm >= 0):
                # the reservation's output bound goes upstream: without it the upstream's own default
                # (vLLM: the rest of the context) let one answer spend past the budget. A model with
                # no `max_output` was reserved its whole context, which no answer can pass.
                request.max_tokens = model.max_output
        if run.head is not None:  # admitted: what a keep-alive that starts the response needs
            run.head.headers = run.ticket.headers if run.ticket is not None else b""
            run.head.model = model.id
        candidates = Candidates(route.backends, now, self._probe_interval_s, self._quota_recheck_s)
        return await self._failover(run, model, candidates, emit)

    async def _failover(self, run: _Run, model: ModelEntry, candidates: Candidates, emit: bool) -> Upstream:
        """Try `candidates` in turn until one starts its answer (its first content, `_until_content`)."""
        loop = asyncio.get_running_loop()
        request, deadline = run.request, run.ctx.deadline
        failures: list[tuple[str, UpstreamError]] = []
        while loop.time() < deadline and (backend := await candidates.next(deadline)) is not None:
            run.slot = run.backend = backend
            run.gpu = self._gpu_time.start(backend.name)
            run.attempts += 1
            run.attempting = True
            if run.attempts > 1:
                self.metrics.retries.inc((model.id,))
            run.fold = Fold(emit=emit)
            upstream = backend.provider.adapter.batches(request, backend.upstream_model, stream=run.ctx.stream)
            try:
                async with deadline_at(deadline):
                    await _until_content(upstream, run)
            except TimeoutError:
                await upstream.aclose()
                failures.append((backend.name, self._deadline_cut(run, backend)))
                break
            except UpstreamError as exc:
                await upstream.aclose()
                self._release(run)
                self._attempt_failed(run, exc)
                candidates.failed(backend, loop.time())
                if exc.kind is Failure.CLIENT:
                    raise InvalidRequest(exc.message) from None
                failures.append((backend.name, exc))
                continue
            except BaseException:  # cancelled (the client went away) or a bug: close the upstream now
                await upstream.aclose()
                raise
            if run.attempts > 1:
                self.metrics.failovers.inc((model.id, backend.name))
            return upstream
        raise exhausted(failures, candidates)

    def _deadline_cut(self, run: _Run, backend: Backend) -> UpstreamError:
        """The request's deadline cut an attempt: not the backend's fault (no cool-down), but counted."""
        self._release(run)
        cut = UpstreamError(Failure.TIMEOUT, "the request deadline passed")
        log_attempt(self._log, backend, cut, None, run.ctx.request_id)
        run.attempting = False
        self.metrics.attempts.inc((backend.name, cut.kind.value))
        return cut

    def _attempt_ok(self, run: _Run) -> None:
        run.status = "ok"
        run.attempting = False
        if run.backend is not None:
            run.backend.state.record(True)
            self.metrics.attempts.inc((run.backend.name, "ok"))

    def _attempt_failed(self, run: _Run, exc: UpstreamError) -> None:
        backend = run.backend
        run.attempting = False
        if backend is not None:
            apply_failure(backend, exc, asyncio.get_running_loop().time(), self.metrics, self._log, run.ctx.request_id)
            self.metrics.attempts.inc((backend.name, exc.kind.value))

    def _release(self, run: _Run) -> None:
        if run.slot is not None:
            run.slot.release()
            run.slot = None
        if run.gpu is not None:
            run.gpu.stop()

    def _close(self, run: _Run) -> Outcome:
        """The request's `Outcome`, made once: release the slot, queue the ledger row, count and
        log the request. Never raises."""
        if run.outcome is not None:
            return run.outcome
        if run.attempting and run.backend is not None:  # the client went away during it, or a bug ended it
            run.attempting = False
            self.metrics.attempts.inc((run.backend.name, "cancelled" if run.status == "cancelled" else "error"))
        self._release(run)
        outcome = run.outcome = self._outcome(run)
        try:
            if run.ticket is not None and self.access is not None:
                self.access.settle(run.ticket, *settlement(outcome))
            record = ledger_record(run.ctx, outcome)
            encoded = RECORD_JSON.encode(record)  # once, for the journal's line and the log's
            self._record(record, encoded)
            self.metrics.request_done(run.ctx, outcome)
            if self._lines is not None:
                self._lines.request_line(encoded)
            else:
                log_line(self._log, record)
        except Exception:
            self._log.exception("ledger_record_failed", request_id=run.ctx.request_id)
        return outcome

    def _outcome(self, run: _Run) -> Outcome:
        fold, backend, model = run.fold, run.backend, run.model
        usage, billed, estimated = None, None, False
        if fold is not None and fold.usage is not None:
            usage, billed = fold.usage.usage, fold.usage.cost_usd
        elif fold is not None and run.status == "cancelled":
            usage, estimated = _counted_usage(run.request, fold), True
        cost = UNPRICED
        if backend is not None and model is not None:
            amortized = run.gpu.cost_usd() if run.gpu is not None else None
            cost = price(self.router.snapshot, backend.name, model.id, run.ctx.started_at, usage, billed, amortized)
        return Outcome(  # by position, in the fields' order (`catalog.records.POSITIONAL`)
            run.status,  # status
            time.perf_counter(),  # finished
            run.attempts,  # attempts
            model.id if model is not None else None,  # model
            backend.name if backend is not None else None,  # provider
            backend.upstream_model if backend is not None else None,  # upstream_model
            fold.upstream_request_id if fold is not None else None,  # upstream_request_id
            run.message,  # message
            tuple(fold.refusals) if fold is not None else (),  # refusals
            (finish := fold.final_finish_reason() if fold is not None else None),  # finish_reason
            fold.stop_sequence if fold is not None and finish == "stop" else None,  # stop_sequence
            fold.logprobs if fold is not None else None,  # logprobs
            usage,  # usage
            estimated,  # usage_estimated
            cost,  # cost
            run.error,  # error
            run.first_content,  # first_content
            run.ticket.headers if run.ticket is not None else b"",  # headers
        )


async def _until_content(upstream: Upstream, run: _Run) -> None:
    """Pull batches until one holds the first content event (or the answer ends); every event of
    that batch is folded."""
    fold = run.fold
    assert fold is not None
    async for batch in upstream:
        content = False
        for event in batch:
            fold.feed(event)
            if not content and type(event) in _CONTENT:
                content = True
                run.first_content = time.perf_counter()
        if content:
            return


def _counted_usage(request: AnyRequest, fold: Fold) -> ev.Usage:
    """What a cancelled attempt used, as far as the gateway can tell: the prompt's estimate and
    one token per delta relayed (reasoning deltas in their own bucket)."""
    return ev.Usage(
        input_tokens=estimate_input_tokens(request),
        output_tokens=fold.relayed_output,
        reasoning_tokens=fold.relayed_reasoning,
    )


def _with_headers(exc: GatewayError, ticket: Ticket | None) -> GatewayError:
    """An error after admission still tells the key where its limits stand (access.md)."""
    if ticket is not None and ticket.headers and exc.extra_headers is None:
        exc.extra_headers = header_texts(ticket.headers)
    return exc


def _mid_answer_error(exc: UpstreamError) -> GatewayError:
    if exc.kind is Failure.TIMEOUT:
        return UpstreamTimeout("the upstream timed out")
    # A client-kind error carries the upstream's own words: they reach the client only as a 400
    # about its request, before the answer starts; mid-answer it is a 502 named by its status.
    detail = f"upstream returned {exc.status}" if exc.kind is Failure.CLIENT else exc.message
    return AllBackendsFailed(f"the upstream failed mid-answer: {detail}")
