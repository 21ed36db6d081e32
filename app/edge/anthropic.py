"""The Anthropic Messages ingress, `POST /v1/messages` (ingress.md): Anthropic's request in, a
`message` or Anthropic's SSE events out, over the one pipeline, routed to any backend.

A translator in (`app.edge.anthropic_request`), a renderer out (`message_of` for a JSON answer,
`AnthropicStream` for a stream), the wire types in `app.edge.anthropic_format`; ASGI itself is
`app.edge.asgi`'s business. `router` mounts the door with its own exception handler, so every
error under `/v1/messages` (an unknown subpath's 404 too) answers in Anthropic's shape,
`{"type": "error", "error": {"type", "message"}, "request_id"}`, with api.md's statuses and the
`x-request-id` header; the shared renderer in `app.application` never branches on the door.

Output decisions (README, "Anthropic Messages ingress"):
- `stop_reason`: `stop` → `end_turn`, `length` → `max_tokens`, `tool_calls` → `tool_use`,
  `content_filter` → `refusal`; `stop_sequence` (with the string in `stop_sequence`) when the
  upstream named the stop string it met (vLLM's `stop_reason`, SGLang's `matched_stop`). Others
  say `stop` whether they met a stop sequence or ended their turn: `end_turn`, the gateway does
  not guess.
- `usage` is Anthropic's additive view of the five disjoint buckets: `input_tokens` (cache reads
  and writes excluded), `cache_read_input_tokens`, `cache_creation_input_tokens`, `output_tokens`
  = output + reasoning, with reasoning also in `output_tokens_details.thinking_tokens`. When the
  upstream reported no usage the counts are 0 (Anthropic's schema requires them) and the cost is
  null, as in the native API; the ledger keeps NULL.
- cost: `cost_usd` and `cost_source` at the top level of the message and of `message_delta`,
  named as in the native API (Anthropic has no such field; its SDK keeps them as extras).
- streaming: `message_start` carries the message shell and zero usage (nothing is counted before
  the upstream's report), every block is opened, streamed and closed in order with its own index
  (thinking, text and tool_use blocks count alike), `message_delta` carries the stop reason and
  the whole usage (the SDK's `get_final_message()` takes input and cache counts from it too).
  Anthropic's blocks never overlap, while canonical tool calls stay open to the end of the
  answer and upstreams may interleave the arguments of parallel calls. So a tool call streams
  live when no other call's block is open, and closes at its end (or when text or thinking
  starts after it); a call that starts while another is open waits, and is sent whole (start,
  one `input_json_delta` with all its arguments, stop) when it ends. (A fragment for a call that
  text already closed, which no known upstream sends, still names that call's index: the SDK
  accumulates by index.) A tool's `input` is an object, and the JSON answer's is `{}` when the
  arguments are not one: a live call's fragments are held until the first one that is not blank,
  and dropped when it does not open an object (`[1, 2]`, `"x"`); a waiting call is sent whole only
  when its arguments are a non-empty object. A live call's fragments stream only while they can
  still begin a JSON object (`app.edge.json_prefix`): the SDK parses them after every delta and
  fails the whole stream on `{'q': 1}`, `True` or a trailing comma, which small local models
  write. From the first fragment that breaks the grammar the call sends nothing more, so its
  streamed `input` is what the prefix before it holds (the JSON answer's is `{}`). Arguments that
  open an object and then break off (an answer cut at `max_tokens`) have streamed as they came;
  the SDK's partial-JSON parser reads what they hold.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar import HttpMethod, Request, Router, asgi, route
from litestar.response import Response
from litestar.types import Receive, Scope, Send

from app.context import RequestContext
from app.edge import anthropic_format as fmt
from app.edge.anthropic_request import decode_messages
from app.edge.asgi import serve
from app.edge.json_prefix import JSONPrefix
from app.edge.key_guard import rate_window, require_key
from app.edge.rejection import as_gateway_error
from app.edge.relay import StreamRenderer
from app.edge.unified_format import json_number
from app.errors import GatewayError, NotFound
from app.pipeline import events as ev
from app.service import Service
from providers.events import Usage
from providers.types import (
    CompletionRequest,
    ContentPart,
    RedactedThinkingPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
)

STOP_REASONS: dict[str, fmt.StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}


def stop_reason_of(outcome: ev.Outcome) -> fmt.StopReason:
    """Anthropic's stop reason: `stop_sequence` when the upstream named the stop string it met."""
    if outcome.stop_sequence is not None:
        return "stop_sequence"
    return STOP_REASONS.get(outcome.finish_reason or "stop", "end_turn")


_NO_USAGE = Usage()


@asgi("/", copy_scope=False)
async def messages(scope: Scope, receive: Receive, send: Send) -> None:
    await serve(scope, receive, send, "anthropic_messages", _translate)


