"""The OpenAI chat dialect: recorded streams and answers → exact events; requests → exact bodies."""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import msgspec
import pytest

from providers.config import KIND_DEFAULTS, ProviderConfig, WireProfile
from providers.errors import Failure, UpstreamError
from providers.events import (
    Event,
    Finish,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallArgs,
    ToolCallStart,
    UpstreamMeta,
    Usage,
    UsageReport,
)
from providers.openai_chat import ChatStreamParser, build_chat_body, normalise_finish
from providers.types import CompletionRequest

Replay = Any  # conftest.Replay: .events and .error


def report(**buckets: int) -> UsageReport:
    return UsageReport(usage=Usage(**buckets))


STREAMS: dict[str, list[Event]] = {
    "vllm_text_stream.json": [
        UpstreamMeta("chatcmpl-7f3a9c2e1b0d4e5f"),
        TextDelta("Hel"),
        TextDelta("lo"),
        TextDelta(" world"),
        report(input_tokens=12, output_tokens=3),
        Finish("stop"),
    ],
    "vllm_reasoning_stream.json": [
        UpstreamMeta("chatcmpl-b81c2d"),
        ReasoningDelta("2 and 2"),
        ReasoningDelta(" make 4."),
        TextDelta("4"),
        report(input_tokens=20, output_tokens=15),
        Finish("stop"),
    ],
    "sglang_reasoning_content_stream.json": [
        UpstreamMeta("d4b0c6a1e2f34c5a8b7e9f0a1b2c3d4e"),
        ReasoningDelta("Think"),
        ReasoningDelta("ing."),
        TextDelta("Done"),
        report(input_tokens=9, output_tokens=8),
        Finish("stop"),
    ],
    "vllm_tool_call_stream.json": [
        UpstreamMeta("chatcmpl-tool-1"),
        ToolCallStart(0, "chatcmpl-tool-9a8b7c", "get_weather"),
        ToolCallArgs(0, '{"city": '),
        ToolCallArgs(0, '"Paris"}'),
        report(input_tokens=150, output_tokens=20),
        Finish("tool_calls"),
    ],
    "vllm_parallel_tool_calls_stream.json": [
        UpstreamMeta("chatcmpl-par-2"),
        ToolCallStart(0, "call_paris", "get_weather"),
        ToolCallStart(1, "call_tokyo", "get_weather"),
        ToolCallArgs(1, '{"city":'),
        ToolCallArgs(0, '{"city":"Paris"}'),
        ToolCallArgs(1, '"Tokyo"}'),
        report(input_tokens=200, output_tokens=40),
        Finish("tool_calls"),
    ],
    "llamacpp_tool_call_repeated_id_stream.json": [
        UpstreamMeta("chatcmpl-lcpp"),
        ToolCallStart(0, "Xb2kQ9", "get_weather"),
        ToolCallArgs(0, '{"ci'),
        ToolCallArgs(0, 'ty":"Ber'),
        ToolCallArgs(0, 'lin"}'),
        report(input_tokens=88, output_tokens=18),
        Finish("tool_calls"),
    ],
    "parallel_tool_calls_same_index_stream.json": [
        UpstreamMeta("chatcmpl-idx0"),
        ToolCallStart(0, "call_a", "get_weather"),
        ToolCallArgs(0, '{"city":"Oslo"}'),
        ToolCallStart(1, "call_b", "get_time"),
        ToolCallArgs(1, '{"tz":'),
        ToolCallArgs(1, '"CET"}'),
        Finish("tool_calls"),
    ],
    "transformers_serve_tool_calls_stream.json": [
        UpstreamMeta("req_0"),
        ToolCallStart(0, "req_0_tool_call", "get_weather"),
        ToolCallArgs(0, '{"city": '),
        ToolCallArgs(0, '"Paris"}'),
        ToolCallStart(1, "req_0_tool_call_1", "get_time"),
        ToolCallArgs(1, '{"tz": '),
        ToolCallArgs(1, '"CET"}'),
        report(input_tokens=61, output_tokens=40),
        Finish("tool_calls"),
    ],
    "transformers_serve_whole_tool_calls_stream.json": [
        UpstreamMeta("req_0"),
        ToolCallStart(0, "req_0_tool_call", "get_weather"),
        ToolCallArgs(0, '{"city": "Paris"}'),
        ToolCallStart(1, "req_0_tool_call_1", "get_weather"),
        ToolCallArgs(1, '{"city": "Rome"}'),
        report(input_tokens=61, output_tokens=40),
        Finish("tool_calls"),
    ],
    "transformers_serve_stream.json": [
        UpstreamMeta("chatcmpl-hf-1"),
        TextDelta("Hi"),
        TextDelta(" there"),
        report(input_tokens=7, output_tokens=2),
        Finish("stop"),
    ],
    "fastrun_cached_stream.json": [
        UpstreamMeta("cmpl-fr-81f2"),
        TextDelta("Sure"),
        TextDelta("."),
        report(input_tokens=176, output_tokens=50, cache_read_tokens=1024),
        Finish("stop"),
    ],
    "primalabs_reasoning_cached_stream.json": [
        UpstreamMeta("gen-pl-33aa"),
        ReasoningDelta("Hmm"),
        TextDelta("Yes"),
        report(input_tokens=36, output_tokens=50, reasoning_tokens=30, cache_read_tokens=64),
        Finish("stop"),
    ],
    "openrouter_cost_stream.json": [
        UpstreamMeta("gen-1767225600-AbCdEf"),
        TextDelta("Ok"),
        UsageReport(Usage(input_tokens=42, output_tokens=17), cost_usd=Decimal("0.000123456789012346")),
        Finish("stop"),
    ],
    "structured_output_stream.json": [
        UpstreamMeta("chatcmpl-json"),
        TextDelta('{"city": "Pa'),
        TextDelta('ris", "temp_c": 18}'),
        report(input_tokens=30, output_tokens=11),
        Finish("stop"),
    ],
    "no_usage_stream.json": [UpstreamMeta("chatcmpl-nousage"), TextDelta("Yo"), Finish("length")],
}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_stream_transcript_events(name: str, replay: Callable[[str], Replay]) -> None:
    result = replay(name)
    assert result.error is None
    assert result.events == STREAMS[name]


