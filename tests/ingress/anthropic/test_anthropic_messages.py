"""`POST /v1/messages` answered as JSON, through the real `anthropic` SDK: the exact message, what
the upstream (an OpenAI-style server) was sent, a tool-use round trip, thinking, ledger rows."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Any

import anthropic
import pytest

from tests.ingress.anthropic.catalog import primary_cost
from tests.support.gateway import GatewayHandle
from tests.support.replies import answer, stream_answer
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse

USER = {"role": "user", "content": "Weather in Paris?"}
TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "Current weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    {"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}},
]


def upstream_answer(message: dict[str, Any], finish: str, usage: dict[str, Any]) -> Any:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
    return reply_json(200, {"id": "chatcmpl-a1", "object": "chat.completion", "choices": [choice], "usage": usage})


def exact(raw: Any) -> Any:
    """The response body as JSON, numbers as Decimals (so `cost_usd` is compared exactly)."""
    return json.loads(raw.http_response.text, parse_float=Decimal)


async def test_text_with_thinking_exact_message_and_upstream_request(
    gw: GatewayHandle, client: anthropic.AsyncAnthropic, primary: ReplayUpstream
) -> None:
    usage = {
        "prompt_tokens": 1200,
        "completion_tokens": 50,
        "prompt_tokens_details": {"cached_tokens": 1024},
        "completion_tokens_details": {"reasoning_tokens": 20},
    }
    primary.enqueue(upstream_answer({"reasoning_content": "Sunny, say so.", "content": "Il fait beau."}, "stop", usage))
    raw = await client.messages.with_raw_response.create(
        model="claude-gateway",
        max_tokens=6000,
        system=[{"type": "text", "text": "Be terse."}, {"type": "text", "text": "Answer in French."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}],
        stop_sequences=["\n\n"],
        metadata={"user_id": "u-42"},
        thinking={"type": "enabled", "budget_tokens": 5000},
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 40, "unknown_field": {"ignored": True}},
        extra_headers={"anthropic-beta": "whatever-2025-01-01"},
    )
    request_id = raw.headers["x-request-id"]
    assert exact(raw) == {
        "type": "message",
        "id": request_id,
        "role": "assistant",
        "model": "chat-1",
        "content": [
            {"type": "thinking", "thinking": "Sunny, say so.", "signature": ""},
            {"type": "text", "text": "Il fait beau."},
        ],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 176,
            "output_tokens": 50,
            "cache_read_input_tokens": 1024,
            "cache_creation_input_tokens": 0,
            "output_tokens_details": {"thinking_tokens": 20},
        },
        "cost_usd": primary_cost(176, 30, reasoning=20, cache_read=1024),
        "cost_source": "estimated",
    }
    message = await raw.parse()
    assert message.id == request_id
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (176, 50)
    assert message.usage.cache_read_input_tokens == 1024
    assert message.model_extra == {"cost_usd": float(primary_cost(176, 30, 20, 1024)), "cost_source": "estimated"}

    (sent,) = primary.requests
    assert sent.json() == {
        "model": "org/chat-1-instruct",
        "messages": [
            {"role": "system", "content": "Be terse.\nAnswer in French."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        "stream": False,
        "stop": ["\n\n"],
        "max_tokens": 6000,
        "reasoning_effort": "medium",
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "user": "u-42",
    }
    (row,) = await gw.ledger_rows()
    assert (row["request_id"], row["api"], row["status"], row["streamed"]) == (
        request_id,
        "anthropic_messages",
        "ok",
        False,
    )
    buckets = [row[f"{b}_tokens"] for b in ("input", "output", "reasoning", "cache_read", "cache_write")]
    assert buckets == [176, 30, 20, 1024, 0]
    assert Decimal(row["cost_usd"]) == primary_cost(176, 30, reasoning=20, cache_read=1024)


@pytest.mark.parametrize(
    ("budget", "effort"), [(1024, "low"), (4095, "low"), (4096, "medium"), (16383, "medium"), (16384, "high")]
)
async def test_thinking_budget_maps_to_reasoning_effort(
    client: anthropic.AsyncAnthropic, primary: ReplayUpstream, budget: int, effort: str
) -> None:
    primary.enqueue(answer("ok"))
    await client.messages.create(
        model="chat-1", max_tokens=20000, messages=[USER], thinking={"type": "enabled", "budget_tokens": budget}
    )
    assert primary.requests[0].json()["reasoning_effort"] == effort


async def test_thinking_disabled_sends_no_effort_and_output_config_effort_wins(
    client: anthropic.AsyncAnthropic, primary: ReplayUpstream
) -> None:
    primary.enqueue(answer("ok"), repeat=2)
    await client.messages.create(model="chat-1", max_tokens=64, messages=[USER], thinking={"type": "disabled"})
    await client.messages.create(
        model="chat-1",
        max_tokens=9000,
        messages=[USER],
        thinking={"type": "enabled", "budget_tokens": 8000},
        output_config={"effort": "xhigh"},
    )
    first, second = (request.json() for request in primary.requests)
    assert "reasoning_effort" not in first
    assert second["reasoning_effort"] == "xhigh"


async def test_the_structured_outputs_betas_output_format_is_the_schema_as_output_config_format_is(
    client: anthropic.AsyncAnthropic, primary: ReplayUpstream
) -> None:
    """The beta's top-level `output_format` was dropped: the client asking for JSON got free text."""
    primary.enqueue(answer('{"city": "Paris"}'), repeat=3)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    other = {"type": "object", "properties": {"tz": {"type": "string"}}}
    beta = {"type": "json_schema", "schema": schema}
    await client.messages.create(model="chat-1", max_tokens=64, messages=[USER], extra_body={"output_format": beta})
    await client.messages.create(
        model="chat-1",
        max_tokens=64,
        messages=[USER],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    await client.messages.create(  # both: output_config's, where the format lives now
        model="chat-1",
        max_tokens=64,
        messages=[USER],
        output_config={"format": {"type": "json_schema", "schema": other}},
        extra_body={"output_format": beta},
    )
    sent = [request.json()["response_format"] for request in primary.requests]
    assert (
        sent[0]
        == sent[1]
        == {"type": "json_schema", "json_schema": {"name": "response", "schema": schema, "strict": True}}
    )
    assert sent[2] == {"type": "json_schema", "json_schema": {"name": "response", "schema": other, "strict": True}}


async def test_tool_use_round_trip(
    gw: GatewayHandle, client: anthropic.AsyncAnthropic, primary: ReplayUpstream
) -> None:
    primary.enqueue("nonstream_tool_calls")
    message = await client.messages.create(
        model="chat-1", max_tokens=256, messages=[USER], tools=TOOLS, tool_choice={"type": "any"}
    )
    assert message.stop_reason == "tool_use"
    assert [block.model_dump(exclude_none=True) for block in message.content] == [
        {"type": "tool_use", "id": "call_x1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_x2", "name": "get_time", "input": {"tz": "CET"}},
    ]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (80, 30)
    first = primary.requests[0].json()
    assert first["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "get_time",
                "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
            },
        },
    ]
    assert first["tool_choice"] == "required"

    primary.enqueue(
        upstream_answer({"content": "18C at 14:00."}, "stop", {"prompt_tokens": 120, "completion_tokens": 6})
    )
    results: list[Any] = [
        {"type": "tool_result", "tool_use_id": "call_x1", "content": "18C"},
        {"type": "tool_result", "tool_use_id": "call_x2", "content": [{"type": "text", "text": "14:00"}]},
    ]
    history: list[Any] = [USER, {"role": "assistant", "content": message.content}, {"role": "user", "content": results}]
    final = await client.messages.create(model="chat-1", max_tokens=256, messages=history, tools=TOOLS)
    assert [block.model_dump(exclude_none=True) for block in final.content] == [
        {"type": "text", "text": "18C at 14:00."}
    ]
    assert final.stop_reason == "end_turn"
    assert primary.requests[1].json()["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_x1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {"id": "call_x2", "type": "function", "function": {"name": "get_time", "arguments": '{"tz":"CET"}'}},
            ],
        },
        {"role": "tool", "content": "18C", "tool_call_id": "call_x1"},
        {"role": "tool", "content": "14:00", "tool_call_id": "call_x2"},
    ]
    rows = await gw.ledger_rows()
    assert [(r["api"], r["stop_reason"], r["input_tokens"], r["output_tokens"]) for r in rows] == [
        ("anthropic_messages", "tool_calls", 80, 30),
        ("anthropic_messages", "end_turn", 120, 6),
    ]


