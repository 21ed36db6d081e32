"""The chat ingress's exact bytes: `chat.completion.chunk` lines, `[DONE]`, the keep-alive comment,
the error line after a stream started — and what the SDK does with them."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import openai
import pytest

from tests.ingress.conftest import CATALOG, primary_cost, providers_for
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.observe import rows_when
from tests.support.replies import chunk, tool_delta, usage_chunk
from tests.support.upstream import ReplayUpstream, played, reply_json, reply_sse
from tests.support.waiting import wait_until

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


def stream_body(**extra: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": USER, "stream": True, **extra}


def data_lines(text: str) -> list[Any]:
    """Every block must be one `data:` line; JSON payloads decoded (floats as Decimal), `[DONE]` kept."""
    assert text.endswith("\n\n"), text[-80:]
    payloads = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: ")
        assert "\n" not in block, block
        data = block.removeprefix("data: ")
        payloads.append(data if data == "[DONE]" else json.loads(data, parse_float=Decimal))
    return payloads


def choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}


async def post_stream(gw: GatewayHandle, **extra: Any) -> tuple[str, list[Any]]:
    response = await gw.client.post(CHAT, json=stream_body(**extra))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    return response.headers["x-request-id"], data_lines(response.text)


async def test_text_stream_exact_chunks_with_usage(gw: GatewayHandle, primary: ReplayUpstream) -> None:
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

    request_id, lines = await post_stream(gw, stream_options={"include_usage": True})

    *chunks, done = lines
    assert done == "[DONE]"
    created = chunks[0]["created"]
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": "chat-1"}
    usage = {
        "prompt_tokens": 9,
        "completion_tokens": 2,
        "total_tokens": 11,
        "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
        "cost": primary_cost(9, 2),
        "cost_source": "estimated",
    }
    assert chunks == [
        {**head, "choices": [choice({"role": "assistant"})]},
        {**head, "choices": [choice({"content": "Hel"})]},
        {**head, "choices": [choice({"content": "lo"})]},
        {**head, "choices": [choice({}, "stop")]},
        {**head, "choices": [], "usage": usage},
    ]
    assert primary.requests[0].json()["stream_options"] == {"include_usage": True}


async def test_no_usage_chunk_without_include_usage(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(reply_sse([chunk({"content": "ok"}), chunk({}, "length"), usage_chunk(3, 1)]))

    _, lines = await post_stream(gw)

    assert [line if line == "[DONE]" else line["choices"] for line in lines] == [
        [choice({"role": "assistant"})],
        [choice({"content": "ok"})],
        [choice({}, "length")],
        "[DONE]",
    ]
    (row,) = await gw.ledger_rows()
    assert (row["input_tokens"], row["output_tokens"]) == (3, 1)  # accounted all the same


async def test_reasoning_then_text(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue("sglang_reasoning_content_stream")

    _, lines = await post_stream(gw)

    deltas = [line["choices"][0]["delta"] for line in lines[1:-2]]
    assert {key for delta in deltas for key in delta} == {"reasoning_content", "content"}
    first_text = next(i for i, delta in enumerate(deltas) if "content" in delta)
    assert all("reasoning_content" in delta for delta in deltas[:first_text])
    assert all("content" in delta for delta in deltas[first_text:])


async def test_tool_call_deltas_name_the_call_once(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    """Two calls, the second starting while the first is still streaming its arguments; an upstream
    that repeats id and name in every delta (those must not be repeated downstream)."""
    primary.enqueue(
        reply_sse(
            [
                chunk(tool_delta(0, id="call_1", name="get_weather", args='{"ci')),
                chunk(tool_delta(0, id="call_1", name="get_weather", args='ty":"Paris"}')),
                chunk(tool_delta(1, id="call_2", name="get_time")),
                chunk(tool_delta(1, args='{"tz":"CET"}')),
                chunk({}, "tool_calls"),
            ]
        )
    )

    _, lines = await post_stream(gw)

    assert [line["choices"][0] for line in lines[1:-1]] == [
        choice(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        choice({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}),
        choice({"tool_calls": [{"index": 0, "function": {"arguments": 'ty":"Paris"}'}}]}),
        choice(
            {
                "tool_calls": [
                    {"index": 1, "id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": ""}}
                ]
            }
        ),
        choice({"tool_calls": [{"index": 1, "function": {"arguments": '{"tz":"CET"}'}}]}),
        choice({}, "tool_calls"),
    ]
    assert lines[-1] == "[DONE]"


async def test_interleaved_parallel_calls_stream_one_call_at_a_time(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    """vLLM starts the second call before the first one's arguments: the first streams live, the
    second is sent whole at the end (the SDK takes a call for done at another call's first delta)."""
    primary.enqueue("vllm_parallel_tool_calls_stream")

    _, lines = await post_stream(gw)

    def start(index: int, call_id: str) -> dict[str, Any]:
        function = {"name": "get_weather", "arguments": ""}
        return choice({"tool_calls": [{"index": index, "id": call_id, "type": "function", "function": function}]})

    def args(index: int, text: str) -> dict[str, Any]:
        return choice({"tool_calls": [{"index": index, "function": {"arguments": text}}]})

    assert [line["choices"][0] for line in lines[1:-1]] == [
        start(0, "call_paris"),
        args(0, '{"city":"Paris"}'),
        start(1, "call_tokyo"),
        args(1, '{"city":"Tokyo"}'),
        choice({}, "tool_calls"),
    ]


async def test_error_after_the_stream_started(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    """A truncated upstream stream: the error line ends the answer, and no `[DONE]` follows."""
    primary.enqueue("truncated_stream")

    request_id, lines = await post_stream(gw, stream_options={"include_usage": True})

    assert [line["choices"][0]["delta"] for line in lines[:3]] == [
        {"role": "assistant"},
        {"content": "Once"},
        {"content": " upon"},
    ]
    assert lines[3:] == [
        {
            "error": {
                "message": "the upstream failed mid-answer: upstream stream ended before a finish reason",
                "type": "upstream_error",
                "code": 502,
            }
        }
    ]
    (row,) = await gw.ledger_rows()
    assert (row["request_id"], row["api"], row["status"], row["error_status"]) == (
        request_id,
        "openai_chat",
        "error",
        502,
    )


@pytest.mark.parametrize("transcript", ["truncated_stream", "reset"])
async def test_sdk_raises_on_the_error_line(
    aclient: openai.AsyncOpenAI, primary: ReplayUpstream, transcript: str
) -> None:
    if transcript == "reset":
        text = [chunk({"content": "Hel"}), chunk({"content": "lo"}), chunk({}, "stop")]
        primary.enqueue(played(reply_sse(text), reset_after=2, chunk_delay_s=0.05))
    else:
        primary.enqueue(transcript)
    seen: list[str | None] = []

    async def read() -> None:
        stream = await aclient.chat.completions.create(model="chat", messages=USER, stream=True)
        async for item in stream:
            seen.append(item.choices[0].delta.content)

    with pytest.raises(openai.APIError) as caught:
        await read()

    assert seen[0] is None
    assert "".join(text for text in seen[1:] if text) in {"Once upon", "Hello"}
    assert caught.value.body == {"message": caught.value.message, "type": "upstream_error", "code": 502}
    assert caught.value.message.startswith("the upstream failed mid-answer")


async def test_keepalive_comment_before_the_first_token(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    gw = await start_gateway(
        providers=providers_for(primary, secondary), catalog=CATALOG, server={"sse_keepalive_s": 0.2}
    )
    primary.enqueue(reply_sse([chunk({"content": "late"}), chunk({}, "stop")], first_byte_delay_s=0.5))
    primary.enqueue(reply_sse([chunk({"content": "late"}), chunk({}, "stop")], first_byte_delay_s=0.5))

    response = await gw.client.post(CHAT, json=stream_body())
    async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(model="chat", messages=USER, stream=True)
        texts = [item.choices[0].delta.content async for item in stream]

    assert response.text.startswith(": keep-alive\n\n")
    blocks = response.text.split("\n\n")[:-1]
    assert set(blocks[: blocks.index(next(b for b in blocks if b.startswith("data: ")))]) == {": keep-alive"}
    assert data_lines(response.text.replace(": keep-alive\n\n", ""))[-1] == "[DONE]"
    assert texts == [None, "late", None]


async def test_client_disconnect_cancels_the_upstream(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(reply_sse([chunk({"content": "a"}), chunk({"content": "b"}), chunk({}, "stop")], stall_after=2))

    async with gw.client.stream("POST", CHAT, json=stream_body()) as response:
        async for text in response.aiter_text():
            if '"content":"a"' in text:
                break

    await wait_until(lambda: primary.open_connections == 0, within=1.0)
    (row,) = await rows_when(gw, 1)
    assert (row["status"], row["api"], row["streamed"]) == ("cancelled", "openai_chat", True)


async def test_sampling_extras_off_drops_what_a_strict_host_refuses(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    """`transformers serve` (and OpenAI) answer 422/400 to a field they do not know: with
    `sampling_extras = false` the client's top_k, min_p and repetition_penalty are not sent, on
    the chat and the legacy doors; the other fields are. `parallel_tool_calls` goes only with
    tools (OpenAI: "only allowed when 'tools' are specified"), as `tool_choice` already did."""
    providers = providers_for(primary, secondary)
    providers["primary"]["sampling_extras"] = False
    gw = await start_gateway(providers=providers, catalog=CATALOG)
    primary.set_default(played("nonstream_text"))
    extras = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "seed": 3, "parallel_tool_calls": False}
    response = await gw.client.post(CHAT, json={"model": "chat", "messages": USER, **extras})
    assert response.status_code == 200, response.text
    sent = primary.requests[-1].json()
    assert {key: sent.get(key) for key in extras} == dict.fromkeys(extras) | {"seed": 3}
    primary.set_default(reply_json(200, {"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}]}))
    legacy = {"model": "chat", "prompt": "Once", "top_k": 5, "seed": 3}
    assert (await gw.client.post("/v1/completions", json=legacy)).status_code == 200
    assert {key: primary.requests[-1].json().get(key) for key in ("top_k", "seed")} == {"top_k": None, "seed": 3}


async def test_parallel_tool_calls_go_with_tools_only(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.set_default(played("nonstream_text"))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for tools, sent in (([], None), ([tool], False)):
        payload = {"model": "chat", "messages": USER, "parallel_tool_calls": False, "top_k": 5}
        response = await gw.client.post(CHAT, json={**payload, **({"tools": tools} if tools else {})})
        assert response.status_code == 200, response.text
        body = primary.requests[-1].json()
        assert (body.get("parallel_tool_calls"), body["top_k"]) == (sent, 5)  # a host that takes extras gets them


async def test_reasoning_effort_max_is_api_mds_top_effort(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    """api.md's efforts end at `max` (the SDK lists it too): the chat door refused it."""
    primary.set_default(played("nonstream_text"))
    for effort, sent in (("max", "max"), ("xhigh", "xhigh"), ("minimal", "low")):
        payload = {"model": "chat", "messages": USER, "reasoning_effort": effort}
        assert (await gw.client.post(CHAT, json=payload)).status_code == 200
        assert primary.requests[-1].json()["reasoning_effort"] == sent
