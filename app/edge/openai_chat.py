"""The OpenAI Chat Completions ingress, `POST /v1/chat/completions`, and `GET /v1/models` (ingress.md).

A front door like `app.edge.unified`: the OpenAI request is translated into a `CompletionRequest`
(`app.edge.openai_translate`), the pipeline runs unchanged with the context's ingress
`openai_chat` (the ledger's `api`), and what comes back is rendered in OpenAI's shapes
(`app.edge.openai_format`): a `chat.completion` from the `Outcome`, or `chat.completion.chunk`
lines from the canonical events (`ChatStream`). Errors before the answer starts leave through the
application's one error renderer, whose two-view body is what OpenAI clients read.

Rendering decisions:
- `id` is the gateway's request id, `model` the canonical catalog id, `created` the request's start;
- the message's `content` is its text (null when the answer is only tool calls), `reasoning_content`
  its reasoning, tool calls carry their argument string as the upstream streamed it;
- `usage` is OpenAI's inclusive convention over the five buckets, with `cost` (an exact JSON
  number, null when unpriced) and `cost_source`; no usage object at all when the upstream reported
  none (streamed: no usage chunk, even when `include_usage` asked for one);
- streamed, the role comes alone in the first chunk, each tool call's `id`/`type`/`name` only in
  its first delta, and the finish reason in a last chunk with an empty delta (after a
  `content: ""` chunk when the answer said nothing: it assembles as the JSON answer reads); log
  probabilities ride on the chunk of the text they belong to (`LogprobChatStream` holds a text
  delta back until its `Logprobs` event, which the fold emits right after it);
- a failure after the stream started is `data: {"error": {message, type, code}}` and no `[DONE]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar import Request, asgi, route
from litestar.datastructures import State
from litestar.response import Response
from litestar.types import Receive, Scope, Send
from msgspec import UNSET

from app.context import RequestContext
from app.edge import openai_format as fmt
from app.edge.asgi import serve
from app.edge.key_guard import GET_HEAD, rate_window, require_key, visible
from app.edge.openai_format import created_of, usage_of
from app.edge.openai_translate import decode_chat, to_request
from app.edge.relay import StreamRenderer
from app.errors import GatewayError, NotFound, clip, stream_error_view
from app.pipeline import events as ev
from app.service import Service
from catalog.snapshot import CatalogSnapshot, ModelEntry
from providers.events import TokenLogprob
from providers.types import TextPart, ThinkingPart, ToolCallPart


@asgi("/v1/chat/completions", copy_scope=False)
async def chat_completions(scope: Scope, receive: Receive, send: Send) -> None:
    await serve(scope, receive, send, "openai_chat", _translate)


class _Chat:
    """This door's `Door`: the canonical request, and what the stream must carry."""

    __slots__ = ("include_usage", "renames", "request", "stream")
    id_header = None

    def __init__(self, chat: fmt.ChatRequest) -> None:
        self.request = to_request(chat)
        self.stream = bool(chat.stream)
        self.include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
        self.renames = _COMPLETION_TOKENS if chat.max_completion_tokens is not None else _NAMES

    def answer(self, ctx: RequestContext, outcome: ev.Outcome) -> bytes:
        return fmt.encoder.encode(completion_of(ctx, outcome, bool(self.request.logprobs)))

    def renderer(self, ctx: RequestContext) -> ChatStream:
        stream = LogprobChatStream if self.request.logprobs else ChatStream
        return stream(ctx, self.include_usage)


_NAMES = {"system": "messages", "schema": "response_format"}  # the canonical request's parts, as this door has them
_COMPLETION_TOKENS = {**_NAMES, "max_tokens": "max_completion_tokens"}  # the one that wins (openai_translate)


def _translate(body: bytes, _service: Service) -> _Chat:
    return _Chat(decode_chat(body))


@route("/v1/models", http_method=GET_HEAD, middleware=[rate_window], guards=[require_key])
async def openai_models(state: State, request: Request[Any, Any, Any]) -> Response[bytes]:
    """Catalog ids, not aliases; with API keys, only the models the caller's key may use."""
    service: Service = state.service
    assert service.router is not None
    snapshot = service.router.snapshot
    cards = [_card(entry, snapshot) for entry in snapshot.models if visible(request, entry, snapshot)]
    return Response(fmt.encoder.encode(fmt.ModelCards(data=cards)), media_type="application/json")


@route("/v1/models/{model_id:path}", http_method=GET_HEAD, middleware=[rate_window], guards=[require_key])
async def openai_model(state: State, request: Request[Any, Any, Any]) -> Response[bytes]:
    """One model's card, as OpenAI's `GET /v1/models/{model}` (`client.models.retrieve`): a catalog
    id or alias the caller's key may use; 404 otherwise."""
    service: Service = state.service
    assert service.router is not None
    name = str(request.path_params["model_id"]).lstrip("/")
    snapshot = service.router.snapshot
    entry = snapshot.resolve(name)
    if entry is None or not visible(request, entry, snapshot):
        raise NotFound(f"model '{clip(name)}' does not exist")
    return Response(fmt.encoder.encode(_card(entry, snapshot)), media_type="application/json")


