"""OpenAI text-completion wire format (`/completions`): the pure body builder and answer parser.

The chat dialect's sibling (`openai_chat.py`): a `TextCompletionRequest` becomes a `/completions`
body whose `prompt` is the client's text, sent as is, never wrapped in a chat template; what comes
back, streamed or whole, becomes the same `providers.events` as a chat answer, so the pipeline
folds it on its one path. The rules every OpenAI-style stream shares (`[DONE]` and EOF,
keep-alives, errors inside a 200, usage on any chunk) are `providers.openai_stream`'s.

Body decisions (providers.md, fastrun and primalabs `/completions`):
- `max_tokens` is always sent (the request's default is the legacy API's 16): hosts disagree on
  what an absent one means (vLLM: the rest of the context window);
- `stop`, `logprobs` (an int: how many alternatives per token), `echo` and the sampling fields are
  sent under their own names when given; `stream_options.include_usage` when streaming and the
  wire profile says the host takes it;
- `provider_options.<provider>` merge last, never replacing `model`, `prompt`, `stream`,
  `stream_options`, nor setting what bounds an answer's cost (`BOUNDING_OPTIONS`).

Parser decisions: `choices[0].text` → `TextDelta`; `choices[0].logprobs` (parallel arrays
`tokens`, `token_logprobs`, `top_logprobs` as `{token: logprob}` maps, `text_offset`) → one
`Logprobs` event after the text it belongs to, each token keeping its `text_offset`; a
`token_logprobs` entry of null (the first echoed prompt token has no probability) stays None.
llama.cpp answers `/completions` with chat's shape instead (`logprobs.content`, a list of
`{token, logprob, bytes, top_logprobs}`), read as the same tokens, their offsets counted by the
door from the text.
A choice without `text` but with a chat-shaped `message.content` (whole) or `delta.content`
(streamed), as some servers answer `/completions`, is read as that text: an answer read as empty
would be billed and relayed as nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

from providers.config import ProviderConfig
from providers.events import Event, Logprobs, TextDelta, TokenLogprob, TopLogprob
from providers.openai_request import BOUNDING_OPTIONS, WireStreamOptions, encode_with_options
from providers.openai_stream import ChunkBase, OpenAIStreamParser, answer_choice
from providers.types import TextCompletionRequest

__all__ = ["TextStreamParser", "build_text_body"]

_PROTECTED = frozenset({"model", "prompt", "stream", "stream_options"}) | BOUNDING_OPTIONS


class TextBody(Struct):
    model: str
    prompt: str
    max_tokens: int
    stream: bool = False
    stream_options: WireStreamOptions | UnsetType = UNSET
    temperature: float | UnsetType = UNSET
    top_p: float | UnsetType = UNSET
    top_k: int | UnsetType = UNSET
    seed: int | UnsetType = UNSET
    stop: list[str] | UnsetType = UNSET
    logprobs: int | UnsetType = UNSET
    echo: bool | UnsetType = UNSET
    presence_penalty: float | UnsetType = UNSET
    frequency_penalty: float | UnsetType = UNSET


_OPTIONAL = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "logprobs",
    "echo",
    "presence_penalty",
    "frequency_penalty",
)


def text_body(req: TextCompletionRequest, upstream_model: str, cfg: ProviderConfig, *, stream: bool) -> TextBody:
    body = TextBody(model=upstream_model, prompt=req.prompt, max_tokens=req.max_tokens, stream=stream)
    if stream and cfg.wire.stream_usage:
        body.stream_options = WireStreamOptions()
    for name in _OPTIONAL:  # TextBody's and TextCompletionRequest's field names are the same
        value = getattr(req, name)
        if value is not None:
            setattr(body, name, value)
    if not cfg.wire.sampling_extras:  # a host that refuses fields it does not know (`WireProfile`)
        body.top_k = UNSET
    return body


def build_text_body(req: TextCompletionRequest, upstream_model: str, cfg: ProviderConfig, *, stream: bool) -> bytes:
    """The encoded `/completions` body for `req` on provider `cfg`."""
    body = text_body(req, upstream_model, cfg, stream=stream)
    options = req.provider_options.get(cfg.name) if req.provider_options else None
    return encode_with_options(body, options, _PROTECTED)


class _TextLogprobs(Struct):
    tokens: list[str] | None = None
    token_logprobs: list[float | None] | None = None
    top_logprobs: list[dict[str, float | None] | None] | None = None
    text_offset: list[int] | None = None
    content: list[TokenLogprob] | None = None  # chat-shaped (llama.cpp's `/completions`): no offsets


class _ChatShaped(Struct):
    content: str | list[Any] | None = None  # a list: parts, the text parts' `text` read

    def text(self) -> str | None:
        content = self.content
        if not isinstance(content, list):
            return content
        texts = (p for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
        return "".join(p["text"] for p in texts if isinstance(p.get("text"), str))


class _TextChoice(Struct):
    index: int = 0
    text: str | None = None
    finish_reason: str | None = None
    logprobs: _TextLogprobs | None = None
    message: _ChatShaped | None = None
    delta: _ChatShaped | None = None

    def answer_text(self) -> str | None:
        if self.text is not None:
            return self.text
        shaped = self.message or self.delta
        return None if shaped is None else shaped.text()


class _TextChunk(ChunkBase):
    """One streamed chunk or one whole answer (`ChunkBase`: id, usage, an error inside a 200)."""

    choices: list[_TextChoice] | None = None


class TextStreamParser(OpenAIStreamParser[_TextChunk]):
    """Feed it the `data` payloads of one `/completions` stream; it returns events."""

    __slots__ = ()
    decoder = msgspec.json.Decoder(_TextChunk, strict=False)

    def _choice(self, chunk: _TextChunk, events: list[Event]) -> str | None:
        if not chunk.choices:
            return None
        choice = answer_choice(chunk.choices)
        if choice is None:
            return None
        text = choice.answer_text()
        if text:
            events.append(TextDelta(text=text))
        if choice.logprobs is not None and choice.logprobs.tokens:
            events.append(Logprobs(token_logprobs(choice.logprobs)))
        elif choice.logprobs is not None and choice.logprobs.content:
            events.append(Logprobs(choice.logprobs.content))
        return choice.finish_reason


def token_logprobs(logprobs: _TextLogprobs) -> list[TokenLogprob]:
    """The parallel arrays of a legacy `logprobs` object, one `TokenLogprob` per token (a missing
    or short array reads as None / no alternatives)."""
    tokens = logprobs.tokens or []
    values = logprobs.token_logprobs or []
    tops = logprobs.top_logprobs or []
    offsets = logprobs.text_offset or []
    result: list[TokenLogprob] = []
    for i, token in enumerate(tokens):
        top = tops[i] if i < len(tops) else None
        result.append(
            TokenLogprob(
                token,
                values[i] if i < len(values) else None,
                top_logprobs=[TopLogprob(t, v) for t, v in top.items()] if top else [],
                text_offset=offsets[i] if i < len(offsets) else None,
            )
        )
    return result