def test_structured_output_text_is_the_json(replay: Callable[[str], Replay]) -> None:
    text = "".join(e.text for e in replay("structured_output_stream.json").events if isinstance(e, TextDelta))
    assert msgspec.json.decode(text) == {"city": "Paris", "temp_c": 18}


def test_error_chunk_inside_200_stream(replay: Callable[[str], Replay]) -> None:
    result = replay("error_in_200_stream.json")
    assert result.events == [UpstreamMeta("chatcmpl-err"), TextDelta("Par")]
    error = result.error
    assert error is not None
    assert (error.kind, error.status, error.code, error.message) == (
        Failure.TRANSIENT,
        500,
        "InternalServerError",
        "upstream returned 500",
    )


def test_truncated_stream_raises(replay: Callable[[str], Replay]) -> None:
    result = replay("truncated_stream.json")
    assert result.events == [UpstreamMeta("chatcmpl-trunc"), TextDelta("Once"), TextDelta(" upon")]
    assert result.error is not None
    assert result.error.kind is Failure.TRANSIENT
    assert result.error.message == "upstream stream ended before a finish reason"


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> str:
    body: dict[str, Any] = {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}], **extra}
    return msgspec.json.encode(body).decode()


def feed(*payloads: str) -> list[Event]:
    parser = ChatStreamParser()
    events: list[Event] = []
    for payload in payloads:
        events.extend(parser.feed(payload))
    return events + parser.finish()


MADE_UP = re.compile(r"call_[0-9a-f]{24}")


def made_up(events: list[Event]) -> list[Event]:
    """`events` with each id the parser made up (`call_` and 24 random hex digits: unique across
    answers, as OpenAI's and Anthropic's are) checked and written `made-<key>`."""
    shown: list[Event] = []
    for event in events:
        if isinstance(event, ToolCallStart) and event.id.startswith("call_") and MADE_UP.fullmatch(event.id):
            event = ToolCallStart(event.key, f"made-{event.key}", event.name)
        shown.append(event)
    return shown


def call(
    index: int | None = None, call_id: str | None = None, name: str | None = None, args: str | None = None
) -> dict[str, Any]:
    delta: dict[str, Any] = {"function": {"name": name, "arguments": args}}
    if index is not None:
        delta["index"] = index
    if call_id is not None:
        delta["id"] = call_id
    return {"tool_calls": [delta]}


