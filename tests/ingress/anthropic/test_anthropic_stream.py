"""`POST /v1/messages` with `stream: true`: Anthropic's exact event sequence, block indexes over
thinking, text and tool_use blocks, usage in the additive convention, keep-alive pings, an
upstream failure after the start, and what the `anthropic` SDK's `messages.stream()` makes of it."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import anthropic
import pytest

from tests.ingress.anthropic.catalog import CATALOG, primary_cost, providers_for
from tests.support.client import Frames, parse_sse
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.replies import chunk, tool_delta, usage_chunk
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse

USER = {"role": "user", "content": "Weather in Paris?"}
NO_USAGE = {
    "input_tokens": 0,
    "output_tokens": 0,
    "cache_read_input_tokens": 0,
    "cache_creation_input_tokens": 0,
    "output_tokens_details": {"thinking_tokens": 0},
}


async def post_stream(gw: GatewayHandle, **extra: Any) -> tuple[str, Frames]:
    """A whole streamed answer (status 200) as (request id, frames); every frame's event name
    must equal its data's `type`."""
    payload = {"model": "claude-gateway", "max_tokens": 256, "stream": True, "messages": [USER], **extra}
    response = await gw.client.post("/v1/messages", json=payload, headers={"anthropic-version": "2023-06-01"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    frames = parse_sse(response.text)
    assert all(event == data["type"] for event, data in frames), frames
    return response.headers["x-request-id"], frames


def datas(frames: Frames) -> list[Any]:
    return [data for _, data in frames]


def start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, kind: str, **fields: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": kind, **fields}}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_start(request_id: str) -> dict[str, Any]:
    shell = {
        "type": "message",
        "id": request_id,
        "role": "assistant",
        "model": "chat-1",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": NO_USAGE,
        "cost_usd": None,
        "cost_source": None,
    }
    return {"type": "message_start", "message": shell}


def message_end(stop_reason: str, usage: dict[str, Any], cost: Decimal | None) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": usage,
            "cost_usd": cost,
            "cost_source": "estimated" if cost is not None else None,
        },
        {"type": "message_stop"},
    ]


def usage(input_tokens: int, output_tokens: int, thinking: int = 0, cache_read: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cache_read,
        "cache_creation_input_tokens": 0,
        "output_tokens_details": {"thinking_tokens": thinking},
    }


async def test_text_stream_exact_events(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(
        reply_sse(
            [
                chunk({"role": "assistant", "content": ""}),
                chunk({"content": "Hel"}),
                chunk({"content": 'lo "you"'}),
                chunk({}, "stop"),
                usage_chunk(9, 2),
            ]
        )
    )
    request_id, frames = await post_stream(gw)
    assert datas(frames) == [
        message_start(request_id),
        start(0, {"type": "text", "text": ""}),
        delta(0, "text_delta", text="Hel"),
        delta(0, "text_delta", text='lo "you"'),
        stop(0),
        *message_end("end_turn", usage(9, 2), primary_cost(9, 2)),
    ]
    assert primary.requests[0].json()["stream"] is True
    (row,) = await gw.ledger_rows()
    assert (row["request_id"], row["api"], row["streamed"], row["status"]) == (
        request_id,
        "anthropic_messages",
        True,
        "ok",
    )
    assert (row["input_tokens"], row["output_tokens"]) == (9, 2)


async def test_sdk_stream_thinking_then_text(
    gw: GatewayHandle, client: anthropic.AsyncAnthropic, primary: ReplayUpstream
) -> None:
    primary.enqueue("vllm_reasoning_stream")
    async with client.messages.stream(
        model="chat-1", max_tokens=4096, messages=[USER], thinking={"type": "enabled", "budget_tokens": 2048}
    ) as stream:
        blocks = [(e.type, e.index) for e in [event async for event in stream] if e.type.startswith("content_block")]
        final = await stream.get_final_message()
    assert blocks == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
    ]
    assert [block.model_dump(exclude_none=True) for block in final.content] == [
        {"type": "thinking", "thinking": "2 and 2 make 4.", "signature": ""},
        {"type": "text", "text": "4"},
    ]
    assert (final.stop_reason, final.stop_sequence, final.model) == ("end_turn", None, "chat-1")
    assert final.usage.model_dump(exclude_none=True) == usage(20, 15)
    assert primary.requests[0].json()["reasoning_effort"] == "low"
    (row,) = await gw.ledger_rows()
    assert (row["request_id"], row["api"]) == (final.id, "anthropic_messages")