class _Messages:
    """This door's `Door`: the canonical request; answers in Anthropic's shapes."""

    __slots__ = ("renames", "request", "stream")
    id_header = b"request-id"  # what the anthropic SDK reads (`_request_id`, `APIStatusError.request_id`)

    def __init__(self, request: CompletionRequest, moved: dict[str, str]) -> None:
        self.request = request
        self.stream = bool(request.stream)
        # the pipeline's names this door spells otherwise: the schema, and a tool result's media
        # (a model without vision refuses them by their canonical place)
        self.renames = {"schema": "output_config.format.schema", **moved}

    def answer(self, ctx: RequestContext, outcome: ev.Outcome) -> bytes:
        return fmt.encode(message_of(ctx, outcome))

    def renderer(self, ctx: RequestContext) -> AnthropicStream:
        return AnthropicStream(ctx)


def _translate(body: bytes, service: Service) -> _Messages:
    assert service.router is not None
    return _Messages(*decode_messages(body, service.router.providers))


@route(
    "/{rest:path}",
    http_method=list(HttpMethod),
    include_in_schema=False,
    middleware=[rate_window],
    guards=[require_key],
)
async def unknown_path() -> None:
    """Anything else under `/v1/messages` (`count_tokens`, `batches`): a 404 in Anthropic's shape."""
    raise NotFound("no such endpoint")


def message_of(ctx: RequestContext, outcome: ev.Outcome) -> fmt.Message:
    """The whole answer, from the pipeline's `Outcome`."""
    parts = outcome.message.content if outcome.message is not None else []
    return fmt.Message(
        id=ctx.request_id,
        role="assistant",
        model=outcome.model or "",
        content=[block for part in parts if (block := _block(part)) is not None],
        stop_reason=stop_reason_of(outcome),
        stop_sequence=outcome.stop_sequence,
        usage=usage_of(outcome.usage),
        cost_usd=json_number(outcome.cost.usd),
        cost_source=outcome.cost.source,
    )


def usage_of(usage: Usage | None) -> fmt.Usage:
    """The five disjoint buckets in Anthropic's additive convention."""
    usage = usage or _NO_USAGE
    return fmt.Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens + usage.reasoning_tokens,
        cache_read_input_tokens=usage.cache_read_tokens,
        cache_creation_input_tokens=usage.cache_write_tokens,
        output_tokens_details=fmt.OutputTokensDetails(thinking_tokens=usage.reasoning_tokens),
    )


def _block(part: ContentPart) -> fmt.OutputBlock | None:
    if isinstance(part, TextPart):
        return fmt.TextBlock(part.data)
    if isinstance(part, ToolCallPart):
        call = part.data
        return fmt.ToolUseBlock(call.id, call.name, call.arguments if isinstance(call.arguments, dict) else {})
    if isinstance(part, ThinkingPart):
        return fmt.ThinkingBlock(part.data.text, part.data.signature or "")
    if isinstance(part, RedactedThinkingPart):
        return fmt.RedactedThinkingBlock(part.data.text)
    return None  # an answer carries no media parts


_EMPTY_TEXT = fmt.TextBlock("")
_EMPTY_THINKING = fmt.ThinkingBlock("", "")