def test_arguments_before_name_are_buffered_and_id_generated() -> None:
    events = made_up(
        feed(
            chunk(call(0, args='{"a"')),
            chunk(call(0, name="f", args=":1}")),
            chunk(call(1, name="g")),
            chunk(finish="tool_calls"),
        )
    )
    assert events == [
        ToolCallStart(0, "made-0", "f"),
        ToolCallArgs(0, '{"a":1}'),
        ToolCallStart(1, "made-1", "g"),
        Finish("tool_calls"),
    ]


def test_late_id_is_adopted_and_fresh_ids_without_name_continue_the_call() -> None:
    events = feed(
        chunk(call(0, args="{")),
        chunk(call(0, "id-1", "f", '"x"')),
        chunk(call(0, "id-random-2", None, ":2}")),
        chunk(finish="stop"),
        "[DONE]",
    )
    assert events == [
        ToolCallStart(0, "id-1", "f"),
        ToolCallArgs(0, '{"x"'),
        ToolCallArgs(0, ":2}"),
        Finish("tool_calls"),
    ]


@pytest.mark.parametrize("same", ["same", ""])
def test_two_calls_one_id_stay_two_calls(same: str) -> None:
    """providers.md: accumulate by index (and id when present). A server that gives two calls one
    id (or an empty one) still sent two calls: at two indexes of a stream, or two entries of one
    list (a whole answer's, with no indexes). The second gets an id of its own: a client pairs
    each tool result with its call by id."""
    streamed = made_up(
        feed(
            chunk(call(0, same, "f", '{"a":')),
            chunk(call(1, same, "g", '{"b":')),
            chunk(call(1, args="2}")),
            chunk(call(0, same, None, "1}")),
            chunk(finish="tool_calls"),
            "[DONE]",
        )
    )
    first, second = ("same", "same_1") if same else ("made-0", "made-1")
    assert streamed == [
        ToolCallStart(0, first, "f"),
        ToolCallArgs(0, '{"a":'),
        ToolCallStart(1, second, "g"),
        ToolCallArgs(1, '{"b":'),
        ToolCallArgs(1, "2}"),
        ToolCallArgs(0, "1}"),
        Finish("tool_calls"),
    ]
    calls = [
        {"id": same, "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
        {"id": same, "type": "function", "function": {"name": "g", "arguments": '{"b":2}'}},
    ]
    whole = {"choices": [{"message": {"content": None, "tool_calls": calls}, "finish_reason": "tool_calls"}]}
    assert made_up(ChatStreamParser().parse_whole(msgspec.json.encode(whole))) == [
        ToolCallStart(0, first, "f"),
        ToolCallArgs(0, '{"a":1}'),
        ToolCallStart(1, second, "g"),
        ToolCallArgs(1, '{"b":2}'),
        Finish("tool_calls"),
    ]


def test_ids_made_unique_never_meet_an_id_the_upstream_sent() -> None:
    """`a_2, a, a` became `a_2, a, a_2`; an id made up for a call without one is random, so it
    meets neither an upstream's (`call_4`) nor one made up for another answer: an agent's history
    holds the calls of many answers, and a client pairs each result with its call by id."""
    events = feed(
        chunk(call(0, "a_2", "f", "{}")),
        chunk(call(1, "a", "f", "{}")),
        chunk(call(2, "a", "f", "{}")),
        chunk(call(3, "call_4", "f", "{}")),
        chunk(call(4, None, "f", "{}")),
        chunk(finish="tool_calls"),
    )
    ids = [event.id for event in events if isinstance(event, ToolCallStart)]
    assert ids[:4] == ["a_2", "a", "a_2_2", "call_4"]
    assert MADE_UP.fullmatch(ids[4])
    answers = [feed(chunk(call(0, None, "f", "{}")), chunk(finish="tool_calls")) for _ in range(2)]
    made = [event.id for answer in answers for event in answer if isinstance(event, ToolCallStart)]
    assert len(set(made)) == 2
    assert all(MADE_UP.fullmatch(made_id) for made_id in made)


def test_a_call_that_never_got_a_name_is_still_reported() -> None:
    events = feed(chunk(call(None, "c9", None, "{}")), chunk(finish="tool_calls"))
    assert events == [ToolCallStart(0, "c9", ""), ToolCallArgs(0, "{}"), Finish("tool_calls")]


def test_an_empty_finish_reason_closes_no_call() -> None:
    """`finish_reason: ""` on every chunk (SGLang 0.4, Ollama's first OpenAI layer) is no finish
    (`OpenAIStreamParser.apply`): a server that also repeats the id and name in every delta, as
    llama.cpp does, sent one call, not one per delta."""
    fragments = ['{"ci', 'ty":"Ber', 'lin"}']
    events = feed(*(chunk(call(0, "Xb2", "get_weather", args), "") for args in fragments), chunk(finish="tool_calls"))
    assert events == [
        ToolCallStart(0, "Xb2", "get_weather"),
        *(ToolCallArgs(0, args) for args in fragments),
        Finish("tool_calls"),
    ]


@pytest.mark.parametrize(
    "fragments",
    [
        ['{"a":'] * 1200 + ["1", "}" * 1200],  # a runaway model, its name in every delta (llama.cpp)
        ['{"a":' * 1200 + "1" + "}" * 1200, "{}"],  # then another call under the same id (transformers serve)
    ],
)
def test_arguments_nested_past_the_decoders_depth_are_no_failure(fragments: list[str]) -> None:
    """msgspec raises RecursionError for JSON nested a thousand deep: a 500, a bug's answer
    (`providers.openai_stream._UNREADABLE`), where the fold keeps such arguments raw."""
    events = feed(*(chunk(call(0, "Xb2", "f", args)) for args in fragments), chunk(finish="tool_calls"))
    assert events[0] == ToolCallStart(0, "Xb2", "f")
    assert events[-1] == Finish("tool_calls")


def test_long_arguments_are_not_decoded_again_at_every_delta(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a named delta starts another call reads the arguments so far as JSON; llama.cpp
    names every delta, and an argument of many objects (or of code, with its braces) has many
    deltas that begin one: decoded whole at each, 350 KB of arguments took 15 s of the loop."""
    decoded: list[int] = []
    decode = msgspec.json.decode

    def counted(data: Any, *args: Any, **kwargs: Any) -> Any:
        decoded.append(len(data))
        return decode(data, *args, **kwargs)

    monkeypatch.setattr(msgspec.json, "decode", counted)
    fragments = ['{"items": [', *(f for i in range(2000) for f in ('{"', f'n": {i}', "}", ", ")), "{}]}"]
    events = feed(*(chunk(call(0, "Xb2", "f", args)) for args in fragments), chunk(finish="tool_calls"))
    assert [event for event in events if isinstance(event, ToolCallStart)] == [ToolCallStart(0, "Xb2", "f")]
    assert sum(decoded) <= 4 * len("".join(fragments))


def test_keep_alive_and_empty_payloads_are_ignored() -> None:
    parser = ChatStreamParser()
    assert parser.feed("keep-alive") == []
    assert parser.feed("") == []
    assert parser.feed(b"  ") == []
    assert parser.feed(b' {"choices":[{"delta":{"content":"a"}}]}') == [TextDelta("a")]
    assert not parser.done


def test_malformed_json_chunk_raises() -> None:
    with pytest.raises(UpstreamError) as raised:
        ChatStreamParser().feed('{"choices": [')
    assert raised.value.kind is Failure.TRANSIENT


@pytest.mark.parametrize(
    ("payload", "kind", "status", "code"),
    [
        ('{"error":{"message":"boom","type":"server_error"}}', Failure.TRANSIENT, 502, "server_error"),
        (
            '{"error":{"message":"slow down","type":"rate_limit_error","code":429}}',
            Failure.CAPACITY,
            429,
            "rate_limit_error",
        ),
        ('{"error":{"message":"bad","code":400}}', Failure.CLIENT, 400, None),
        ('{"error":"plain text error"}', Failure.TRANSIENT, 502, None),
        (
            '{"object":"error","message":"flat","type":"BadRequestError","code":400}',
            Failure.CLIENT,
            400,
            "BadRequestError",
        ),
        ('{"error":{"code":"budget_exceeded"}}', Failure.QUOTA, 502, "budget_exceeded"),
    ],
)
def test_error_payload_shapes(payload: str, kind: Failure, status: int, code: str | None) -> None:
    parser = ChatStreamParser()
    parser.feed(chunk({"content": "x"}))
    with pytest.raises(UpstreamError) as raised:
        parser.feed(payload)
    assert (raised.value.kind, raised.value.status, raised.value.code) == (kind, status, code)


def test_done_and_finish() -> None:
    parser = ChatStreamParser()
    assert parser.feed(chunk({"content": "x"}, id="abc")) == [UpstreamMeta("abc"), TextDelta("x")]
    assert not parser.done
    assert parser.feed(chunk(finish="eos")) == []
    assert parser.done
    assert parser.feed("[DONE]") == [Finish("stop")]
    assert parser.finish() == []


def test_done_without_finish_reason_is_a_clean_stop() -> None:
    assert feed(chunk({"content": "x"}), "[DONE]") == [TextDelta("x"), Finish("stop")]


def test_done_with_no_chunk_before_it_is_no_answer() -> None:
    """A failure before any content (the request fails over), as a whole answer without choices
    is: not an empty answer with a `stop` the upstream never gave."""
    with pytest.raises(UpstreamError) as raised:
        ChatStreamParser().feed("[DONE]")
    assert (raised.value.kind, raised.value.status, raised.value.message) == (
        Failure.TRANSIENT,
        502,
        "upstream stream had no chunks",
    )


def test_meta_only_from_the_first_chunk_and_last_usage_wins() -> None:
    events = feed(
        chunk({"content": "a"}),
        chunk({"content": "b"}, id="late", usage={"prompt_tokens": 1, "completion_tokens": 1}),
        chunk(finish="stop", usage={"prompt_tokens": 4, "completion_tokens": 2}),
    )
    assert events == [TextDelta("a"), TextDelta("b"), report(input_tokens=4, output_tokens=2), Finish("stop")]


@pytest.mark.parametrize(
    ("reason", "normalised", "finish"),
    [
        ("stop", "stop", "stop"),
        ("length", "length", "length"),
        ("tool_calls", "tool_calls", "stop"),  # no call was returned: the answer stopped
        ("function_call", "tool_calls", "stop"),
        ("content_filter", "content_filter", "content_filter"),
        ("eos", "stop", "stop"),
        ("end_turn", "stop", "stop"),
    ],
)
def test_finish_reasons(reason: str, normalised: str, finish: str) -> None:
    assert normalise_finish(reason) == normalised
    assert feed(chunk({"content": "I will call it"}, finish=reason)) == [TextDelta("I will call it"), Finish(finish)]
    with_call = feed(chunk(call(0, "c1", "f", "{}")), chunk(finish=reason))
    assert with_call[-1] == Finish("tool_calls" if normalised == "stop" else normalised)


def test_abort_is_a_failure_not_a_finish() -> None:
    """vLLM's `abort`: the engine gave the request up; the text so far is truncated."""
    parser = ChatStreamParser()
    assert parser.feed(chunk({"content": "half"})) == [TextDelta("half")]
    assert parser.feed(chunk(finish="abort")) == []  # raised at the end: its usage may follow
    assert parser.feed(chunk({"content": "more"}, usage={"prompt_tokens": 4, "completion_tokens": 2})) == []
    with pytest.raises(UpstreamError) as failed:
        parser.feed("[DONE]")
    assert (failed.value.kind, failed.value.status, failed.value.answered) == (Failure.TRANSIENT, 502, True)
    assert parser.unreported() == [report(input_tokens=4, output_tokens=2)]  # billed: the ledger keeps it
    with pytest.raises(UpstreamError):
        ChatStreamParser().parse_whole(b'{"choices":[{"message":{"content":"half"},"finish_reason":"abort"}]}')


@pytest.mark.parametrize(
    "usage",
    [{}, {"completion_tokens": 10}, {"prompt_tokens": 4}, {"total_tokens": 14}, {"cost": 0.001}],
)
def test_a_usage_without_both_totals_is_no_report(usage: dict[str, Any]) -> None:
    assert feed(chunk({"content": "a"}, finish="stop", usage=usage)) == [TextDelta("a"), Finish("stop")]
    whole = msgspec.json.encode({"choices": [{"message": {"content": "a"}, "finish_reason": "stop"}], "usage": usage})
    assert ChatStreamParser().parse_whole(whole) == [TextDelta("a"), Finish("stop")]
    # nor does it replace an earlier report: the last *report* wins
    first = chunk({"content": "a"}, usage={"prompt_tokens": 4, "completion_tokens": 2})
    events = feed(first, chunk(usage=usage), "[DONE]")
    assert events == [TextDelta("a"), report(input_tokens=4, output_tokens=2), Finish("stop")]


NONSTREAM: dict[str, list[Event]] = {
    "nonstream_text.json": [
        UpstreamMeta("chatcmpl-ns1"),
        TextDelta("Hello there."),
        report(input_tokens=10, output_tokens=3),
        Finish("stop"),
    ],
    "nonstream_tool_calls.json": [
        UpstreamMeta("chatcmpl-ns2"),
        ToolCallStart(0, "call_x1", "get_weather"),
        ToolCallArgs(0, '{"city": "Paris"}'),
        ToolCallStart(1, "call_x2", "get_time"),
        ToolCallArgs(1, '{"tz": "CET"}'),
        report(input_tokens=80, output_tokens=30),
        Finish("tool_calls"),
    ],
    "nonstream_usage_details.json": [
        UpstreamMeta("resp-77"),
        ReasoningDelta("Deep thought."),
        TextDelta("42"),
        report(input_tokens=50, output_tokens=20, reasoning_tokens=100, cache_read_tokens=300, cache_write_tokens=150),
        Finish("stop"),
    ],
}


@pytest.mark.parametrize("name", sorted(NONSTREAM))
def test_whole_answers(name: str, transcript: Callable[[str], Any]) -> None:
    [body] = transcript(name).chunks
    assert ChatStreamParser().parse_whole(body.encode()) == NONSTREAM[name]


def test_whole_answer_with_object_arguments_and_no_ids() -> None:
    body = (
        b'{"choices":[{"message":{"role":"assistant","content":"","tool_calls":['
        b'{"function":{"name":"f","arguments":{"a":1}}}]},"finish_reason":"stop"}]}'
    )
    assert made_up(ChatStreamParser().parse_whole(body)) == [
        ToolCallStart(0, "made-0", "f"),
        ToolCallArgs(0, '{"a":1}'),
        Finish("tool_calls"),
    ]


MISTRAL_CONTENT = [
    {
        "type": "thinking",
        "thinking": [{"type": "text", "text": "The user greets; "}, {"type": "text", "text": "greet."}],
    },
    {"type": "text", "text": "Hello!"},
    {"type": "image_url", "image_url": "https://example.invalid/x.png"},  # nothing to relay
]


def test_content_as_a_list_of_parts_is_text_and_reasoning() -> None:
    """Mistral's reasoning models answer `content` as parts: a 502 (malformed) before."""
    body = {"choices": [{"message": {"role": "assistant", "content": MISTRAL_CONTENT}, "finish_reason": "stop"}]}
    expected = [ReasoningDelta("The user greets; greet."), TextDelta("Hello!"), Finish("stop")]
    assert ChatStreamParser().parse_whole(msgspec.json.encode(body)) == expected
    streamed = feed(
        chunk({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "The user greets; "}]}]}),
        chunk({"content": [{"type": "thinking", "thinking": "greet."}]}),
        chunk({"content": [{"type": "text", "text": "Hello!"}]}),
        chunk({"content": ""}, "stop"),
    )
    assert streamed == [
        ReasoningDelta("The user greets; "),
        ReasoningDelta("greet."),
        TextDelta("Hello!"),
        Finish("stop"),
    ]