@pytest.mark.parametrize(
    ("transcript", "buckets", "answer"),
    [
        # prompt 1200 of which 1024 cached; completion 50
        ("fastrun_cached_stream", (176, 50, 0, 1024), [{"type": "text", "text": "Sure."}]),
        # prompt 100 of which 64 cached; completion 80 of which 30 reasoning
        (
            "primalabs_reasoning_cached_stream",
            (36, 50, 30, 64),
            [{"type": "thinking", "thinking": "Hmm", "signature": ""}, {"type": "text", "text": "Yes"}],
        ),
    ],
)
async def test_usage_is_additive_with_cache_reads(
    gw: GatewayHandle,
    client: anthropic.AsyncAnthropic,
    primary: ReplayUpstream,
    transcript: str,
    buckets: tuple[int, int, int, int],
    answer: list[dict[str, Any]],
) -> None:
    input_tokens, output_tokens, reasoning, cache_read = buckets
    primary.enqueue(transcript)
    async with client.messages.stream(model="chat-1", max_tokens=256, messages=[USER]) as stream:
        final = await stream.get_final_message()
    assert [block.model_dump(exclude_none=True) for block in final.content] == answer
    assert final.usage.model_dump(exclude_none=True) == usage(
        input_tokens, output_tokens + reasoning, thinking=reasoning, cache_read=cache_read
    )
    (row,) = await gw.ledger_rows()
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_tokens"], row["cache_read_tokens"]) == buckets
    assert row["cache_write_tokens"] == 0
    cost = primary_cost(input_tokens, output_tokens, reasoning=reasoning, cache_read=cache_read)
    assert Decimal(row["cost_usd"]) == cost