@pytest.mark.parametrize(
    ("tool_choice", "wire_choice", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
        ({"type": "tool", "name": "get_time"}, {"type": "function", "function": {"name": "get_time"}}, None),
        ({"type": "none"}, "none", None),
    ],
)
async def test_tool_choice_mapping(
    client: anthropic.AsyncAnthropic, primary: ReplayUpstream, tool_choice: Any, wire_choice: Any, parallel: Any
) -> None:
    primary.enqueue(answer("ok"))
    await client.messages.create(model="chat-1", max_tokens=64, messages=[USER], tools=TOOLS, tool_choice=tool_choice)
    sent = primary.requests[0].json()
    assert sent["tool_choice"] == wire_choice
    assert sent.get("parallel_tool_calls") == parallel


async def test_media_blocks_and_thinking_history(client: anthropic.AsyncAnthropic, primary: ReplayUpstream) -> None:
    primary.enqueue(answer("a cat"))
    png = "iVBORw0KGgoAAAANSUhEUg=="
    messages: list[Any] = [
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Greet back.", "signature": "sig-1"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Hello."},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
                {"type": "image", "source": {"type": "url", "url": "https://example.test/cat.jpg"}},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Notes."}},
                {"type": "text", "text": "What is this?"},
            ],
        },
    ]
    message = await client.messages.create(model="vision-1", max_tokens=64, messages=messages)
    assert message.model == "vision-1"
    assert primary.requests[0].json()["messages"] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                {"type": "image_url", "image_url": {"url": "https://example.test/cat.jpg"}},
                {"type": "text", "text": "Notes."},
                {"type": "text", "text": "What is this?"},
            ],
        },
    ]