@pytest.mark.parametrize(
    "body",
    [b"<html>bad gateway</html>", b'{"object":"chat.completion","choices":[]}', b'{"error":{"message":"x"}}'],
)
def test_whole_answer_failures(body: bytes) -> None:
    with pytest.raises(UpstreamError) as raised:
        ChatStreamParser().parse_whole(body)
    assert raised.value.kind is Failure.TRANSIENT


def request(**fields: Any) -> CompletionRequest:
    return msgspec.convert(fields, CompletionRequest)


def body_of(req: CompletionRequest, cfg: ProviderConfig, *, stream: bool = False) -> Any:
    return msgspec.json.decode(build_chat_body(req, "upstream/model-1", cfg, stream=stream))


LOCAL = ProviderConfig(name="local", kind="local", base_url="http://127.0.0.1:8000/v1", wire=KIND_DEFAULTS["local"])
FASTRUN = ProviderConfig(
    name="fastrun", kind="fastrun", base_url="http://127.0.0.1:9/v1", wire=KIND_DEFAULTS["fastrun"]
)


def test_api_example_request_body() -> None:
    req = request(
        model="gemma-4-31b",
        system="You are terse.",
        messages=[
            {"role": "user", "content": [{"kind": "text", "data": "Weather in Paris?"}]},
            {
                "role": "assistant",
                "content": [
                    {"kind": "thinking", "data": {"text": "Use the tool.", "signature": "sig"}},
                    {
                        "kind": "tool_call",
                        "data": {"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}},
                    },
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": [{"kind": "tool_result", "data": {"tool_call_id": "call_1", "content": "18C"}}],
            },
        ],
        tools=[{"name": "get_weather", "description": "Current weather", "parameters": {"type": "object"}}],
        tool_choice={"mode": "auto"},
        temperature=0.2,
        top_p=0.9,
        max_tokens=512,
        stop_sequences=["\n\n"],
        reasoning_effort="low",
        provider_options={"local": {"top_k": 40}, "fastrun": {"seed": 1}},
    )
    assert body_of(req, LOCAL, stream=True) == {
        "model": "upstream/model-1",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                        "type": "function",
                    }
                ],
                "reasoning_content": "Use the tool.",
            },
            {"role": "tool", "content": "18C", "tool_call_id": "call_1"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [
            {
                "function": {"name": "get_weather", "description": "Current weather", "parameters": {"type": "object"}},
                "type": "function",
            }
        ],
        "tool_choice": "auto",
        "stop": ["\n\n"],
        "max_tokens": 512,
        "reasoning_effort": "low",
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
    }