def _card(entry: ModelEntry, snapshot: CatalogSnapshot) -> fmt.ModelCard:
    """`created` is when the model's first price took effect here (0 when it has none): a value
    that is the same on every call, worker and restart, as OpenAI's is, so a client comparing two
    lists does not see every model as changed (it was the time of the call)."""
    first = snapshot.first_priced(entry.id)
    return fmt.ModelCard(id=entry.id, created=int(first.timestamp()) if first is not None else 0)


def completion_of(ctx: RequestContext, outcome: ev.Outcome, logprobs: bool) -> fmt.ChatCompletion:
    """The whole answer; `logprobs`: the request asked for them (ingress.md: only then, even when
    an upstream sends them unasked)."""
    choice = fmt.Choice(
        index=0,
        message=message_of(outcome),
        logprobs=logprobs_of(outcome.logprobs) if logprobs and outcome.logprobs is not None else None,
        finish_reason=finish_reason_of(outcome),
    )
    return fmt.ChatCompletion(
        id=ctx.request_id,
        created=created_of(ctx),
        model=outcome.model or "",
        choices=[choice],
        usage=usage_of(outcome) if outcome.usage is not None else UNSET,
    )


def finish_reason_of(outcome: ev.Outcome) -> str:
    """OpenAI's: a refusal finishes with `stop` (the canonical `content_filter` is the refusal's),
    so the SDK's `parse()` returns it in `message.refusal` instead of raising."""
    reason = outcome.finish_reason or "stop"
    return "stop" if reason == "content_filter" and outcome.refusals else reason


def message_of(outcome: ev.Outcome) -> fmt.AssistantOut:
    texts: list[str] = []
    refusals: list[str] = []
    thoughts: list[str] = []
    calls: list[fmt.ToolCallOut] = []
    for part in outcome.message.content if outcome.message is not None else ():
        if isinstance(part, TextPart):
            (refusals if any(part is refusal for refusal in outcome.refusals) else texts).append(part.data)
        elif isinstance(part, ThinkingPart):
            thoughts.append(part.data.text)
        elif isinstance(part, ToolCallPart):
            call = part.data
            arguments = call.raw_arguments
            if arguments is None:
                arguments = fmt.encoder.encode(call.arguments).decode()
            elif not arguments.strip():  # none given: `{}`, as OpenAI sends (`""` is no JSON to a client)
                arguments = "{}"
            calls.append(fmt.ToolCallOut(call.id, "function", fmt.FunctionOut(call.name, arguments)))
    return fmt.AssistantOut(
        role="assistant",
        content="".join(texts) if texts or not (calls or refusals) else None,
        refusal="".join(refusals) if refusals else UNSET,
        tool_calls=calls or UNSET,
        reasoning_content="".join(thoughts) if thoughts else UNSET,
    )


def logprobs_of(tokens: list[TokenLogprob]) -> fmt.ChoiceLogprobs:
    return fmt.ChoiceLogprobs([fmt.TokenLogprobOut(t.token, t.logprob, t.bytes, t.top_logprobs) for t in tokens])