async def test_a_tool_results_images_and_documents_follow_the_tool_messages(
    client: anthropic.AsyncAnthropic, primary: ReplayUpstream
) -> None:
    """A screenshot tool's result: Anthropic takes images and documents inside a `tool_result`, an
    OpenAI-style `tool` message only text. The text goes on as the tool message; the media, in the
    user message right after it (with the user's own blocks first). They were a 400."""
    primary.enqueue(answer("A login page."))
    png = "iVBORw0KGgoAAAANSUhEUg=="
    screenshot = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}}
    messages: list[Any] = [
        {"role": "user", "content": "Open the site."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "browse", "input": {}}]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "seen:"}, screenshot, pdf],
                },
                {"type": "text", "text": "What is on it?"},
            ],
        },
    ]
    message = await client.messages.create(model="vision-1", max_tokens=64, messages=messages)
    assert message.content[0].text == "A login page."  # type: ignore[union-attr]
    assert primary.requests[0].json()["messages"][2:] == [
        {"role": "tool", "content": "seen:", "tool_call_id": "t1"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is on it?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0x"}},
            ],
        },
    ]


@pytest.mark.parametrize("empty", ["", []])
async def test_an_empty_last_assistant_message_is_left_out(
    client: anthropic.AsyncAnthropic, primary: ReplayUpstream, empty: Any
) -> None:
    """Anthropic lets the last message be an empty assistant turn (a prefill of nothing); it was a
    400 (`[]`) or an empty assistant message sent upstream (`""`)."""
    primary.enqueue(answer("ok"))
    messages: list[Any] = [USER, {"role": "assistant", "content": empty}]
    message = await client.messages.create(model="chat-1", max_tokens=16, messages=messages)
    assert message.content[0].text == "ok"  # type: ignore[union-attr]
    assert primary.requests[0].json()["messages"] == [{"role": "user", "content": "Weather in Paris?"}]


