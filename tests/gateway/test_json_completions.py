"""Non-streaming completions through HTTP: the exact response, the upstream body, usage, cost, ledger."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Any

from tests.gateway.conftest import primary_cost
from tests.support.catalog import catalog_toml, model
from tests.support.client import post, user
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.ports import free_port
from tests.support.upstream import ReplayUpstream, Reply, reply_json, reply_sse

ALONE = catalog_toml(model("solo-1", ("alone", "org/solo"), default=True))


def chat_response(message: dict[str, Any], finish: str, usage: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-up-1",
        "object": "chat.completion",
        "created": 1764460800,
        "model": "org/chat-1-instruct",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


async def test_text_completion_exact_response_and_ledger(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(
        reply_json(200, chat_response({"content": "Paris."}, "stop", {"prompt_tokens": 12, "completion_tokens": 3}))
    )
    response = await post(gw, {"model": "chat", "messages": [user("Capital of France?")]})

    assert response.status_code == 200
    body = response.json(parse_float=Decimal)
    request_id = body.pop("id")
    assert response.headers["x-request-id"] == request_id
    assert request_id[14] == "7"  # UUIDv7
    assert body == {
        "model": "chat-1",
        "provider": "primary",
        "message": {"role": "assistant", "content": [{"kind": "text", "data": "Paris."}]},
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 12,
            "output_tokens": 3,
            "reasoning_tokens": 0,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
        },
        "output": None,
        "cost_usd": primary_cost(12, 3),
        "cost_source": "estimated",
    }
    assert body["cost_usd"] == Decimal("0.0000024")

    (row,) = await gw.ledger_rows()
    assert row["request_id"] == request_id
    assert (row["model"], row["provider"], row["upstream_model"]) == ("chat-1", "primary", "org/chat-1-instruct")
    assert (row["status"], row["streamed"], row["attempts"], row["stop_reason"]) == ("ok", False, 1, "end_turn")
    assert row["upstream_request_id"] == "chatcmpl-up-1"
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_tokens"]) == (12, 3, 0)
    assert (row["cache_read_tokens"], row["cache_write_tokens"]) == (0, 0)
    assert Decimal(row["cost_usd"]) == Decimal("0.0000024")
    assert row["cost_source"] == "estimated"
    assert row["price_id"] is not None
    assert row["error_type"] is None


async def test_upstream_body_is_the_mapped_request(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(reply_json(200, chat_response({"content": "ok"}, "stop", None)))
    request = {
        "model": "chat-1",
        "system": "Be terse.",
        "messages": [
            user("Weather in Paris?"),
            {
                "role": "assistant",
                "content": [
                    {"kind": "thinking", "data": {"text": "need a tool", "signature": None, "redacted": False}},
                    {
                        "kind": "tool_call",
                        "data": {
                            "id": "call_1",
                            "name": "get_weather",
                            "type": "function",
                            "arguments": {"city": "Paris"},
                        },
                    },
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": [
                    {"kind": "tool_result", "data": {"tool_call_id": "call_1", "content": {"c": 18}, "is_error": False}}
                ],
            },
        ],
        "tools": [{"name": "get_weather", "description": "Current weather", "parameters": {"type": "object"}}],
        "tool_choice": {"mode": "named", "tool_name": "get_weather"},
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 64,
        "stop_sequences": ["\n\n"],
        "reasoning_effort": "low",
        "provider_options": {"primary": {"top_k": 40}},
        "some_client_internal_field": {"ignored": True},
    }
    response = await post(gw, request)
    assert response.status_code == 200, response.text

    (received,) = primary.requests
    assert received.path == "/v1/chat/completions"
    sent = received.json()
    assert sent["model"] == "org/chat-1-instruct"
    assert sent["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "need a tool",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"c":18}'},
    ]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Current weather", "parameters": {"type": "object"}},
        }
    ]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (0.2, 0.9, 64)
    assert sent["stop"] == ["\n\n"]
    assert sent["reasoning_effort"] == "low"
    assert sent["top_k"] == 40
    assert sent["stream"] is False
    assert "some_client_internal_field" not in sent


async def test_tool_calls_response(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{not json"}},
    ]
    primary.enqueue(
        reply_json(
            200,
            chat_response(
                {"content": None, "tool_calls": calls}, "stop", {"prompt_tokens": 30, "completion_tokens": 20}
            ),
        )
    )
    response = await post(gw, {"messages": [user("Weather and time in Paris?")]})
    body = response.json()
    assert body["model"] == "chat-1"  # the default model
    assert body["stop_reason"] == "tool_calls"  # tool calls win over the upstream's "stop"
    assert body["message"]["content"] == [
        {
            "kind": "tool_call",
            "data": {
                "id": "call_a",
                "name": "get_weather",
                "arguments": {"city": "Paris"},
                "type": "function",
                "raw_arguments": '{"city":"Paris"}',
            },
        },
        {
            "kind": "tool_call",
            "data": {
                "id": "call_b",
                "name": "get_time",
                "arguments": {},
                "type": "function",
                "raw_arguments": "{not json",
            },
        },
    ]


async def test_five_buckets_with_cache_and_reasoning(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    usage = {
        "prompt_tokens": 1000,
        "completion_tokens": 300,
        "prompt_tokens_details": {"cached_tokens": 200},
        "completion_tokens_details": {"reasoning_tokens": 100},
    }
    message = {"content": "Done.", "reasoning_content": "Thinking hard."}
    primary.enqueue(reply_json(200, chat_response(message, "stop", usage)))
    body = (await post(gw, {"model": "chat-1", "messages": [user("x")]})).json(parse_float=Decimal)
    assert body["usage"] == {
        "input_tokens": 800,
        "output_tokens": 200,
        "reasoning_tokens": 100,
        "cache_read_tokens": 200,
        "cache_write_tokens": 0,
    }
    assert body["message"]["content"] == [
        {"kind": "thinking", "data": {"text": "Thinking hard.", "signature": None, "redacted": False}},
        {"kind": "text", "data": "Done."},
    ]
    # 800·0.10 + 200·0.025 + (200 + 100 reasoning at the output rate)·0.40, per million
    assert body["cost_usd"] == Decimal("0.000205") == primary_cost(800, 200, reasoning=100, cache_read=200)
    (row,) = await gw.ledger_rows()
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_tokens"], row["cache_read_tokens"]) == (
        800,
        200,
        100,
        200,
    )
    assert Decimal(row["cost_usd"]) == Decimal("0.000205")


async def test_missing_usage_is_unknown_not_zero(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(reply_json(200, chat_response({"content": "hi"}, "length", None)))
    body = (await post(gw, {"model": "chat-1", "messages": [user("x")]})).json()
    assert body["usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "reasoning_tokens": 0,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }
    assert body["stop_reason"] == "max_tokens"
    assert body["cost_usd"] is None
    assert body["cost_source"] is None
    (row,) = await gw.ledger_rows()
    assert [row[k] for k in ("input_tokens", "output_tokens", "reasoning_tokens", "cache_read_tokens")] == [None] * 4
    assert row["cost_usd"] is None
    assert row["cost_source"] is None


async def test_authoritative_cost_wins_and_estimate_is_kept(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.000123456789012345}
    primary.enqueue(reply_json(200, chat_response({"content": "hi"}, "stop", usage)))
    raw = (await post(gw, {"model": "chat-1", "messages": [user("x")]})).text
    assert '"cost_usd":0.000123456789012345' in raw
    body = json.loads(raw, parse_float=Decimal)
    assert body["cost_source"] == "authoritative"
    (row,) = await gw.ledger_rows()
    assert Decimal(row["cost_usd"]) == Decimal("0.000123456789012345")
    assert Decimal(row["estimated_cost_usd"]) == primary_cost(10, 5)
    assert row["cost_source"] == "authoritative"


async def test_structured_output_is_parsed(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    primary.enqueue(reply_json(200, chat_response({"content": '{"city": "Paris"}'}, "stop", None)))
    body = (await post(gw, {"model": "chat-1", "messages": [user("x")], "schema": schema})).json()
    assert body["output"] == {"city": "Paris"}
    sent = primary.requests[0].json()
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "strict": True, "schema": schema},
    }


async def test_provider_pin_routes_to_the_named_provider(
    gw: GatewayHandle, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    secondary.enqueue(
        reply_json(200, chat_response({"content": "hi"}, "stop", {"prompt_tokens": 4, "completion_tokens": 1}))
    )
    body = (await post(gw, {"model": "chat-1", "provider": "secondary", "messages": [user("x")]})).json(
        parse_float=Decimal
    )
    assert body["provider"] == "secondary"
    assert secondary.requests[0].json()["model"] == "chat-1-hosted"
    assert primary.requests == []
    assert body["cost_usd"] == Decimal("0.000006")  # 4·1.00 + 1·2.00 per million


async def test_models_endpoint(gw: GatewayHandle) -> None:
    body = (await gw.client.get("/api/v1/models")).json()
    by_id = {m["id"]: m for m in body["data"]}
    chat = by_id["chat-1"]
    assert chat["aliases"] == ["chat"]
    assert chat["context_window"] == 32768
    assert chat["default"] is True
    assert chat["ready"] is True
    assert [(d["provider"], d["upstream_model"], d["ready"]) for d in chat["deployments"]] == [
        ("primary", "org/chat-1-instruct", True),
        ("secondary", "chat-1-hosted", True),
    ]
    prices = {p["provider"]: p for p in chat["prices"]}
    assert (prices["primary"]["input"], prices["primary"]["output"], prices["primary"]["cache_read"]) == (
        "0.1",
        "0.4",
        "0.025",
    )
    assert by_id["vision-1"]["capabilities"] == ["vision"]


async def test_health_and_readiness(gw: GatewayHandle) -> None:
    assert (await gw.client.get("/healthz")).json() == {"status": "ok"}
    ready = await gw.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ok", "database": True, "backends": True, "ledger": "ok"}


async def test_a_backend_that_is_not_running_is_not_ready_before_the_first_probe_round(
    start_gateway: StartGateway,
) -> None:
    """Backends count as ready until probed (every `probe_interval_s`, 10 s): a readiness check
    before the first round runs it, so a gateway whose only server is down is not ready at once."""
    gone = {"alone": {"kind": "local", "base_url": f"http://127.0.0.1:{free_port()}/v1"}}
    gw = await start_gateway(providers=gone, catalog=ALONE)
    ready = await gw.client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json() == {"status": "unavailable", "database": True, "backends": False, "ledger": "ok"}


async def test_health_readiness_and_metrics_answer_head(gw: GatewayHandle) -> None:
    """Load balancers and uptime checkers probe with HEAD: the GET's status and head, no body
    (the next request on the connection is answered as usual)."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for path in ("/healthz", "/readyz", "/metrics"):
            writer.write(f"HEAD {path} HTTP/1.1\r\nhost: gw\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 "), (path, head)
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n")  # no body came before this answer
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        assert await reader.readexactly(len(b'{"status":"ok"}')) == b'{"status":"ok"}'
    finally:
        writer.close()


