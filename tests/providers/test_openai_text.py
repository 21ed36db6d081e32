"""The `/completions` (text) dialect: recorded vLLM answers → exact events; requests → exact bodies;
and `Provider.events` sending a raw-prompt request to `{base_url}/completions` over loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from providers.adapter import Provider, make_client
from providers.config import KIND_DEFAULTS, ProviderConfig, WireProfile
from providers.errors import Failure, UpstreamError
from providers.events import (
    Event,
    Finish,
    Logprobs,
    TextDelta,
    TokenLogprob,
    TopLogprob,
    UpstreamMeta,
    Usage,
    UsageReport,
)
from providers.openai_text import TextStreamParser, build_text_body
from providers.types import TextCompletionRequest
from tests.providers.conftest import replay_stream
from tests.support.transcripts import read_transcript
from tests.support.upstream import ReplayUpstream, upstream_fixture

STREAM_ID = "cmpl-9c1d2e3f4a5b4c7d8e9f0a1b2c3d4e5f"


def token(text: str, logprob: float | None, offset: int | None, *top: tuple[str, float | None]) -> TokenLogprob:
    return TokenLogprob(text, logprob, top_logprobs=[TopLogprob(t, v) for t, v in top], text_offset=offset)


PARIS = token(" Paris", -0.0312, 0, (" Paris", -0.0312), (" the", -3.9187))
DOT = token(".", -0.4519, 6, (".", -0.4519), (",", -1.2208))
VLLM_STREAM: list[Event] = [
    UpstreamMeta(STREAM_ID),
    TextDelta(" Paris"),
    Logprobs([PARIS]),
    TextDelta("."),
    Logprobs([DOT]),
    TextDelta(" It"),
    Logprobs([token(" It", -1.2034, 7, (" The", -0.9561), ("\n", -1.1102), (" It", -1.2034))]),
    TextDelta(" is"),
    Logprobs([token(" is", -0.0087, 10, (" is", -0.0087), (" has", -5.1234))]),
    UsageReport(Usage(input_tokens=5, output_tokens=4)),
    Finish("length"),
]


def chunks_of(name: str) -> list[bytes]:
    return [chunk.encode() for chunk in read_transcript(name).chunks]


def text_chunk(text: str, finish: str | None = None, **extra: Any) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish, **extra}
    return b"data: " + msgspec.json.encode({"id": "cmpl-1", "choices": [choice]}) + b"\n\n"


def test_vllm_stream_with_logprobs_and_usage_chunk() -> None:
    replay = replay_stream(chunks_of("vllm_completions_stream"), TextStreamParser())
    assert replay.error is None
    assert replay.events == VLLM_STREAM


def test_vllm_whole_answer_with_cached_tokens() -> None:
    (body,) = read_transcript("vllm_completions_json").chunks
    assert TextStreamParser().parse_whole(body.encode()) == [
        UpstreamMeta("cmpl-4b7e1a0c9d8f4e2a"),
        TextDelta(" Paris."),
        Logprobs([PARIS, DOT]),
        UsageReport(Usage(input_tokens=8, output_tokens=2, cache_read_tokens=32)),
        Finish("stop"),
    ]


def test_echoed_prompt_token_without_probability_and_missing_arrays() -> None:
    tops = [None, {"!": -0.5, "?": None}]  # null: an alternative without a probability (SGLang's -inf)
    echoed = {"tokens": ["Hi", "!"], "token_logprobs": [None, -0.5], "top_logprobs": tops}
    replay = replay_stream(
        [text_chunk("Hi!", logprobs=echoed), b": keep-alive\n\n", b"data: \n\n", text_chunk("", "eos")],
        TextStreamParser(),
    )
    assert replay.error is None
    assert replay.events == [
        UpstreamMeta("cmpl-1"),
        TextDelta("Hi!"),
        Logprobs([token("Hi", None, None), token("!", -0.5, None, ("!", -0.5), ("?", None))]),
        Finish("stop"),  # EOF after a finish reason is a clean end; an unknown reason reads as stop
    ]


def test_a_chat_shaped_answer_is_read_as_its_text() -> None:
    """Some servers answer `/completions` with chat's `message` / `delta`; its content is the text."""
    choice = {"message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}
    whole = msgspec.json.encode({"id": "cmpl-3", "choices": [choice]})
    assert TextStreamParser().parse_whole(whole) == [UpstreamMeta("cmpl-3"), TextDelta("Paris."), Finish("stop")]
    delta = b'data: {"id": "cmpl-1", "choices": [{"delta": {"content": "Par"}}]}\n\n'
    replay = replay_stream([delta, text_chunk("is.", "stop")], TextStreamParser())
    assert replay.error is None
    assert replay.events == [UpstreamMeta("cmpl-1"), TextDelta("Par"), TextDelta("is."), Finish("stop")]
    thinking = {"type": "reasoning", "text": "(hmm)"}  # not the answer's text
    parts = {"message": {"content": [{"type": "text", "text": "Par"}, thinking, {"type": "text", "text": "is."}]}}
    listed = msgspec.json.encode({"id": "cmpl-4", "choices": [{**parts, "finish_reason": "stop"}]})
    assert TextStreamParser().parse_whole(listed) == [UpstreamMeta("cmpl-4"), TextDelta("Paris."), Finish("stop")]


def test_truncated_stream_and_error_inside_a_200() -> None:
    truncated = replay_stream([text_chunk("Hel")], TextStreamParser())
    assert truncated.events == [UpstreamMeta("cmpl-1"), TextDelta("Hel")]
    assert truncated.error is not None
    assert (truncated.error.kind, truncated.error.status) == (Failure.TRANSIENT, 502)
    error = b'data: {"error": {"message": "prompt too long", "type": "invalid_request_error", "code": 400}}\n\n'
    failed = replay_stream([text_chunk("x"), error], TextStreamParser())
    assert failed.error is not None
    assert (failed.error.kind, failed.error.message) == (Failure.CLIENT, "prompt too long")
    with pytest.raises(UpstreamError, match="no choices"):
        TextStreamParser().parse_whole(b'{"id": "cmpl-2", "choices": []}')
    with pytest.raises(UpstreamError, match="malformed"):
        TextStreamParser().parse_whole(b'{"choices": [{"text": 5}]}')


def config(**wire: Any) -> ProviderConfig:
    return ProviderConfig(name="fastrun", kind="fastrun", base_url="http://x/v1", wire=WireProfile(**wire))


def test_body_always_sends_max_tokens_and_only_what_was_given() -> None:
    request = TextCompletionRequest(prompt="Once upon")
    assert msgspec.json.decode(build_text_body(request, "org/base", config(), stream=False)) == {
        "model": "org/base",
        "prompt": "Once upon",
        "max_tokens": 16,
        "stream": False,
    }
    assert msgspec.json.decode(build_text_body(request, "m", config(stream_usage=False), stream=True)) == {
        "model": "m",
        "prompt": "Once upon",
        "max_tokens": 16,
        "stream": True,
    }


def test_body_carries_every_sampling_field_and_provider_options_last() -> None:
    fields = {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 7,
        "stop": ["\n", "END"],
        "logprobs": 2,
        "echo": True,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
    }
    options = {"fastrun": {"min_p": 0.05, "prompt": "injected", "model": "other"}, "local": {"x": 1}}
    request = msgspec.convert(
        {"prompt": "Say", "max_tokens": 5, **fields, "provider_options": options}, TextCompletionRequest
    )
    body = msgspec.json.decode(build_text_body(request, "m", config(), stream=True))
    assert body == {
        "model": "m",
        "prompt": "Say",
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
        **fields,
        "min_p": 0.05,
    }


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 16385}, "max_tokens"),
        ({"logprobs": 6}, "logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": None}, "prompt"),
    ],
)
def test_canonical_ranges(fields: dict[str, Any], path: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=rf"at `\$\.{path}`"):
        msgspec.convert({"prompt": "x", **fields}, TextCompletionRequest)