class AnthropicStream(StreamRenderer):
    """Canonical events → Anthropic's SSE events, block indexes counted here. A text or thinking
    delta, the per-chunk case, is rendered inline (its block's delta head, the encoded text, the
    constant end); every other event goes through the class's table of plain functions."""

    ping = fmt.PING_FRAME

    def __init__(self, ctx: RequestContext) -> None:
        self._ctx = ctx
        self._blocks = 0  # blocks opened so far: the next block's index
        self._open: int | None = None  # the index of the block open now
        self._prefix = b""  # the delta head of the open text or thinking block
        self._calls: dict[int, tuple[int, bytes]] = {}  # a started call's index → (block index, delta head)
        self._live_call: int | None = None  # the call whose block is open now
        self._json: dict[int, JSONPrefix] = {}  # a live call's arguments so far (module doc)
        self._opened = False  # `message_start` went out as the opening keep-alive

    def render(self, event: ev.Event) -> bytes:
        kind = type(event)
        if kind is ev.TextDelta or kind is ev.ReasoningDelta:  # the per-chunk case, inline
            return b"".join((self._prefix, _encode(event.text), _DELTA_END))  # type: ignore[union-attr]
        return _RENDERERS[kind](self, event)

    def error(self, error: GatewayError) -> bytes:
        detail = fmt.ErrorDetail(type=fmt.error_type(error.status_code), message=error.message)
        return fmt.frame("error", fmt.ErrorBody(error=detail))

    def opening(self, head: ev.StreamHead) -> bytes:
        """An upstream slow to start: `message_start` (the request is admitted, its model known)
        and a `ping`, as Anthropic opens a stream, not a `ping` alone before it."""
        assert head.model is not None
        self._opened = True
        return self._message_start(head.model) + self.ping

    def _started(self, event: ev.Started) -> bytes:
        return b"" if self._opened else self._message_start(event.model)

    def _message_start(self, model: str) -> bytes:
        shell = fmt.Message(self._ctx.request_id, "assistant", model, [], None, None, usage_of(None), None, None)
        return fmt.frame("message_start", fmt.MessageStart(shell))

    def _open_block(self, block: fmt.OutputBlock) -> tuple[int, bytes]:
        """The next block's index, and the frames that close the open block and start this one."""
        closing = self._close()
        index = self._open = self._blocks
        self._blocks += 1
        return index, closing + fmt.block_start(index, block)

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        index, self._open, self._live_call = self._open, None, None
        return fmt.block_stop(index)

    def _text_start(self, _event: ev.TextStart) -> bytes:
        index, frames = self._open_block(_EMPTY_TEXT)
        self._prefix = fmt.delta_prefix(index, "text_delta", "text")
        return frames

    def _reasoning_start(self, _event: ev.ReasoningStart) -> bytes:
        index, frames = self._open_block(_EMPTY_THINKING)
        self._prefix = fmt.delta_prefix(index, "thinking_delta", "thinking")
        return frames

    def _refusal_delta(self, event: ev.RefusalDelta) -> bytes:
        return b"".join((self._prefix, _encode(event.text), _DELTA_END))  # a text block's delta

    def _block_end(self, _event: ev.TextEnd | ev.ReasoningEnd) -> bytes:
        return self._close()

    def _tool_call_start(self, event: ev.ToolCallStart) -> bytes:
        if self._live_call is not None:
            return b""  # another call's block is open: this one is sent whole when it ends
        index, frames = self._open_block(fmt.ToolUseBlock(event.id, event.name, {}))
        self._calls[event.index] = index, fmt.delta_prefix(index, "input_json_delta", "partial_json")
        self._live_call = event.index
        self._json[event.index] = JSONPrefix()
        return frames

    def _tool_call_delta(self, event: ev.ToolCallDelta) -> bytes:
        call = self._calls.get(event.index)
        if call is None or not event.fragment or not call[1]:
            return b""  # a waiting call's fragments are sent whole when it ends
        arguments = self._json.get(event.index)  # None once the call ended
        fragment = arguments.take(event.fragment) if arguments is not None else None
        if fragment is None:  # no JSON object begins like this: the rest of the call is not sent
            self._calls[event.index] = call[0], b""
            return b""
        return call[1] + fmt.encode(fragment) + fmt.DELTA_END if fragment else b""

    def _tool_call_end(self, event: ev.ToolCallEnd) -> bytes:
        self._json.pop(event.index, None)
        if event.index in self._calls:
            return self._close() if self._live_call == event.index else b""
        call = event.call
        index, frames = self._open_block(fmt.ToolUseBlock(call.id, call.name, {}))
        if call.raw_arguments and isinstance(call.arguments, dict) and call.arguments:  # an object, not {}
            prefix = fmt.delta_prefix(index, "input_json_delta", "partial_json")
            frames += prefix + fmt.encode(call.raw_arguments) + fmt.DELTA_END
        return frames + self._close()

    def _outcome(self, outcome: ev.Outcome) -> bytes:
        if outcome.error is not None:
            return self._close() + self.error(outcome.error)
        stop_reason = stop_reason_of(outcome)
        delta = fmt.MessageDelta(
            delta=fmt.Delta(stop_reason=stop_reason, stop_sequence=outcome.stop_sequence),
            usage=usage_of(outcome.usage),
            cost_usd=json_number(outcome.cost.usd),
            cost_source=outcome.cost.source,
        )
        return self._close() + fmt.frame("message_delta", delta) + fmt.MESSAGE_STOP_FRAME


_encode = fmt.encode
_DELTA_END = fmt.DELTA_END


def _nothing(_stream: AnthropicStream, _event: ev.Logprobs) -> bytes:
    return b""


_RENDERERS: dict[type, Callable[[Any, Any], bytes]] = {  # every event but the text deltas, which `render` writes itself
    ev.ToolCallDelta: AnthropicStream._tool_call_delta,
    ev.RefusalDelta: AnthropicStream._refusal_delta,
    ev.Started: AnthropicStream._started,
    ev.TextStart: AnthropicStream._text_start,
    ev.TextEnd: AnthropicStream._block_end,
    ev.ReasoningStart: AnthropicStream._reasoning_start,
    ev.ReasoningEnd: AnthropicStream._block_end,
    ev.ToolCallStart: AnthropicStream._tool_call_start,
    ev.ToolCallEnd: AnthropicStream._tool_call_end,
    ev.Logprobs: _nothing,  # Anthropic's stream has no log probabilities
    ev.Outcome: AnthropicStream._outcome,
}


def render_error(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    """Every error under `/v1/messages`, in Anthropic's shape (this door's exception handler)."""
    request_id, error = as_gateway_error(request, exc)
    body = fmt.error_document(error.status_code, error.message, error.param, request_id)
    headers = {"x-request-id": request_id, "request-id": request_id, **error.headers()}
    return Response(body, status_code=error.status_code, media_type="application/json", headers=headers)


router = Router(
    path="/v1/messages",
    route_handlers=[messages, unknown_path],
    exception_handlers={Exception: render_error},
)
