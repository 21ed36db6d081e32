"""The legacy OpenAI text completion ingress, `POST /v1/completions` (ingress.md).

The chat door's sibling (`app.edge.openai_chat`): the legacy request is translated into a
`TextCompletionRequest` (`app.edge.openai_completions_format`), the pipeline runs unchanged with
the context's ingress `openai_completions` (the ledger's `api`), admission refuses a model
without the `completions` capability, and the adapter sends the prompt to the upstream's own
`/completions` endpoint, never through a chat template. Errors before the answer starts leave
through the application's one error renderer (api.md's two-view body, what the SDK reads).

Rendering decisions (the chat door's, where the formats share them):
- `id` is the gateway's request id, `model` the canonical catalog id, `created` the request's
  start; `choices[0].text` is the answer's text (with `echo`, the upstream's echoed prompt first);
- `choices[0].logprobs` (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`) when the
  request asked and the upstream gave them, the offsets as the upstream counted them;
- `usage` is the chat door's object (`app.edge.openai_format.usage_of`: OpenAI's inclusive
  convention, `prompt_tokens_details.cached_tokens`, `cost`, `cost_source`); none at all when the
  upstream reported none, streamed or not;
- streamed: one `text_completion` chunk per text delta (with logprobs, a delta waits for its
  `Logprobs` event so both leave in one chunk), a last chunk with empty text and the finish
  reason, the usage chunk (`choices: []`) when `stream_options.include_usage` asked, `[DONE]`;
  a failure after the stream started is `data: {"error": {message, type, code}}` and no `[DONE]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar import asgi
from litestar.types import Receive, Scope, Send
from msgspec import UNSET

from app.context import RequestContext
from app.edge import openai_completions_format as text_fmt
from app.edge import openai_format as fmt
from app.edge.asgi import serve
from app.edge.relay import StreamRenderer
from app.errors import GatewayError, stream_error_view
from app.pipeline import events as ev
from app.service import Service
from providers.types import TextPart


@asgi("/v1/completions", copy_scope=False)
async def text_completions(scope: Scope, receive: Receive, send: Send) -> None:
    await serve(scope, receive, send, "openai_completions", _translate)


class _Text:
    """This door's `Door`: a raw-prompt request, and what the stream must carry."""

    __slots__ = ("include_usage", "request", "stream")
    id_header = None
    renames = None

    def __init__(self, legacy: text_fmt.LegacyRequest) -> None:
        self.request = text_fmt.to_text_request(legacy)
        self.stream = bool(legacy.stream)
        self.include_usage = bool(legacy.stream_options and legacy.stream_options.include_usage)

    def answer(self, ctx: RequestContext, outcome: ev.Outcome) -> bytes:
        return fmt.encoder.encode(text_completion_of(ctx, outcome, self.request.logprobs is not None))

    def renderer(self, ctx: RequestContext) -> TextStream:
        stream = TextStream if self.request.logprobs is None else LogprobTextStream
        return stream(ctx, self.include_usage)


def _translate(body: bytes, _service: Service) -> _Text:
    return _Text(text_fmt.decode_legacy(body))


def text_completion_of(ctx: RequestContext, outcome: ev.Outcome, asked: bool) -> text_fmt.TextCompletion:
    """The whole answer; `asked`: the request asked for log probabilities (only then are they sent)."""
    message = outcome.message
    text = "".join(part.data for part in message.content if isinstance(part, TextPart)) if message else ""
    tokens = outcome.logprobs if asked else None
    logprobs = text_fmt.text_logprobs_of(tokens)[0] if tokens is not None else None
    choice = text_fmt.TextChoice(0, text, logprobs, outcome.finish_reason or "stop")
    return text_fmt.TextCompletion(
        id=ctx.request_id,
        created=fmt.created_of(ctx),
        model=outcome.model or "",
        choices=[choice],
        usage=fmt.usage_of(outcome) if outcome.usage is not None else UNSET,
    )


class TextStream(StreamRenderer):
    """Canonical events → `text_completion` chunk lines. Only text, log probabilities and the end
    say anything here (a raw completion has no blocks, reasoning or tool calls). A text delta, the
    per-chunk case, is rendered inline (the answer's text head, built once on `Started`, the
    encoded text and the constant tail); the rest goes through the module's table."""

    ping = fmt.KEEPALIVE

    def __init__(self, ctx: RequestContext, include_usage: bool) -> None:
        self._ctx = ctx
        self._include_usage = include_usage
        self._offset = 0
        self._created = 0
        self._chunks = _NOT_STARTED
        self._text = _NOT_STARTED.text_head

    def render(self, event: ev.Event) -> bytes:
        if type(event) is ev.TextDelta:
            return b"".join((self._text, _encode(event.text), _TAIL))
        return _RENDERERS.get(type(event), _nothing)(self, event)

    def error(self, error: GatewayError) -> bytes:
        return fmt.data_line(fmt.ErrorChunk(stream_error_view(error)))

    def _started(self, event: ev.Started) -> bytes:
        ctx = self._ctx
        self._created = fmt.created_of(ctx)
        self._chunks = chunks = text_fmt.TextChunkBytes(ctx.request_id, self._created, event.model)
        self._text = chunks.text_head
        return b""

    def _logprobs(self, event: ev.Logprobs, text: str = "") -> bytes:
        logprobs, self._offset = text_fmt.text_logprobs_of(event.tokens, self._offset)
        return self._chunks.logprobs(text, logprobs)

    def _outcome(self, outcome: ev.Outcome) -> bytes:
        if outcome.error is not None:
            return self.error(outcome.error)
        last = self._chunks.finish(outcome.finish_reason or "stop")
        if self._include_usage and outcome.usage is not None:
            ctx = self._ctx
            model, usage = outcome.model or "", fmt.usage_of(outcome)
            chunk = fmt.UsageChunk(id=ctx.request_id, object=_OBJECT, created=self._created, model=model, usage=usage)
            last += fmt.data_line(chunk)
        return last + fmt.DONE


class LogprobTextStream(TextStream):
    """`TextStream` for a request that asked for log probabilities: a text delta waits for the
    `Logprobs` event that follows it, so both leave in one chunk; within its batch only (`flush`,
    as `LogprobChatStream`'s)."""

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
            held, self._held = self._held, None
            return self._logprobs(event, held or "")
        if isinstance(event, ev.Outcome):
            return self.flush() + self._outcome(event)
        return self.flush() + super().render(event)  # held text goes before what follows it

    def flush(self) -> bytes:
        if self._held is None:
            return b""
        text, self._held = self._held, None
        return self._chunks.text(text)


def _nothing(_stream: TextStream, _event: ev.Event) -> bytes:
    return b""


_OBJECT = "text_completion"
_NOT_STARTED = text_fmt.TextChunkBytes("", 0, "")  # replaced on `Started`, which comes before any content
_TAIL = text_fmt.CHUNK_TAIL
_encode = fmt.encoder.encode
_RENDERERS: dict[type, Callable[[Any, Any], bytes]] = {  # `Logprobs` not asked for: nothing (`LogprobTextStream`)
    ev.RefusalDelta: lambda stream, event: b"".join((stream._text, _encode(event.text), _TAIL)),  # text here
    ev.Started: TextStream._started,
    ev.Outcome: TextStream._outcome,
}