async def test_sync_client(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(answer("hello"))

    def call() -> anthropic.types.Message:
        with anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0) as sdk:
            return sdk.messages.create(model="chat-1", max_tokens=16, messages=[{"role": "user", "content": "hi"}])

    message = await asyncio.to_thread(call)  # the gateway runs on this test's event loop
    assert [block.model_dump(exclude_none=True) for block in message.content] == [{"type": "text", "text": "hello"}]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (3, 1)
    (row,) = await gw.ledger_rows()
    assert (row["request_id"], row["api"]) == (message.id, "anthropic_messages")


async def test_a_stop_sequence_the_upstream_names_is_reported(
    client: anthropic.AsyncAnthropic, gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """vLLM names the stop string it met (`stop_reason`), SGLang too (`matched_stop`): then the
    answer stopped on a stop sequence, whole and streamed. Without one, `end_turn` (no guess)."""
    usage = {"prompt_tokens": 5, "completion_tokens": 2}
    vllm = {"index": 0, "message": {"content": "Paris"}, "finish_reason": "stop", "stop_reason": "END"}
    primary.enqueue(reply_json(200, {"id": "a", "choices": [vllm], "usage": usage}))
    sglang = [
        {"id": "b", "choices": [{"index": 0, "delta": {"content": "Paris"}}]},
        {"id": "b", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "matched_stop": "END"}]},
        {"id": "b", "choices": [], "usage": usage},
    ]
    primary.enqueue(reply_sse(sglang))
    eos = {"index": 0, "message": {"content": "Paris"}, "finish_reason": "stop", "stop_reason": 128001}  # a token id
    primary.enqueue(reply_json(200, {"id": "c", "choices": [eos], "usage": usage}))
    ask = {"model": "chat-1", "max_tokens": 16, "messages": [USER], "stop_sequences": ["END"]}

    whole = await client.messages.create(**ask)
    async with client.messages.stream(**ask) as stream:
        streamed = await stream.get_final_message()
    token = await client.messages.create(**ask)

    assert (whole.stop_reason, whole.stop_sequence) == ("stop_sequence", "END")
    assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", "END")
    assert (token.stop_reason, token.stop_sequence) == ("end_turn", None)
    rows = await gw.ledger_rows()
    assert [row["stop_reason"] for row in rows] == ["end_turn", "end_turn", "end_turn"]


async def test_the_sdk_sees_the_request_id(client: anthropic.AsyncAnthropic, primary: ReplayUpstream) -> None:
    """Anthropic's own `request-id` header beside `x-request-id`: the SDK's `_request_id` (and an
    error's `request_id`) are the gateway's request id, whole, streamed and refused."""
    primary.enqueue(answer("hello"))
    primary.enqueue(stream_answer("hello"))
    ask = {"model": "chat-1", "max_tokens": 16, "messages": [USER]}
    message = await client.messages.create(**ask)
    assert message._request_id == message.id
    async with client.messages.stream(**ask) as stream:
        streamed = await stream.get_final_message()
        assert stream.request_id == streamed.id
    with pytest.raises(anthropic.BadRequestError) as refused:
        await client.messages.create(model="no-such-model", max_tokens=16, messages=[USER])
    assert refused.value.request_id is not None
    assert refused.value.request_id == refused.value.response.headers["x-request-id"]