def test_hosted_body_drops_thinking_and_merges_its_own_options() -> None:
    req = request(
        messages=[
            {"role": "developer", "content": [{"kind": "text", "data": "Be nice."}]},
            {
                "role": "assistant",
                "content": [
                    {"kind": "thinking", "data": {"text": "hidden"}},
                    {"kind": "redacted_thinking", "data": {"text": "opaque", "redacted": True}},
                    {"kind": "text", "data": "Hi"},
                ],
            },
        ],
        provider_options={
            "fastrun": {"seed": 7, "model": "evil", "messages": [], "stream": True, "top_k": 5}
            # what bounds the answer's cost stays the request's own (access.md's budgets)
            | {"max_tokens": 10**6, "max_completion_tokens": 10**6, "max_new_tokens": 10**6, "n": 3}
            | {"best_of": 3, "n_predict": 10**6, "num_predict": 10**6}
        },
    )
    assert body_of(req, FASTRUN) == {
        "model": "upstream/model-1",
        "messages": [{"role": "system", "content": "Be nice."}, {"role": "assistant", "content": "Hi"}],
        "stream": False,
        "seed": 7,
        "top_k": 5,
    }


def test_wire_profile_switches() -> None:
    cfg = ProviderConfig(
        name="x",
        kind="openai_compatible",
        base_url="http://127.0.0.1:9/v1",
        wire=WireProfile(developer_role=True, stream_usage=False, max_completion_tokens=True),
    )
    req = request(
        messages=[{"role": "developer", "content": [{"kind": "text", "data": "a"}, {"kind": "text", "data": "b"}]}],
        max_tokens=64,
        tools=[{"name": "lookup"}],
        tool_choice={"mode": "named", "tool_name": "lookup"},
        schema={"type": "object", "properties": {"city": {"type": "string"}}},
    )
    assert body_of(req, cfg, stream=True) == {
        "model": "upstream/model-1",
        "messages": [{"role": "developer", "content": "a\nb"}],
        "stream": True,
        "tools": [{"type": "function", "function": {"name": "lookup"}}],
        "tool_choice": {"function": {"name": "lookup"}, "type": "function"},
        "response_format": {
            "json_schema": {
                "schema": {"type": "object", "properties": {"city": {"type": "string"}}},
                "name": "response",
                "strict": True,
            },
            "type": "json_schema",
        },
        "max_completion_tokens": 64,
    }