upstream = upstream_fixture("upstream")


@pytest.fixture
async def provider() -> AsyncIterator[Any]:
    http = make_client()
    yield lambda url: Provider(ProviderConfig("local", "local", url, wire=KIND_DEFAULTS["local"]), http)
    await http.aclose()


@pytest.mark.parametrize("stream", [False, True])
async def test_provider_sends_a_raw_prompt_to_completions(
    upstream: ReplayUpstream, provider: Any, stream: bool
) -> None:
    upstream.enqueue("vllm_completions_stream" if stream else "vllm_completions_json")
    request = TextCompletionRequest(prompt="The capital of France is", max_tokens=4, logprobs=2)

    events = [event async for event in provider(upstream.url).events(request, "Qwen/Qwen3-8B", stream=stream)]

    (sent,) = upstream.requests
    assert (sent.method, sent.path) == ("POST", "/v1/completions")
    assert sent.headers["accept"] == ("text/event-stream" if stream else "application/json")
    assert sent.headers["accept-encoding"] == "identity"
    expected = {"model": "Qwen/Qwen3-8B", "prompt": "The capital of France is", "max_tokens": 4, "stream": stream}
    if stream:
        expected["stream_options"] = {"include_usage": True}
    assert sent.json() == {**expected, "logprobs": 2}
    assert events[-1] == (Finish("length") if stream else Finish("stop"))
    whole = read_transcript("vllm_completions_json").chunks[0].encode()
    assert events == (VLLM_STREAM if stream else TextStreamParser().parse_whole(whole))
