"""Streaming completions through HTTP: exact `stream_event` frame sequences and their ledger rows."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from devtools.mock_http import Reply
from tests.gateway.conftest import CATALOG, primary_cost, providers_for
from tests.support.client import COMPLETIONS, body, datas, post, stream, types
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.observe import rows_when
from tests.support.replies import chunk, tool_delta, usage_chunk
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse
from tests.support.waiting import wait_until

ZERO = {"input_tokens": 0, "output_tokens": 0, "reasoning_tokens": 0, "cache_read_tokens": 0, "cache_write_tokens": 0}


async def test_text_stream_exact_frames(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(
        reply_sse(
            [
                chunk({"role": "assistant", "content": ""}),
                chunk({"content": "Hel"}),
                chunk({"content": "lo"}),
                chunk({}, "stop"),
                usage_chunk(9, 2),
            ]
        )
    )
    response, frames = await stream(gw)
    request_id = response.headers["x-request-id"]
    assert {event for event, _ in frames} == {"stream_event"}
    assert datas(frames) == [
        {"type": "stream_start", "id": request_id, "model": "chat-1", "provider": "primary"},
        {"type": "text_start", "text_id": "text_0"},
        {"type": "text_delta", "text_id": "text_0", "delta": "Hel"},
        {"type": "text_delta", "text_id": "text_0", "delta": "lo"},
        {"type": "text_end", "text_id": "text_0"},
        {
            "type": "finish",
            "finish_reason": "stop",
            "stop_reason": "end_turn",
            "usage": {**ZERO, "input_tokens": 9, "output_tokens": 2},
        },
    ]
    final = frames[-1][1]["response"]
    assert final["id"] == request_id
    assert final["message"] == {"role": "assistant", "content": [{"kind": "text", "data": "Hello"}]}
    assert final["cost_usd"] == primary_cost(9, 2)
    assert final["cost_source"] == "estimated"
    sent = primary.requests[0].json()
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}

    (row,) = await gw.ledger_rows()
    assert (row["request_id"], row["status"], row["streamed"]) == (request_id, "ok", True)
    assert (row["input_tokens"], row["output_tokens"]) == (9, 2)
    assert row["ttft_ms"] is not None


async def test_reasoning_then_text_reads_both_field_names(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(
        reply_sse(
            [
                chunk({"reasoning": "Let me "}),
                chunk({"reasoning_content": "think."}),
                chunk({"content": "42"}),
                chunk(
                    {},
                    "stop",
                    usage={
                        "prompt_tokens": 5,
                        "completion_tokens": 7,
                        "completion_tokens_details": {"reasoning_tokens": 4},
                    },
                ),
            ],
            done=False,
        )
    )
    _, frames = await stream(gw)
    assert datas(frames)[1:] == [
        {"type": "reasoning_start"},
        {"type": "reasoning_delta", "delta": "Let me "},
        {"type": "reasoning_delta", "delta": "think."},
        {"type": "reasoning_end"},
        {"type": "text_start", "text_id": "text_0"},
        {"type": "text_delta", "text_id": "text_0", "delta": "42"},
        {"type": "text_end", "text_id": "text_0"},
        {
            "type": "finish",
            "finish_reason": "stop",
            "stop_reason": "end_turn",
            "usage": {**ZERO, "input_tokens": 5, "output_tokens": 3, "reasoning_tokens": 4},
        },
    ]
    assert frames[-1][1]["response"]["message"]["content"] == [
        {"kind": "thinking", "data": {"text": "Let me think.", "signature": None, "redacted": False}},
        {"kind": "text", "data": "42"},
    ]


async def test_one_tool_call_streamed_in_fragments(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(
        reply_sse(
            [
                chunk(tool_delta(0, id="call_1", name="get_weather")),
                chunk(tool_delta(0, args='{"city"')),
                chunk(tool_delta(0, args=': "Paris"}')),
                chunk({}, "tool_calls"),
                usage_chunk(20, 8),
            ]
        )
    )
    _, frames = await stream(gw)
    call = {"id": "call_1", "name": "get_weather", "type": "function"}
    assert datas(frames)[1:] == [
        {"type": "tool_call_start", "tool_call": {**call, "arguments": {}, "raw_arguments": ""}},
        {"type": "tool_call_delta", "tool_call": {**call, "arguments": {}, "raw_arguments": '{"city"'}},
        {"type": "tool_call_delta", "tool_call": {**call, "arguments": {}, "raw_arguments": ': "Paris"}'}},
        {
            "type": "tool_call_end",
            "tool_call": {**call, "arguments": {"city": "Paris"}, "raw_arguments": '{"city": "Paris"}'},
        },
        {
            "type": "finish",
            "finish_reason": "tool_calls",
            "stop_reason": "tool_calls",
            "usage": {**ZERO, "input_tokens": 20, "output_tokens": 8},
        },
    ]


async def test_parallel_tool_calls_and_repeated_names(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    # llama.cpp-style: id and name repeated in every delta; they must not be appended.
    primary.enqueue(
        reply_sse(
            [
                chunk({"content": "Checking."}),
                chunk(tool_delta(0, id="call_a", name="get_weather", args='{"city":')),
                chunk(tool_delta(0, id="call_a", name="get_weather", args='"Paris"}')),
                chunk(tool_delta(1, id="call_b", name="get_time", args='{"tz":"CET"}')),
                chunk({}, "stop"),
                usage_chunk(30, 12),
            ]
        )
    )
    _, frames = await stream(gw)
    a = {"id": "call_a", "name": "get_weather", "type": "function"}
    b = {"id": "call_b", "name": "get_time", "type": "function"}
    assert datas(frames)[1:-1] == [
        {"type": "text_start", "text_id": "text_0"},
        {"type": "text_delta", "text_id": "text_0", "delta": "Checking."},
        {"type": "text_end", "text_id": "text_0"},
        {"type": "tool_call_start", "tool_call": {**a, "arguments": {}, "raw_arguments": ""}},
        {"type": "tool_call_delta", "tool_call": {**a, "arguments": {}, "raw_arguments": '{"city":'}},
        {"type": "tool_call_delta", "tool_call": {**a, "arguments": {}, "raw_arguments": '"Paris"}'}},
        {"type": "tool_call_start", "tool_call": {**b, "arguments": {}, "raw_arguments": ""}},
        {"type": "tool_call_delta", "tool_call": {**b, "arguments": {}, "raw_arguments": '{"tz":"CET"}'}},
        {
            "type": "tool_call_end",
            "tool_call": {**a, "arguments": {"city": "Paris"}, "raw_arguments": '{"city":"Paris"}'},
        },
        {"type": "tool_call_end", "tool_call": {**b, "arguments": {"tz": "CET"}, "raw_arguments": '{"tz":"CET"}'}},
    ]
    finish = frames[-1][1]
    assert (finish["finish_reason"], finish["stop_reason"]) == ("tool_calls", "tool_calls")
    assert [p["kind"] for p in finish["response"]["message"]["content"]] == ["text", "tool_call", "tool_call"]


async def test_structured_output_streamed(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(reply_sse([chunk({"content": '{"a": '}), chunk({"content": "1}"}), chunk({}, "stop")]))
    _, frames = await stream(gw, schema={"type": "object", "properties": {"a": {"type": "integer"}}})
    assert frames[-1][1]["response"]["output"] == {"a": 1}
    assert primary.requests[0].json()["response_format"]["type"] == "json_schema"


@pytest.mark.parametrize("code", [500, 400])
async def test_error_chunk_mid_stream_becomes_error_event(
    gw: GatewayHandle, primary: ReplayUpstream, code: int
) -> None:
    """Never the upstream's own words in a 502 (they may name its keys and hosts): a 400's message
    went out after `the upstream failed mid-answer:`."""
    message = "bad param; upstream key sk-live-SECRET at http://10.0.0.5:9000/internal"
    primary.enqueue(
        reply_sse(
            [chunk({"content": "Partial"}), {"error": {"message": message, "type": "server_error", "code": code}}]
        )
    )
    _, frames = await stream(gw)
    assert datas(frames)[1:] == [
        {"type": "text_start", "text_id": "text_0"},
        {"type": "text_delta", "text_id": "text_0", "delta": "Partial"},
        {"type": "text_end", "text_id": "text_0"},
        {
            "type": "error",
            "error": {
                "message": f"the upstream failed mid-answer: upstream returned {code}",
                "type": "upstream_error",
                "code": 502,
            },
        },
    ]
    (row,) = await gw.ledger_rows()
    assert (row["status"], row["error_type"], row["error_status"], row["attempts"]) == (
        "error",
        "upstream_error",
        502,
        1,
    )


async def test_truncated_stream_is_an_error_event(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(reply_sse([chunk({"content": "Half"})], done=False))
    _, frames = await stream(gw)
    assert types(frames) == ["stream_start", "text_start", "text_delta", "text_end", "error"]
    assert frames[-1][1]["error"]["code"] == 502
    (row,) = await gw.ledger_rows()
    assert row["status"] == "error"
    assert row["input_tokens"] is None


@pytest.mark.parametrize(
    "ending",
    [
        [{"error": {"message": "engine crashed", "type": "server_error", "code": 500}}],
        [],  # the stream ends without a finish reason or [DONE]
    ],
)
async def test_usage_reported_before_a_failure_is_recorded(
    gw: GatewayHandle, primary: ReplayUpstream, ending: list[dict[str, Any]]
) -> None:
    """Tokens the upstream reported before its stream failed (an error chunk, or the end of the
    stream without a finish) were billed: the error row records them and their cost."""
    usage = usage_chunk(1000, 200, prompt_tokens_details={"cached_tokens": 400})
    primary.enqueue(reply_sse([chunk({"content": "Partial"}), usage, *ending], done=False))
    _, frames = await stream(gw)
    assert types(frames) == ["stream_start", "text_start", "text_delta", "text_end", "error"]
    (row,) = await gw.ledger_rows()
    assert (row["status"], row["input_tokens"], row["cache_read_tokens"], row["output_tokens"]) == (
        "error",
        600,
        400,
        200,
    )
    assert Decimal(row["cost_usd"]) == primary_cost(600, 200, cache_read=400)
    assert row["usage_estimated"] == 0


async def test_failure_before_content_fails_over_and_is_a_plain_stream(
    gw: GatewayHandle, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    primary.enqueue(reply_sse([chunk({"role": "assistant"})], done=False))  # dies before any content
    secondary.enqueue(reply_sse([chunk({"content": "ok"}), chunk({}, "stop"), usage_chunk(3, 1)]))
    _, frames = await stream(gw)
    assert frames[0][1]["provider"] == "secondary"
    assert types(frames) == ["stream_start", "text_start", "text_delta", "text_end", "finish"]
    (row,) = await gw.ledger_rows()
    assert (row["provider"], row["attempts"], row["status"]) == ("secondary", 2, "ok")
    assert Decimal(row["cost_usd"]) == Decimal("0.000005")


async def test_keepalive_ping_before_first_token(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    gw = await start_gateway(
        providers=providers_for(primary, secondary), catalog=CATALOG, server={"sse_keepalive_s": 0.2}
    )
    primary.enqueue(reply_sse([chunk({"content": "late"}), chunk({}, "stop")], first_byte_delay_s=0.5))
    response = await post(gw, body(stream=True))
    blocks = response.text.split("\n\n")[:-1]
    assert blocks[0] == 'event: ping\ndata: {"type":"ping"}'
    assert "stream_start" in response.text
    assert response.text.index("ping") < response.text.index("stream_start")


async def test_client_disconnect_cancels_upstream_and_records_cancelled(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    primary.enqueue(reply_sse([chunk({"content": "a"}), chunk({"content": "b"}), chunk({}, "stop")], stall_after=2))
    async with gw.client.stream("POST", COMPLETIONS, json=body(stream=True)) as response:
        async for text in response.aiter_text():
            if "text_delta" in text:
                break
    await wait_until(lambda: primary.open_connections == 0, within=1.0)  # the upstream request was cancelled
    (row,) = await rows_when(gw, 1)
    assert (row["status"], row["streamed"], row["provider"]) == ("cancelled", True, "primary")


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": "eleven", "completion_tokens": 2},
        [11, 2],
        {"prompt_tokens": 9, "prompt_tokens_details": "lots"},
    ],
    ids=["a-word", "a-list", "bad-details"],
)
async def test_a_usage_report_of_the_wrong_shape_is_no_report_and_the_answer_stands(
    gw: GatewayHandle, primary: ReplayUpstream, usage: Any
) -> None:
    """It used to fail the whole chunk: the text was sent, then an `error` frame (502) and an
    `error` row. A report that cannot be read is no report (providers.md: the ledger records
    unknown): the answer finishes, its tokens unknown and unpriced — streamed and whole alike."""
    primary.enqueue(reply_sse([chunk({"content": "Hello"}), chunk({}, "stop"), chunk(None, usage=usage)]))
    _, frames = await stream(gw)
    assert [data["type"] for data in datas(frames)][-2:] == ["text_end", "finish"]
    assert datas(frames)[-1]["usage"] == ZERO
    assert frames[-1][1]["response"]["cost_usd"] is None
    whole = chunk(None, usage=usage) | {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}],
    }
    primary.enqueue(reply_json(200, whole))
    answered = await post(gw, body("chat-1"))
    assert answered.status_code == 200, answered.text
    assert answered.json()["message"]["content"] == [{"kind": "text", "data": "Hi"}]
    rows = await gw.ledger_rows()
    assert [(r["status"], r["input_tokens"], r["output_tokens"], r["cost_usd"]) for r in rows] == [
        ("ok", None, None, None),
        ("ok", None, None, None),
    ]


def escaped(payload: dict[str, Any]) -> str:
    """An SSE event as a server that escapes every non-ASCII UTF-16 unit writes it: a lone half of a
    surrogate pair becomes a lone `\\udxxx` escape, which is how a split emoji arrives."""
    return f"data: {json.dumps(payload)}\n\n"


async def test_an_emoji_split_between_chunks_by_its_utf16_halves_is_joined(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """msgspec refuses a lone surrogate escape, so this stream used to end in an `error` frame. The
    halves are joined per channel; a half never completed, or a low one alone, is U+FFFD."""
    primary.enqueue(
        reply_sse(
            [
                escaped(chunk({"reasoning": "ok \ud83d"})),
                escaped(chunk({"reasoning": "\udc4d"})),  # U+1F44D
                escaped(chunk({"content": "Hi \ud83d"})),
                escaped(chunk({"content": "\ude00! \udc4d."})),  # U+1F600, then a low half alone
                chunk({"content": " Bye"}),  # an ordinary chunk between
                escaped(chunk({"content": " \ud83c"})),  # never completed
                chunk({}, "stop"),
                usage_chunk(9, 2),
            ]
        )
    )
    _, frames = await stream(gw)
    deltas = [(d["type"], d["delta"]) for d in datas(frames) if d["type"].endswith("_delta")]
    assert deltas == [
        ("reasoning_delta", "ok "),
        ("reasoning_delta", "\U0001f44d"),
        ("text_delta", "Hi "),
        ("text_delta", "\U0001f600! \ufffd."),
        ("text_delta", " Bye"),
        ("text_delta", " "),
        ("text_delta", "\ufffd"),
    ]
    assert datas(frames)[-1]["finish_reason"] == "stop"
    message = frames[-1][1]["response"]["message"]["content"]
    assert message[-1] == {"kind": "text", "data": "Hi \U0001f600! \ufffd. Bye \ufffd"}
    (row,) = await gw.ledger_rows()
    assert (row["status"], row["input_tokens"], row["output_tokens"]) == ("ok", 9, 2)


async def test_tool_arguments_split_by_utf16_halves_are_joined(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(
        reply_sse(
            [
                escaped(chunk(tool_delta(0, id="call_1", name="cheer", args='{"with": "\ud83c'))),
                escaped(chunk(tool_delta(0, args='\udf89"}'))),  # U+1F389
                chunk({}, "tool_calls"),
                usage_chunk(9, 2),
            ]
        )
    )
    _, frames = await stream(gw)
    call = {"id": "call_1", "name": "cheer", "type": "function"}
    assert datas(frames)[1:-1] == [
        {"type": "tool_call_start", "tool_call": {**call, "arguments": {}, "raw_arguments": ""}},
        {"type": "tool_call_delta", "tool_call": {**call, "arguments": {}, "raw_arguments": '{"with": "'}},
        {"type": "tool_call_delta", "tool_call": {**call, "arguments": {}, "raw_arguments": '\U0001f389"}'}},
        {
            "type": "tool_call_end",
            "tool_call": {**call, "arguments": {"with": "\U0001f389"}, "raw_arguments": '{"with": "\U0001f389"}'},
        },
    ]
    assert datas(frames)[-1]["finish_reason"] == "tool_calls"


async def test_a_lone_surrogate_in_a_whole_answer_is_u_fffd(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    answer = chunk(None, usage={"prompt_tokens": 9, "completion_tokens": 2}) | {
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "a\udc4d b \ud83d"}, "finish_reason": "stop"}
        ],
    }
    primary.enqueue(Reply(headers=[("content-type", "application/json")], chunks=[json.dumps(answer).encode()]))
    answered = await post(gw, body("chat-1"))
    assert answered.status_code == 200, answered.text
    assert answered.json()["message"]["content"] == [{"kind": "text", "data": "a\ufffd b \ufffd"}]


async def test_an_error_field_after_content_is_an_error_event_not_a_finish(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """llama.cpp (late 2024 to October 2025) streamed an error as an `error:` SSE field, then
    `data: [DONE]`: read as an unknown field it was skipped, and the cut-off answer finished
    `stop` with an `ok` row."""
    primary.enqueue("llamacpp_error_field_midstream")
    _, frames = await stream(gw)
    assert types(frames) == ["stream_start", "text_start", "text_delta", "text_delta", "text_end", "error"]
    assert frames[-1][1]["error"]["code"] == 502
    (row,) = await gw.ledger_rows()
    assert (row["status"], row["error_status"], row["provider"]) == ("error", 502, "primary")


async def test_an_error_field_refusing_the_prompt_is_the_clients_400_without_a_cool_down(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """The same server refusing a prompt past its context, after the 200 head: the upstream's 400
    with its message, as a 400 body would be, and the backend stays in rotation (it was a 502
    "malformed response" that cooled the local server down for everyone)."""
    primary.enqueue("llamacpp_error_field_context_400")
    primary.enqueue(reply_sse([chunk({"content": "ok"}), chunk({}, "stop")]))
    response = await post(gw, body(stream=True))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["message"]) == (
        "invalid_request_error",
        "the request exceeds the available context size, try increasing it",
    )
    _, frames = await stream(gw)
    assert types(frames)[-1] == "finish"
    assert frames[0][1]["provider"] == "primary"
