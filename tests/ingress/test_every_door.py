"""Every recorded upstream transcript comes out the same through every front door.

Each transcript (its quirks: reasoning fields, repeated tool ids and names, parallel calls on one
index, keep-alive lines, CRLF, no `[DONE]`, missing usage, an authoritative cost, cached tokens) is
played once per door, streamed, and read back the way that door's clients read it: the native
`stream_event` frames, OpenAI chat chunks, Anthropic events. The answer (text, reasoning, tool
calls), the usage (each door's convention, mapped back to the five buckets), the cost and the
ledger row must agree across the doors — one pipeline, several renderers.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from tests.support.catalog import catalog_toml, model, price
from tests.support.gateway import GatewayHandle, StartGateway, provider_table
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse

TRANSCRIPTS = [
    "fastrun_cached_stream",
    "llamacpp_tool_call_repeated_id_stream",
    "mock_chat_stream",
    "no_usage_stream",
    "openrouter_cost_stream",
    "parallel_tool_calls_same_index_stream",
    "primalabs_reasoning_cached_stream",
    "sglang_reasoning_content_stream",
    "structured_output_stream",
    "transformers_serve_stream",
    "vllm_parallel_tool_calls_stream",
    "vllm_reasoning_stream",
    "vllm_text_stream",
    "vllm_tool_call_stream",
]
WITHOUT_USAGE = {"no_usage_stream", "parallel_tool_calls_same_index_stream"}  # the others report usage
BUCKETS = ("input_tokens", "output_tokens", "reasoning_tokens", "cache_read_tokens", "cache_write_tokens")
USER_TEXT = "Tell me."


def datas(body: str) -> list[dict[str, Any]]:
    lines = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
    return [json.loads(line, parse_float=Decimal) for line in lines if line.startswith("{")]


class Answer:
    """One door's answer, reduced to what every door must agree on."""

    def __init__(self) -> None:
        self.text = ""
        self.reasoning = ""
        self.calls: dict[int, list[str]] = {}  # position → [id, name, arguments]
        self.usage: dict[str, int] | None = None
        self.cost: Decimal | None = None

    def view(self) -> tuple[Any, ...]:
        calls = [(cid, name, json.loads(args or "{}")) for cid, name, args in self.calls.values()]
        return self.text, self.reasoning, calls, self.usage, self.cost


async def native(gw: GatewayHandle) -> Answer:
    body = {"stream": True, "messages": [{"role": "user", "content": [{"kind": "text", "data": USER_TEXT}]}]}
    response = await gw.client.post("/api/v1/completions", json=body)
    assert response.status_code == 200, response.text
    answer = Answer()
    finish = datas(response.text)[-1]
    assert finish["type"] == "finish"
    for part in finish["response"]["message"]["content"]:
        if part["kind"] == "text":
            answer.text += part["data"]
        elif part["kind"] == "thinking":
            answer.reasoning += part["data"]["text"]
        else:
            call = part["data"]
            answer.calls[len(answer.calls)] = [call["id"], call["name"], call["raw_arguments"]]
    usage = finish["usage"]
    answer.usage = {bucket: usage[bucket] for bucket in BUCKETS} if finish["response"]["cost_source"] else None
    answer.cost = finish["response"]["cost_usd"]
    return answer


async def openai_chat(gw: GatewayHandle) -> Answer:
    messages = [{"role": "user", "content": USER_TEXT}]
    body = {"stream": True, "stream_options": {"include_usage": True}, "messages": messages}
    response = await gw.client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.text.endswith("data: [DONE]\n\n")
    answer = Answer()
    for chunk in datas(response.text):
        for choice in chunk["choices"]:
            delta = choice["delta"]
            answer.text += delta.get("content") or ""
            answer.reasoning += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                slot = answer.calls.setdefault(call["index"], ["", "", ""])
                slot[0] += call.get("id") or ""
                slot[1] += (call.get("function") or {}).get("name") or ""  # the SDKs concatenate too
                slot[2] += (call.get("function") or {}).get("arguments") or ""
        usage = chunk.get("usage")
        if usage is not None:
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            written = usage["prompt_tokens_details"]["cache_write_tokens"]
            reasoning = usage["completion_tokens_details"]["reasoning_tokens"]
            answer.usage = {
                "input_tokens": usage["prompt_tokens"] - cached - written,
                "output_tokens": usage["completion_tokens"] - reasoning,
                "reasoning_tokens": reasoning,
                "cache_read_tokens": cached,
                "cache_write_tokens": written,
            }
            answer.cost = usage["cost"]
    return answer