async def test_an_impossible_usage_report_is_no_report_and_the_row_is_kept(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """2^62 tokens, a negative count or a trillion-dollar bill is a broken counter, not usage:
    read as no report (unknown tokens, the catalog estimate for the bill), so the ledger keeps the
    row (its columns would have refused it) and the reports' sums stay exact — and a negative
    count is not read as a zero that looks like one, at no cost."""
    wrapped = {"prompt_tokens": 2**62, "completion_tokens": 5}
    negative = {"prompt_tokens": -5, "completion_tokens": -3, "total_tokens": -8}
    billed = {"prompt_tokens": 12, "completion_tokens": 3, "cost": 10**12}
    for usage, content in ((wrapped, "a"), (negative, "b"), (billed, "c")):
        primary.enqueue(reply_json(200, chat_response({"content": content}, "stop", usage)))
    answers = [(await post(gw, {"model": "chat", "messages": [user("hi")]})).json(parse_float=Decimal) for _ in "abc"]
    for unknown in answers[:2]:
        assert (unknown["usage"]["input_tokens"], unknown["cost_usd"], unknown["cost_source"]) == (0, None, None)
    assert (answers[2]["cost_usd"], answers[2]["cost_source"]) == (primary_cost(12, 3), "estimated")
    rows = await gw.ledger_rows()
    assert [(r["input_tokens"], r["output_tokens"], r["cost_source"]) for r in rows] == [
        (None, None, None),
        (None, None, None),
        (12, 3, "estimated"),
    ]


TWO_DEFAULTS = catalog_toml(
    model("a-1", ("primary", "org/a", 1), default=True),
    model("b-1", ("secondary", "org/b", 100), default=True),
)


async def test_a_provider_pin_picks_among_the_default_models_it_serves(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    """No `model` and a `provider` pin: the default model the pinned provider serves. The pin was
    applied after the default model was chosen (b-1, whose backend ranks highest), so it was a 400
    "provider 'primary' does not serve model 'b-1'" while a-1 waited on primary."""
    providers = {
        name: {"kind": "openai_compatible", "base_url": up.url}
        for name, up in (("primary", primary), ("secondary", secondary))
    }
    gw = await start_gateway(providers=providers, catalog=TWO_DEFAULTS)
    primary.enqueue(reply_json(200, chat_response({"content": "a"}, "stop", None)))
    secondary.enqueue(reply_json(200, chat_response({"content": "b"}, "stop", None)), repeat=2)
    pinned = await post(gw, {"messages": [user("hi")], "provider": "primary"})
    assert (pinned.status_code, pinned.json()["model"], pinned.json()["provider"]) == (200, "a-1", "primary")
    unpinned = await post(gw, {"messages": [user("hi")]})
    assert (unpinned.json()["model"], unpinned.json()["provider"]) == ("b-1", "secondary")  # the best ready
    assert (await post(gw, {"messages": [user("hi")], "provider": "secondary"})).json()["model"] == "b-1"
    unknown = await post(gw, {"messages": [user("hi")], "provider": "nowhere"})
    assert (unknown.status_code, unknown.json()["error"]["param"]) == (400, "provider")


async def test_null_is_absent_in_a_tool_calls_and_a_thinking_parts_data(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """api.md: optional fields accept null as absent. `type` of a tool call's data and `redacted`
    of a thinking part's were 400s for null, though leaving them out was fine."""
    primary.enqueue(reply_json(200, chat_response({"content": "ok"}, "stop", None)))
    call = {"kind": "tool_call", "data": {"id": "c1", "name": "f", "arguments": {}, "type": None}}
    thinking = {"kind": "thinking", "data": {"text": "hm", "redacted": None}}
    blob = {"kind": "redacted_thinking", "data": {"text": "opaque", "redacted": None}}  # `false` is a 400
    history = [user("hi"), {"role": "assistant", "content": [thinking, blob, call]}]
    result = {"kind": "tool_result", "data": {"tool_call_id": "c1", "content": "18C"}}
    response = await post(gw, {"model": "chat", "messages": [*history, {"role": "tool", "content": [result]}]})
    assert response.status_code == 200, response.text
    sent = primary.requests[0].json()["messages"]
    assert sent[1]["tool_calls"] == [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]


async def test_a_whole_answer_sent_as_an_event_stream_is_read_as_one(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """`transformers serve` (4.5x) answers `/chat/completions` with an event stream whatever
    `stream` said: a valid answer, read as the stream it is (api.md: no 5xx for a valid upstream
    answer), never a malformed one that cools the backend down and fails over."""
    chunk = {"id": "req_0", "object": "chat.completion.chunk", "model": "org/chat-1-instruct"}
    primary.enqueue(
        reply_sse(
            [
                {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                {**chunk, "choices": [{"index": 0, "delta": {"content": "Paris."}}]},
                {
                    **chunk,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
                },
            ],
            done=False,
        )
    )
    response = await post(gw, {"model": "chat", "messages": [user("Capital of France?")]})

    assert response.status_code == 200, response.text
    body = response.json(parse_float=Decimal)
    assert (body["provider"], body["message"], body["stop_reason"]) == (
        "primary",
        {"role": "assistant", "content": [{"kind": "text", "data": "Paris."}]},
        "end_turn",
    )
    assert (body["usage"]["input_tokens"], body["usage"]["output_tokens"]) == (12, 3)
    assert primary.requests[0].json()["stream"] is False
    rows = await gw.ledger_rows()
    assert [(row["status"], row["provider"], row["input_tokens"], row["output_tokens"]) for row in rows] == [
        ("ok", "primary", 12, 3)
    ]


async def test_a_json_answer_labelled_an_event_stream_is_read_as_the_json_it_is(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """The other side of the test above: an answer is read as an event stream only when it is no
    JSON answer, so a whole JSON body under `content-type: text/event-stream` stays a 200."""
    body = {
        "id": "chatcmpl-j1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }
    primary.enqueue(
        Reply(status=200, headers=[("content-type", "text/event-stream")], chunks=[json.dumps(body).encode()])
    )
    response = await post(gw, {"model": "chat", "messages": [user("Capital of France?")]})

    assert response.status_code == 200, response.text
    assert response.json()["message"] == {"role": "assistant", "content": [{"kind": "text", "data": "Paris."}]}
    rows = await gw.ledger_rows()
    assert [(row["status"], row["input_tokens"], row["output_tokens"]) for row in rows] == [("ok", 12, 3)]
