"""A model's refusal (OpenAI's `refusal`, structured outputs) through every door, from one upstream
answer: OpenAI Chat gives it back as OpenAI does (`message.refusal` / `delta.refusal`, `content`
null, `finish_reason: stop`), so the SDK's `parse()` returns it instead of raising
`ContentFilterFinishReasonError`; the native door and Anthropic's, which have no refusal field,
send it as a text block of its own with `content_filter` / `refusal` as the stop reason; the ledger
says `content_filter` whichever door asked."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pydantic

from app.context import new_context
from app.edge.openai_completions import LogprobTextStream
from app.pipeline import events as ev
from tests.ingress.conftest import upstream_body
from tests.support.client import complete, datas, stream
from tests.support.gateway import GatewayHandle
from tests.support.replies import chunk, usage_chunk
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse

USER = [{"role": "user", "content": "Plan a heist."}]
REFUSED = "I can't help with that."


class Plan(pydantic.BaseModel):
    steps: list[str]


def whole(content: str | None, refusal: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": content, "refusal": refusal}
    return {
        "id": "chatcmpl-r1",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11},
    }


def refusal_stream() -> Any:
    deltas = [
        chunk({"role": "assistant", "refusal": ""}),
        chunk({"refusal": "I can't"}),
        chunk({"refusal": REFUSED[7:]}),
    ]
    return reply_sse([*deltas, chunk({}, "stop"), usage_chunk(5, 6)])


async def test_openai_parse_returns_the_refusal(
    gw: GatewayHandle, client: openai.OpenAI, primary: ReplayUpstream
) -> None:
    primary.enqueue(reply_json(200, whole(None, REFUSED)))

    completion = await asyncio.to_thread(
        client.chat.completions.parse, model="chat", messages=USER, response_format=Plan
    )

    (choice,) = completion.choices
    assert (choice.finish_reason, choice.message.content, choice.message.refusal) == ("stop", None, REFUSED)
    assert choice.message.parsed is None
    assert upstream_body(primary)["response_format"]["type"] == "json_schema"
    (row,) = await gw.ledger_rows()
    assert (row["api"], row["stop_reason"], row["output_tokens"]) == ("openai_chat", "content_filter", 6)


async def test_openai_stream_sends_refusal_deltas(
    gw: GatewayHandle, client: openai.OpenAI, primary: ReplayUpstream
) -> None:
    primary.enqueue(refusal_stream())
    response = await gw.client.post("/v1/chat/completions", json={"model": "chat", "messages": USER, "stream": True})
    lines = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    chunks = [json.loads(line) for line in lines[:-1]]
    assert lines[-1] == "[DONE]"
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant"},
        {"refusal": "I can't"},
        {"refusal": REFUSED[7:]},
        {},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

    primary.enqueue(refusal_stream())

    def helper() -> Any:
        with client.chat.completions.stream(model="chat", messages=USER, response_format=Plan) as stream:
            return stream.get_final_completion()

    completion = await asyncio.to_thread(helper)
    message = completion.choices[0].message
    assert (message.content, message.refusal, message.parsed) == (None, REFUSED, None)
    assert completion.choices[0].finish_reason == "stop"


async def test_text_beside_a_refusal_stays_apart(
    gw: GatewayHandle, client: openai.OpenAI, primary: ReplayUpstream
) -> None:
    primary.enqueue(reply_json(200, whole("Sure.", REFUSED)))
    completion = await asyncio.to_thread(client.chat.completions.create, model="chat", messages=USER)
    message = completion.choices[0].message
    assert (message.content, message.refusal) == ("Sure.", REFUSED)

    primary.enqueue(reply_json(200, whole("Sure.", REFUSED)))
    native = (await complete(gw, "chat")).json()
    assert native["message"]["content"] == [{"kind": "text", "data": "Sure."}, {"kind": "text", "data": REFUSED}]
    assert native["stop_reason"] == "content_filter"


async def test_native_and_anthropic_doors_send_the_refusal_as_text(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(refusal_stream())
    _, frames = await stream(gw, "chat")
    events = datas(frames)
    assert [e for e in events if e["type"].startswith("text")] == [
        {"type": "text_start", "text_id": "text_0"},
        {"type": "text_delta", "text_id": "text_0", "delta": "I can't"},
        {"type": "text_delta", "text_id": "text_0", "delta": REFUSED[7:]},
        {"type": "text_end", "text_id": "text_0"},
    ]
    assert (events[-1]["type"], events[-1]["finish_reason"]) == ("finish", "content_filter")

    primary.enqueue(reply_json(200, whole(None, REFUSED)))
    anthropic = await gw.client.post(
        "/v1/messages", json={"model": "chat", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}]}
    )
    message = anthropic.json()
    assert (message["content"], message["stop_reason"]) == ([{"type": "text", "text": REFUSED}], "refusal")
    rows = await gw.ledger_rows()
    assert [(row["api"], row["stop_reason"]) for row in rows] == [
        ("unified", "content_filter"),
        ("anthropic_messages", "content_filter"),
    ]


def test_the_legacy_doors_logprob_stream_keeps_held_text_before_a_refusal() -> None:
    """`/v1/completions` with logprobs holds a text delta for the log probabilities that follow it;
    a refusal went out before it (no text upstream refuses today: the renderer is driven directly)."""
    ctx = new_context("req-1", "openai_completions", stream=True, deadline=0.0)
    stream = LogprobTextStream(ctx, include_usage=False)
    events: list[Any] = [ev.Started("m", "p"), ev.TextStart(0), ev.TextDelta("Hello."), ev.RefusalDelta(" No.")]
    out = b"".join(stream.render(event) for event in events)
    texts = [json.loads(line.removeprefix(b"data: "))["choices"][0]["text"] for line in out.split(b"\n\n") if line]
    assert texts == ["Hello.", " No."]