class ChatStream(StreamRenderer):
    """Canonical events → `chat.completion.chunk` lines (block starts and ends say nothing here).

    A text delta, the per-chunk case, is rendered inline: the answer's content head (built once on
    `Started`), the encoded text and the constant tail. Every other event goes through the class's
    table of plain functions (no bound methods or dict built per request)."""

    ping = fmt.KEEPALIVE

    def __init__(self, ctx: RequestContext, include_usage: bool) -> None:
        self._ctx = ctx
        self._include_usage = include_usage
        self._chunks = _NOT_STARTED
        self._content = _NOT_STARTED.content_head
        self._created = 0
        self._live_call: int | None = None  # the call whose arguments stream as they come

    def render(self, event: ev.Event) -> bytes:
        if type(event) is ev.TextDelta:
            return b"".join((self._content, _encode(event.text), _TAIL))
        return _RENDERERS[type(event)](self, event)

    def error(self, error: GatewayError) -> bytes:
        return fmt.data_line(fmt.ErrorChunk(stream_error_view(error)))

    def _started(self, event: ev.Started) -> bytes:
        self._created = created_of(self._ctx)
        self._chunks = chunks = fmt.ChunkBytes(self._ctx.request_id, self._created, event.model)
        self._content = chunks.content_head
        return chunks.role()

    def _reasoning_delta(self, event: ev.ReasoningDelta) -> bytes:
        return self._chunks.reasoning(event.text)

    def _refusal_delta(self, event: ev.RefusalDelta) -> bytes:
        return self._chunks.refusal(event.text)

    def _tool_call_start(self, event: ev.ToolCallStart) -> bytes:
        if self._live_call is not None:
            return b""  # sent whole when it ends (`_tool_call_end`)
        self._live_call = event.index
        return self._chunks.tool_call_start(event.index, event.id, event.name)

    def _tool_call_delta(self, event: ev.ToolCallDelta) -> bytes:
        if event.index != self._live_call:
            return b""
        return self._chunks.tool_call_args(event.index, event.fragment)

    def _tool_call_end(self, event: ev.ToolCallEnd) -> bytes:
        """The first call streams live; a later one waits for its end (canonical calls end with the
        answer) and is sent whole: its start, then all its arguments. Upstreams may interleave the
        fragments of parallel calls, and the OpenAI SDK's stream helper takes a call for done at the
        first delta of another (`arguments.done` with '', a strict tool's parse failing). A call the
        upstream gave no arguments (`""`) gets `{}`, as OpenAI sends: `""` is no JSON to a client."""
        call, chunks = event.call, self._chunks
        raw = call.raw_arguments or ""
        given = raw.strip() != ""
        if event.index == self._live_call:
            return b"" if given else chunks.tool_call_args(event.index, "{}")
        start = chunks.tool_call_start(event.index, call.id, call.name)
        return start + chunks.tool_call_args(event.index, raw if given else "{}")

    def _outcome(self, outcome: ev.Outcome) -> bytes:
        if outcome.error is not None:
            return self.error(outcome.error)
        last = self._chunks.finish(finish_reason_of(outcome))
        if not _said_anything(outcome):  # `content: ""`, as the JSON answer and OpenAI's first chunk have it
            last = self._chunks.content("") + last
        if self._include_usage and outcome.usage is not None:
            model, usage = outcome.model or "", usage_of(outcome)
            chunk = fmt.UsageChunk(id=self._ctx.request_id, created=self._created, model=model, usage=usage)
            last += fmt.data_line(chunk)
        return last + fmt.DONE


def _said_anything(outcome: ev.Outcome) -> bool:
    """Did the answer carry text, a refusal or a tool call? Without any, a streamed message would
    assemble with `content: null`, which the SDK's stream helper hands back and a next turn that
    sends it in the history is refused for (`messages[i].content`)."""
    parts = outcome.message.content if outcome.message is not None else ()
    return any(isinstance(part, (TextPart, ToolCallPart)) for part in parts)


class LogprobChatStream(ChatStream):
    """`ChatStream` for a request that asked for log probabilities: a text delta waits for the
    `Logprobs` event that follows it, so both leave in one chunk, as OpenAI sends them. It waits
    within its batch only (`flush`): an upstream chunk's text and log probabilities come in one
    batch, and a delta the upstream sent none for left one upstream read late (each token a whole
    inter-token gap behind, the last one before a pause held through it)."""

    holds = True  # `flush`

    def __init__(self, ctx: RequestContext, include_usage: bool) -> None:
        super().__init__(ctx, include_usage)
        self._held: str | None = None

    def render(self, event: ev.Event) -> bytes:
        if isinstance(event, ev.TextDelta):
            flushed = self.flush()
            self._held = event.text
            return flushed
        if isinstance(event, ev.Logprobs):
            text, self._held = self._held, None
            return self._chunks.logprobs(text, logprobs_of(event.tokens))
        return self.flush() + _RENDERERS[type(event)](self, event)

    def flush(self) -> bytes:
        if self._held is None:
            return b""
        text, self._held = self._held, None
        return self._chunks.content(text)


_NOT_STARTED = fmt.ChunkBytes("", 0, "")  # replaced on `Started`, which comes before any content
_TAIL = fmt.CHUNK_TAIL
_encode = fmt.encoder.encode


def _nothing(_stream: ChatStream, _event: object) -> bytes:
    return b""


_RENDERERS: dict[type, Callable[[Any, Any], bytes]] = {  # every event but the text deltas, which `render` writes itself
    ev.ReasoningDelta: ChatStream._reasoning_delta,
    ev.RefusalDelta: ChatStream._refusal_delta,
    ev.ToolCallDelta: ChatStream._tool_call_delta,
    ev.ToolCallStart: ChatStream._tool_call_start,
    ev.Started: ChatStream._started,
    ev.TextStart: _nothing,
    ev.TextEnd: _nothing,
    ev.ReasoningStart: _nothing,
    ev.ReasoningEnd: _nothing,
    ev.ToolCallEnd: ChatStream._tool_call_end,
    ev.Logprobs: _nothing,  # not asked for (an upstream may send them anyway): `LogprobChatStream` renders them
    ev.Outcome: ChatStream._outcome,
}
