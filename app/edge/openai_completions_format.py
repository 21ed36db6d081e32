"""The legacy OpenAI text completion wire format (ingress.md, `POST /v1/completions`): the request
as clients send it and its translation into a `TextCompletionRequest`, the `text_completion`
answer, and its stream lines.

The request Struct follows the chat door's policy (`app.edge.openai_format`): an explicit `null`
is absent, unknown fields are ignored, ranges are `Meta` constraints, so a wrong type or an
out-of-range value fails decoding with the field's name as `param`. What a type cannot say is
checked after decoding, also as a 400 naming the field:
- `prompt` is a string or an array holding exactly one string; token arrays (`[1, 2]`,
  `[[1, 2]]`) and several prompts are refused: one prompt is one upstream request here, and the
  gateway has no tokenizer to turn token ids back into the text it routes by;
- `stop` a string or at most 4; `n` and `best_of` other than 1 and a `suffix` (insertion) are
  refused rather than silently answered with something else.
`max_tokens` is 1..16384 and defaults to 16 (the fastrun and primalabs range and default); the
canonical request always carries it.

Stream lines are built from bytes, as the chat door's are: the prefix of every chunk (`id`,
`object`, `created`, `model`, up to the choice's `text`) is encoded once when the answer starts.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from app.edge.openai_format import Seed, StreamOptions, UsageOut, encoder
from app.edge.openai_translate import check_stop_and_stream
from app.edge.validation import decode_body
from app.errors import InvalidRequest
from providers.events import TokenLogprob
from providers.types import MAX_TEXT_TOKENS, TextCompletionRequest

Penalty = Annotated[float, Meta(ge=-2, le=2)]


class LegacyRequest(Struct):
    prompt: str | list[Any]
    model: str | None = None
    max_tokens: Annotated[int, Meta(ge=1, le=MAX_TEXT_TOKENS)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    echo: bool | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = None
    best_of: int | None = None
    suffix: str | None = None


_request_decoder = msgspec.json.Decoder(LegacyRequest)


def decode_legacy(body: bytes) -> LegacyRequest:
    legacy = decode_body(_request_decoder, body)
    _check(legacy)
    return legacy


def _check(legacy: LegacyRequest) -> None:
    check_stop_and_stream(legacy.stop, legacy.stream, legacy.stream_options)
    for name in ("n", "best_of"):
        value = getattr(legacy, name)
        if value is not None and value != 1:
            raise _invalid(name, "only one choice per request is supported (must be 1)")
    if legacy.suffix is not None:
        raise _invalid("suffix", "insertion (a suffix after the completion) is not supported")


def prompt_text(prompt: str | list[Any]) -> str:
    """The one prompt string of `prompt` (module doc), else a 400 naming `prompt`."""
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if any(type(item) is int or type(item) is list for item in prompt):
        raise _invalid("prompt", "token arrays are not supported: send the prompt as a string")
    if len(prompt) > 1 and all(isinstance(item, str) for item in prompt):
        raise _invalid("prompt", f"only one prompt per request is supported, got {len(prompt)}")
    raise _invalid("prompt", "must be a string or an array holding one string")


def to_text_request(legacy: LegacyRequest) -> TextCompletionRequest:
    """The canonical request for a decoded, checked legacy request."""
    stop = legacy.stop
    request = TextCompletionRequest(
        prompt=prompt_text(legacy.prompt),
        model=legacy.model,
        temperature=legacy.temperature,
        top_p=legacy.top_p,
        top_k=legacy.top_k,
        seed=legacy.seed,
        stop=[stop] if isinstance(stop, str) else stop or None,
        logprobs=legacy.logprobs,
        echo=legacy.echo,
        presence_penalty=legacy.presence_penalty,
        frequency_penalty=legacy.frequency_penalty,
        stream=legacy.stream,
    )
    if legacy.max_tokens is not None:
        request.max_tokens = legacy.max_tokens
    return request


def _invalid(param: str, detail: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {detail}", param=param)


# --- response -----------------------------------------------------------------------------------


class TextLogprobs(Struct):
    """The legacy `logprobs` object: parallel arrays, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float | None] | None]
    text_offset: list[int]


class TextChoice(Struct):
    index: int
    text: str
    logprobs: TextLogprobs | None
    finish_reason: str


class TextCompletion(Struct, kw_only=True):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[TextChoice]
    usage: UsageOut | UnsetType = UNSET


def text_logprobs_of(tokens: list[TokenLogprob], offset: int = 0) -> tuple[TextLogprobs, int]:
    """The legacy `logprobs` of `tokens`, and the offset after the last one. A token without the
    upstream's `text_offset` is placed right after the one before it, from `offset`; a token with
    no probability and no alternatives (the first echoed prompt token) has `top_logprobs` null."""
    out = TextLogprobs([], [], [], [])
    for token in tokens:
        if token.text_offset is not None:
            offset = token.text_offset
        out.tokens.append(token.token)
        out.token_logprobs.append(token.logprob)
        if token.top_logprobs or token.logprob is not None:
            out.top_logprobs.append({top.token: top.logprob for top in token.top_logprobs})
        else:
            out.top_logprobs.append(None)
        out.text_offset.append(offset)
        offset += len(token.token)
    return out, offset


# --- stream lines -------------------------------------------------------------------------------

_encode = encoder.encode
CHUNK_TAIL = b',"logprobs":null,"finish_reason":null}]}\n\n'  # after the choice's text


class TextChunkBytes:
    """The chunk lines of one answer. `text_head` is everything before the choice's text:
    `data: {"id":…,"object":"text_completion","created":…,"model":…,"choices":[{"index":0,"text":`;
    a text chunk is it, the encoded text and `CHUNK_TAIL`."""

    __slots__ = ("text_head",)

    def __init__(self, request_id: str, created: int, model: str) -> None:
        self.text_head = b"".join(
            (
                b'data: {"id":',
                _encode(request_id),
                b',"object":"text_completion","created":%d,"model":' % created,
                _encode(model),
                b',"choices":[{"index":0,"text":',
            )
        )

    def text(self, text: str) -> bytes:
        return self.text_head + _encode(text) + CHUNK_TAIL

    def logprobs(self, text: str, logprobs: TextLogprobs) -> bytes:
        return self.text_head + _encode(text) + b',"logprobs":' + _encode(logprobs) + b',"finish_reason":null}]}\n\n'

    def finish(self, reason: str) -> bytes:
        return self.text_head + b'"","logprobs":null,"finish_reason":' + _encode(reason) + b"}]}\n\n"