async def test_text_then_tool_calls_count_block_indexes(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(
        reply_sse(
            [
                chunk({"content": "Checking."}),
                chunk(tool_delta(0, id="call_1", name="get_weather", args='{"city": ')),
                chunk(tool_delta(0, args='"Paris"}')),
                chunk(tool_delta(1, id="call_2", name="get_time", args='{"tz": "CET"}')),
                chunk({}, "tool_calls"),
                usage_chunk(50, 20),
            ]
        )
    )
    request_id, frames = await post_stream(gw)
    assert datas(frames) == [
        message_start(request_id),
        start(0, {"type": "text", "text": ""}),
        delta(0, "text_delta", text="Checking."),
        stop(0),
        start(1, {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}),
        delta(1, "input_json_delta", partial_json='{"city": '),
        delta(1, "input_json_delta", partial_json='"Paris"}'),
        stop(1),
        start(2, {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {}}),
        delta(2, "input_json_delta", partial_json='{"tz": "CET"}'),
        stop(2),
        *message_end("tool_use", usage(50, 20), primary_cost(50, 20)),
    ]


async def test_text_after_a_tool_call_closes_its_block(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(
        reply_sse(
            [
                chunk(tool_delta(0, id="call_1", name="get_time", args="{}")),
                chunk({"content": "Done."}),
                chunk({}, "tool_calls"),
                usage_chunk(30, 5),
            ]
        )
    )
    request_id, frames = await post_stream(gw)
    assert datas(frames) == [
        message_start(request_id),
        start(0, {"type": "tool_use", "id": "call_1", "name": "get_time", "input": {}}),
        delta(0, "input_json_delta", partial_json="{}"),
        stop(0),
        start(1, {"type": "text", "text": ""}),
        delta(1, "text_delta", text="Done."),
        stop(1),
        *message_end("tool_use", usage(30, 5), primary_cost(30, 5)),
    ]


async def test_interleaved_parallel_calls_never_overlap(
    gw: GatewayHandle, client: anthropic.AsyncAnthropic, primary: ReplayUpstream
) -> None:
    primary.enqueue("vllm_parallel_tool_calls_stream", repeat=2)
    request_id, frames = await post_stream(gw)
    call = {"type": "tool_use", "name": "get_weather", "input": {}}
    assert datas(frames) == [
        message_start(request_id),
        start(0, {**call, "id": "call_paris"}),
        delta(0, "input_json_delta", partial_json='{"city":"Paris"}'),
        stop(0),
        start(1, {**call, "id": "call_tokyo"}),  # it started while call 0 was open: sent whole
        delta(1, "input_json_delta", partial_json='{"city":"Tokyo"}'),
        stop(1),
        *message_end("tool_use", usage(200, 40), primary_cost(200, 40)),
    ]
    async with client.messages.stream(model="chat-1", max_tokens=256, messages=[USER]) as stream:
        final = await stream.get_final_message()
    assert [block.model_dump(exclude_none=True) for block in final.content] == [
        {**call, "id": "call_paris", "input": {"city": "Paris"}},
        {**call, "id": "call_tokyo", "input": {"city": "Tokyo"}},
    ]
    assert final.stop_reason == "tool_use"


async def test_sdk_stream_tool_use(client: anthropic.AsyncAnthropic, primary: ReplayUpstream) -> None:
    primary.enqueue("vllm_tool_call_stream")
    tools: list[Any] = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    async with client.messages.stream(model="chat-1", max_tokens=256, messages=[USER], tools=tools) as stream:
        final = await stream.get_final_message()
    assert [block.model_dump(exclude_none=True) for block in final.content] == [
        {"type": "tool_use", "id": "chatcmpl-tool-9a8b7c", "name": "get_weather", "input": {"city": "Paris"}}
    ]
    assert final.stop_reason == "tool_use"


async def test_upstream_without_usage_reports_zeros_and_no_cost(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue("no_usage_stream")
    _, frames = await post_stream(gw)
    assert datas(frames)[-2:] == message_end("max_tokens", NO_USAGE, None)
    (row,) = await gw.ledger_rows()
    assert (row["input_tokens"], row["output_tokens"], row["cost_usd"]) == (None, None, None)


async def test_failure_after_start_is_an_error_event(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue("error_in_200_stream")
    request_id, frames = await post_stream(gw)
    error = frames[-1][1]
    assert datas(frames) == [
        message_start(request_id),
        start(0, {"type": "text", "text": ""}),
        delta(0, "text_delta", text="Par"),
        stop(0),
        {"type": "error", "error": {"type": "api_error", "message": error["error"]["message"]}},
    ]
    assert error["error"]["message"].startswith("the upstream failed mid-answer")
    (row,) = await gw.ledger_rows()
    assert (row["api"], row["status"], row["error_status"]) == ("anthropic_messages", "error", 502)


async def test_sdk_raises_on_an_error_after_start(client: anthropic.AsyncAnthropic, primary: ReplayUpstream) -> None:
    primary.enqueue(
        reply_sse([chunk({"content": "Partial"}), {"error": {"message": "engine crashed", "type": "x", "code": 500}}])
    )
    texts: list[str] = []

    async def read() -> None:
        async with client.messages.stream(model="chat-1", max_tokens=256, messages=[USER]) as stream:
            async for text in stream.text_stream:
                texts.append(text)

    with pytest.raises(anthropic.APIStatusError) as caught:
        await read()
    assert texts == ["Partial"]
    assert caught.value.type == "api_error"
    assert caught.value.body == {"type": "error", "error": {"type": "api_error", "message": caught.value.api_message}}


async def test_keepalive_ping_before_first_token(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    gw = await start_gateway(
        providers=providers_for(primary, secondary), catalog=CATALOG, server={"sse_keepalive_s": 0.2}
    )
    primary.enqueue(reply_sse([chunk({"content": "late"}), chunk({}, "stop")], first_byte_delay_s=0.5))
    response = await gw.client.post("/v1/messages", json={"max_tokens": 8, "stream": True, "messages": [USER]})
    frames = parse_sse(response.text)
    assert [event for event, _ in frames[:2]] == ["message_start", "ping"]  # as Anthropic opens a stream
    events = [event for event, _ in frames if event != "ping"]
    assert events == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


async def test_arguments_that_are_not_an_object_stream_as_the_json_answer_has_them(
    gw: GatewayHandle, client: anthropic.AsyncAnthropic, primary: ReplayUpstream
) -> None:
    """A tool's `input` is an object: the JSON answer gives `{}` for arguments that are not one,
    and the stream did not (`[1, 2]` went out as `partial_json`, and the SDK's final message had
    a list for `input`). A live call's blank start is held until its first character decides; a
    call sent whole is sent with its arguments only when they are an object."""
    answer = [
        chunk(tool_delta(0, id="call_1", name="first", args=" ")),
        chunk(tool_delta(0, args=" [1, ")),
        chunk(tool_delta(1, id="call_2", name="second", args='"x"')),  # waits: call 0's block is open
        chunk(tool_delta(0, args="2]")),
        chunk(tool_delta(2, id="call_3", name="third", args='{"a": 1}')),  # waits too, an object
        chunk({}, "tool_calls"),
        usage_chunk(30, 5),
    ]
    primary.enqueue(reply_sse(answer), repeat=2)
    calls = [("call_1", "first", " [1, 2]"), ("call_2", "second", '"x"'), ("call_3", "third", '{"a": 1}')]
    message = {
        "role": "assistant",
        "tool_calls": [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls],
    }
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
    primary.enqueue(
        reply_json(200, {"id": "r", "choices": [choice], "usage": {"prompt_tokens": 30, "completion_tokens": 5}})
    )
    request_id, frames = await post_stream(gw)
    call = {"type": "tool_use", "input": {}}
    assert datas(frames) == [
        message_start(request_id),
        start(0, {**call, "id": "call_1", "name": "first"}),
        stop(0),
        start(1, {**call, "id": "call_2", "name": "second"}),
        stop(1),
        start(2, {**call, "id": "call_3", "name": "third"}),
        delta(2, "input_json_delta", partial_json='{"a": 1}'),
        stop(2),
        *message_end("tool_use", usage(30, 5), primary_cost(30, 5)),
    ]
    async with client.messages.stream(model="chat-1", max_tokens=256, messages=[USER]) as stream:
        streamed = await stream.get_final_message()
    whole = await client.messages.create(model="chat-1", max_tokens=256, messages=[USER])
    inputs = [{}, {}, {"a": 1}]
    assert [block.input for block in streamed.content] == [block.input for block in whole.content] == inputs  # type: ignore[union-attr]


async def test_arguments_that_stop_being_json_stop_streaming_and_the_sdk_reads_the_rest(
    gw: GatewayHandle, client: anthropic.AsyncAnthropic, primary: ReplayUpstream
) -> None:
    """Small models write Python for JSON (`{'q': …}`, `True`, trailing commas). The SDK parses a
    call's fragments after every delta and failed the whole stream (`ValueError: Unable to parse
    tool parameter JSON`). A call now streams only while its arguments can still begin a JSON
    object; after the first fragment that breaks it, nothing more of that call is sent, and the
    SDK's `input` is what the fragments sent hold."""
    cases = [  # (the upstream's fragments, the fragments sent, the SDK's final `input`)
        (["{'q': ", "'x'}"], [], {}),
        (['{"q": "x", ', '"on": True}'], ['{"q": "x", '], {"q": "x"}),
        (['{"q": [1,', "]}"], ['{"q": [1,'], {"q": [1]}),
    ]
    for fragments, sent, sdk_input in cases:
        deltas = [tool_delta(0, id="c1", name="get", args=fragments[0])] + [
            tool_delta(0, args=f) for f in fragments[1:]
        ]
        primary.enqueue(reply_sse([*map(chunk, deltas), chunk({}, "tool_calls"), usage_chunk(3, 2)]), repeat=2)
        _, frames = await post_stream(gw)
        assert [d["delta"]["partial_json"] for d in datas(frames) if d["type"] == "content_block_delta"] == sent
        async with client.messages.stream(model="chat-1", max_tokens=64, messages=[USER]) as stream:
            message = await stream.get_final_message()
        assert (message.stop_reason, message.content[0].input) == ("tool_use", sdk_input)  # type: ignore[union-attr]