async def anthropic_messages(gw: GatewayHandle) -> Answer:
    body = {"stream": True, "max_tokens": 1024, "messages": [{"role": "user", "content": USER_TEXT}]}
    response = await gw.client.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    answer = Answer()
    blocks: dict[int, dict[str, Any]] = {}
    for event in datas(response.text):
        if event["type"] == "content_block_start":
            blocks[event["index"]] = {**event["content_block"], "partial": ""}
        elif event["type"] == "content_block_delta":
            delta, block = event["delta"], blocks[event["index"]]
            block["partial"] += delta.get("text") or delta.get("thinking") or delta.get("partial_json") or ""
        elif event["type"] == "message_delta":
            usage = event["usage"]
            answer.cost = event.get("cost_usd")
            if answer.cost is not None or event.get("cost_source") is not None:
                answer.usage = usage
    for block in blocks.values():
        if block["type"] == "text":
            answer.text += block["partial"]
        elif block["type"] == "thinking":
            answer.reasoning += block["partial"]
        elif block["type"] == "tool_use":
            answer.calls[len(answer.calls)] = [block["id"], block["name"], block["partial"]]
    return answer


def anthropic_usage(answer: Answer, buckets: dict[str, int] | None) -> None:
    """Anthropic's additive usage, checked against the five buckets (its output includes reasoning)."""
    if buckets is None:
        assert answer.usage is None
        return
    assert answer.usage is not None
    assert answer.usage["input_tokens"] == buckets["input_tokens"]
    assert answer.usage["output_tokens"] == buckets["output_tokens"] + buckets["reasoning_tokens"]
    assert answer.usage["cache_read_input_tokens"] == buckets["cache_read_tokens"]
    assert answer.usage["cache_creation_input_tokens"] == buckets["cache_write_tokens"]
    answer.usage = buckets


@pytest.mark.parametrize("transcript", TRANSCRIPTS)
async def test_a_transcript_reads_the_same_through_every_door(
    gw: GatewayHandle, primary: ReplayUpstream, transcript: str
) -> None:
    primary.enqueue(transcript, repeat=3)
    first = await native(gw)
    chat = await openai_chat(gw)
    messages = await anthropic_messages(gw)
    anthropic_usage(messages, first.usage)
    assert chat.view() == first.view()
    assert messages.view() == first.view()
    assert first.text or first.calls  # every transcript here answers something
    assert (first.usage is None) == (transcript in WITHOUT_USAGE)
    assert (first.reasoning != "") == ("reasoning" in transcript)
    rows = await gw.ledger_rows()
    assert [row["api"] for row in rows] == ["unified", "openai_chat", "anthropic_messages"]
    assert len({tuple(row[bucket] for bucket in BUCKETS) for row in rows}) == 1
    assert len({(row["cost_usd"], row["cost_source"], row["status"]) for row in rows}) == 1
    assert {row["status"] for row in rows} == {"ok"}


