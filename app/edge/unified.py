"""The native ingress, `POST /api/v1/completions` (api.md): fabro's message-part request in, the
`CompletionResponse` or `event: stream_event` frames out.

A front door is a translator in and a renderer out over the one pipeline: the request body is
already our canonical `CompletionRequest` (`app.edge.validation.decode_request`), a JSON answer is
rendered from the pipeline's `Outcome` (`response_of`), a stream event by event
(`UnifiedStream`). ASGI itself is `app.edge.asgi`'s business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from litestar import asgi
from litestar.types import Receive, Scope, Send

from app.context import RequestContext
from app.edge import unified_format as fmt
from app.edge.asgi import serve
from app.edge.relay import StreamRenderer
from app.edge.validation import decode_request
from app.errors import GatewayError, stream_error_view
from app.pipeline import events as ev
from app.service import Service
from providers.events import Usage
from providers.types import CompletionRequest, Message, TextPart

_json_decoder = msgspec.json.Decoder()


@asgi("/api/v1/completions", copy_scope=False)
async def completions(scope: Scope, receive: Receive, send: Send) -> None:
    await serve(scope, receive, send, "unified", _translate)


class _Unified:
    """The native door's `Door`: the body is already our canonical request."""

    __slots__ = ("request", "stream")
    id_header = None
    renames = None

    def __init__(self, request: CompletionRequest) -> None:
        self.request = request
        self.stream = bool(request.stream)

    def answer(self, ctx: RequestContext, outcome: ev.Outcome) -> bytes:
        return fmt.encode_response(response_of(ctx, self.request, outcome))

    def renderer(self, ctx: RequestContext) -> UnifiedStream:
        return UnifiedStream(ctx, self.request)


def _translate(body: bytes, service: Service) -> _Unified:
    assert service.router is not None
    return _Unified(decode_request(body, service.router.providers))


def response_of(ctx: RequestContext, request: CompletionRequest, outcome: ev.Outcome) -> fmt.CompletionResponse:
    """The whole answer (also the `response` of the `finish` frame)."""
    message = outcome.message or Message(role="assistant", content=[])
    return fmt.CompletionResponse(
        id=ctx.request_id,
        model=outcome.model or "",
        provider=outcome.provider or "",
        message=message,
        stop_reason=outcome.stop_reason or "end_turn",
        usage=outcome.usage or Usage(),
        output=structured_output(message) if request.schema is not None else None,
        cost_usd=fmt.json_number(outcome.cost.usd),
        cost_source=outcome.cost.source,
    )


def structured_output(message: Message) -> Any:
    """The parsed JSON of the answer's text, or None when it is not JSON (the text stays in the
    message either way, so nothing is lost)."""
    text = "".join(part.data for part in message.content if isinstance(part, TextPart))
    try:
        return _json_decoder.decode(text)
    except (msgspec.DecodeError, RecursionError):  # nested past msgspec's depth: not JSON to give back
        return None


class UnifiedStream(StreamRenderer):
    """Canonical events → `stream_event` frames (api.md's table, in its order)."""

    ping = fmt.PING_FRAME

    def __init__(self, ctx: RequestContext, request: CompletionRequest) -> None:
        self._ctx = ctx
        self._request = request
        self._text_id = ""

    def render(self, event: ev.Event) -> bytes:
        if type(event) is ev.TextDelta:  # the per-chunk case, inline
            return fmt.frame(fmt.TextDelta(self._text_id, event.text))
        return _RENDERERS[type(event)](self, event)

    def error(self, error: GatewayError) -> bytes:
        return fmt.frame(fmt.ErrorEvent(error=stream_error_view(error)))

    def _started(self, event: ev.Started) -> bytes:
        return fmt.frame(fmt.StreamStart(self._ctx.request_id, event.model, event.provider))

    def _text_start(self, event: ev.TextStart) -> bytes:
        self._text_id = f"text_{event.index}"
        return fmt.frame(fmt.TextStart(self._text_id))

    def _outcome(self, outcome: ev.Outcome) -> bytes:
        if outcome.error is not None:
            return self.error(outcome.error)
        response = response_of(self._ctx, self._request, outcome)
        finish = fmt.FinishEvent(
            finish_reason=outcome.finish_reason or "stop",
            stop_reason=response.stop_reason,
            usage=response.usage,
            response=response,
        )
        return fmt.frame(finish)


_REASONING_START = fmt.frame(fmt.ReasoningStart())
_REASONING_END = fmt.frame(fmt.ReasoningEnd())


def _nothing(_stream: UnifiedStream, _event: ev.Logprobs) -> bytes:
    return b""


def _reasoning_delta(_stream: UnifiedStream, event: ev.ReasoningDelta) -> bytes:
    return fmt.frame(fmt.ReasoningDelta(event.text))


def _reasoning_start(_stream: UnifiedStream, _event: ev.ReasoningStart) -> bytes:
    return _REASONING_START


def _reasoning_end(_stream: UnifiedStream, _event: ev.ReasoningEnd) -> bytes:
    return _REASONING_END


def _text_end(_stream: UnifiedStream, event: ev.TextEnd) -> bytes:
    return fmt.frame(fmt.TextEnd(f"text_{event.index}"))


def _tool_call_start(_stream: UnifiedStream, event: ev.ToolCallStart) -> bytes:
    return fmt.frame(fmt.ToolCallStart(fmt.ToolCallView(event.id, event.name, "function", {}, "")))


def _tool_call_delta(_stream: UnifiedStream, event: ev.ToolCallDelta) -> bytes:
    return fmt.frame(fmt.ToolCallDelta(fmt.ToolCallView(event.id, event.name, "function", {}, event.fragment)))


def _tool_call_end(_stream: UnifiedStream, event: ev.ToolCallEnd) -> bytes:
    call = event.call
    view = fmt.ToolCallView(call.id, call.name, "function", call.arguments, call.raw_arguments or "")
    return fmt.frame(fmt.ToolCallEnd(view))


def _refusal_delta(stream: UnifiedStream, event: ev.RefusalDelta) -> bytes:
    return fmt.frame(fmt.TextDelta(stream._text_id, event.text))  # api.md has no refusal: it is text


_RENDERERS: dict[type, Callable[[UnifiedStream, Any], bytes]] = {  # every event but the text deltas (`render`)
    ev.RefusalDelta: _refusal_delta,
    ev.ReasoningDelta: _reasoning_delta,
    ev.Started: UnifiedStream._started,
    ev.TextStart: UnifiedStream._text_start,
    ev.TextEnd: _text_end,
    ev.ReasoningStart: _reasoning_start,
    ev.ReasoningEnd: _reasoning_end,
    ev.ToolCallStart: _tool_call_start,
    ev.ToolCallDelta: _tool_call_delta,
    ev.ToolCallEnd: _tool_call_end,
    ev.Logprobs: _nothing,  # not part of api.md's stream
    ev.Outcome: UnifiedStream._outcome,
}