def test_media_parts() -> None:
    png = [0x89, 0x50, 0x4E, 0x47]
    req = request(
        messages=[
            {
                "role": "user",
                "name": "ann",
                "content": [
                    {"kind": "text", "data": "Look:"},
                    {"kind": "image", "data": {"url": "https://example.com/a.jpg", "detail": "low"}},
                    {"kind": "image", "data": {"data": png}},
                    {"kind": "image", "data": {"data": "/9j/4AAQ"}},
                    {"kind": "image", "data": {"data": "AAAA", "media_type": "image/gif"}},
                    {"kind": "audio", "data": {"data": "UklGRg==", "media_type": "audio/wav"}},
                    {"kind": "audio", "data": {"url": "data:audio/mpeg;base64,SUQz"}},
                    {"kind": "audio", "data": {"url": "https://example.com/a.mp3"}},
                    {"kind": "document", "data": {"data": "JVBERi0=", "file_name": "a.pdf"}},
                    {"kind": "document", "data": {"url": "https://example.com/b.pdf"}},
                ],
            }
        ]
    )
    [message] = body_of(req, LOCAL)["messages"]
    assert message == {
        "role": "user",
        "name": "ann",
        "content": [
            {"type": "text", "text": "Look:"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg", "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ"}},
            {"type": "image_url", "image_url": {"url": "data:image/gif;base64,AAAA"}},
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            {"type": "input_audio", "input_audio": {"data": "SUQz", "format": "mp3"}},
            {"type": "audio_url", "audio_url": {"url": "https://example.com/a.mp3"}},
            {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}},
            {"type": "file", "file": {"file_data": "https://example.com/b.pdf"}},
        ],
    }