@pytest.mark.parametrize(
    ("transcript", "second"),
    [
        ("transformers_serve_tool_calls_stream", ["get_time", '{"tz": "CET"}']),
        ("transformers_serve_whole_tool_calls_stream", ["get_weather", '{"city": "Rome"}']),
    ],
)
async def test_calls_that_share_one_id_and_index_stay_separate_calls_through_every_door(
    gw: GatewayHandle, primary: ReplayUpstream, transcript: str, second: list[str]
) -> None:
    """`transformers serve` streams every tool call at index 0 under one id: name first, then its
    arguments, each call closed by its own `finish_reason: "tool_calls"` chunk (4.5x), or each call
    whole in one delta and one finish at the end (5.x): two calls, not one whose arguments are both
    glued together (providers.md: `id`/`name` are set once per call; api.md: parallel calls are
    separate blocks)."""
    primary.enqueue(transcript, repeat=3)
    calls = [["req_0_tool_call", "get_weather", '{"city": "Paris"}'], ["req_0_tool_call_1", *second]]
    for door in (native, openai_chat, anthropic_messages):
        answer = await door(gw)
        assert list(answer.calls.values()) == calls, door.__name__
    rows = await gw.ledger_rows()
    assert [(row["status"], row["input_tokens"], row["output_tokens"]) for row in rows] == [("ok", 61, 40)] * 3


ZERO_PRICED = catalog_toml(
    model("chat-1", ("primary", "org/chat-1", 100), capabilities=["completions"], default=True),
    prices=[price("primary", "chat-1", "0", "0")],
)
SMALL_COSTS = [(None, "0"), (0, "0"), (1.2e-7, "0.00000012")]  # the upstream's bill → what every door writes


@pytest.mark.parametrize(("billed", "written"), SMALL_COSTS)
async def test_a_small_or_zero_cost_is_written_without_an_exponent_on_every_door(
    start_gateway: StartGateway, primary: ReplayUpstream, billed: float | None, written: str
) -> None:
    """`str(Decimal)` gives `0E-10` (a zero price's estimate) and `1.2E-7`: valid JSON numbers, but
    not what a person or a strict money parser expects. Each door writes the plain decimal, JSON
    and streamed."""
    gw = await start_gateway(providers=provider_table({"primary": primary}), catalog=ZERO_PRICED)
    usage = {"prompt_tokens": 3, "completion_tokens": 1} | ({} if billed is None else {"cost": billed})
    chat = {"id": "c", "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
    text = {"id": "t", "object": "text_completion", "choices": [{"text": "hi", "finish_reason": "stop"}]}
    chunks = [{"id": "c", "choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]}, {"usage": usage}]
    for answer in (chat, chat, chat):
        primary.enqueue(reply_json(200, {**answer, "usage": usage}))
    primary.enqueue(reply_json(200, {**text, "usage": usage}))
    primary.enqueue(reply_sse(chunks), repeat=3)
    messages = [{"role": "user", "content": USER_TEXT}]
    native_messages = [{"role": "user", "content": [{"kind": "text", "data": USER_TEXT}]}]
    requests = [
        ("/api/v1/completions", {"messages": native_messages}, f'"cost_usd":{written},'),
        ("/v1/chat/completions", {"messages": messages}, f'"cost":{written},'),
        ("/v1/messages", {"max_tokens": 9, "messages": messages}, f'"cost_usd":{written},'),
        ("/v1/completions", {"prompt": "Say:"}, f'"cost":{written},'),
        ("/api/v1/completions", {"stream": True, "messages": native_messages}, f'"cost_usd":{written},'),
        (
            "/v1/chat/completions",
            {"stream": True, "stream_options": {"include_usage": True}, "messages": messages},
            f'"cost":{written},',
        ),
        ("/v1/messages", {"stream": True, "max_tokens": 9, "messages": messages}, f'"cost_usd":{written},'),
    ]
    for path, body, expected in requests:
        response = await gw.client.post(path, json=body)
        assert response.status_code == 200, response.text
        assert expected in response.text, (path, response.text)
        assert "E-" not in response.text, path
    rows = await gw.ledger_rows()
    source = "estimated" if billed is None else "authoritative"
    assert {(Decimal(row["cost_usd"]), row["cost_source"]) for row in rows} == {(Decimal(written), source)}