def test_tool_results_become_tool_messages() -> None:
    req = request(
        messages=[
            {
                "role": "assistant",
                "content": [
                    {"kind": "text", "data": "Calling."},
                    {
                        "kind": "tool_call",
                        "data": {"id": "c1", "name": "f", "arguments": {"a": 1}, "raw_arguments": '{"a": 1 }'},
                    },
                    {"kind": "tool_call", "data": {"id": "c2", "name": "g"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"kind": "tool_result", "data": {"tool_call_id": "c1", "content": {"temp": 18}}},
                    {"kind": "tool_result", "data": {"tool_call_id": "c2", "content": None, "is_error": True}},
                    {"kind": "text", "data": "Now answer."},
                ],
            },
            {"role": "tool", "tool_call_id": "c3", "content": [{"kind": "text", "data": "plain"}]},
        ]
    )
    assert body_of(req, FASTRUN)["messages"] == [
        {
            "role": "assistant",
            "content": "Calling.",
            "tool_calls": [
                {"id": "c1", "function": {"name": "f", "arguments": '{"a": 1 }'}, "type": "function"},
                {"id": "c2", "function": {"name": "g", "arguments": "{}"}, "type": "function"},
            ],
        },
        {"role": "tool", "content": '{"temp":18}', "tool_call_id": "c1"},
        {"role": "tool", "content": "", "tool_call_id": "c2"},
        {"role": "user", "content": "Now answer."},
        {"role": "tool", "content": "plain", "tool_call_id": "c3"},
    ]


@pytest.mark.parametrize("tools", [None, []])
@pytest.mark.parametrize("mode", ["auto", "none"])
def test_no_tool_choice_without_tools(tools: list[Any] | None, mode: str) -> None:
    """A choice among no tools is a 400 at vLLM and OpenAI: it is not sent."""
    user = [{"role": "user", "content": [{"kind": "text", "data": "hi"}]}]
    req = request(messages=user, tools=tools, tool_choice={"mode": mode})
    assert "tool_choice" not in body_of(req, LOCAL)
    assert "tools" not in body_of(req, LOCAL)


def test_a_refusal_is_its_own_delta_and_a_content_filter_finish() -> None:
    """OpenAI's `refusal` (structured outputs): the reason is relayed (text at every door but OpenAI
    Chat's, which sends `refusal`), and the answer did not end cleanly — `content_filter`
    (Anthropic's door says `refusal`; OpenAI Chat's `stop`, as OpenAI), whole and streamed."""
    whole = {"choices": [{"message": {"content": None, "refusal": "I can't help."}, "finish_reason": "stop"}]}
    refused = ChatStreamParser().parse_whole(msgspec.json.encode(whole))
    assert refused == [RefusalDelta("I can't help."), Finish("content_filter")]
    streamed = feed(chunk({"refusal": "I can't"}), chunk({"refusal": " help."}), chunk(finish="stop"), "[DONE]")
    assert streamed == [RefusalDelta("I can't"), RefusalDelta(" help."), Finish("content_filter")]


def test_only_choice_0_is_the_answer_in_a_stream_as_in_a_whole_answer() -> None:
    """An upstream that streams a second choice (`n` is not asked for: a misbehaving one) had its
    deltas merged into the answer's text: `zeroone`, where the whole answer says `zero`."""
    second = msgspec.json.encode({"choices": [{"index": 1, "delta": {"content": "one"}, "finish_reason": None}]})
    both = msgspec.json.encode(
        {
            "choices": [
                {"index": 1, "delta": {"content": "ONE"}, "finish_reason": None},
                {"index": 0, "delta": {"content": "!"}, "finish_reason": None},
            ]
        }
    )
    events = feed(chunk({"content": "zero"}), second.decode(), both.decode(), chunk(finish="stop"))
    assert [event.text for event in events if isinstance(event, TextDelta)] == ["zero", "!"]
