"""A prefill (a last assistant message with text) on the OpenAI chat and native doors: continued
only when the client asks with `continue_final_message` (vLLM's own field), since OpenAI, and vLLM
itself without the field, answer a last assistant turn in a new turn. `primary` is a `local` server."""

from __future__ import annotations

from typing import Any

import openai

from tests.ingress.conftest import upstream_body
from tests.support.gateway import GatewayHandle
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream

TURNS: list[Any] = [{"role": "user", "content": "Name a city."}, {"role": "assistant", "content": "The city of"}]
NATIVE_TURNS = [
    {"role": "user", "content": [{"kind": "text", "data": "Name a city."}]},
    {"role": "assistant", "content": [{"kind": "text", "data": "The city of"}]},
]


async def test_the_chat_door_continues_a_prefill_when_asked(
    aclient: openai.AsyncOpenAI, primary: ReplayUpstream
) -> None:
    primary.enqueue(answer(" Paris"))
    primary.enqueue(answer("Paris"))
    extra = {"continue_final_message": True}
    reply = await aclient.chat.completions.create(model="chat", messages=TURNS, extra_body=extra)
    await aclient.chat.completions.create(model="chat", messages=TURNS)
    assert reply.choices[0].message.content == " Paris"
    asked, plain = upstream_body(primary, 0), upstream_body(primary, 1)
    assert (
        asked["messages"]
        == plain["messages"]
        == [
            {"role": "user", "content": "Name a city."},
            {"role": "assistant", "content": "The city of"},
        ]
    )
    assert (asked["continue_final_message"], asked["add_generation_prompt"]) == (True, False)
    assert "continue_final_message" not in plain
    assert "add_generation_prompt" not in plain


async def test_the_native_door_continues_a_prefill_when_asked(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(answer(" Paris"))
    body = {"model": "chat-1", "messages": NATIVE_TURNS, "continue_final_message": True}
    response = await gw.client.post("/api/v1/completions", json=body)
    assert response.status_code == 200, response.text
    sent = upstream_body(primary)
    assert (sent["continue_final_message"], sent["add_generation_prompt"]) == (True, False)


async def test_continue_final_message_without_a_prefill_is_a_400(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    """vLLM refuses it too ("continue_final_message" needs a final assistant message); here it is
    the client's 400 naming the field, before any upstream is tried."""
    message = "continue_final_message: the last message must be an assistant message with text"
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    for messages in ([TURNS[0]], [TURNS[0], {"role": "assistant", "content": None, "tool_calls": [call]}]):
        body = {"model": "chat", "messages": messages, "continue_final_message": True}
        response = await gw.client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, response.text
        assert (response.json()["error"]["param"], response.json()["error"]["message"]) == (
            "continue_final_message",
            message,
        )
    native = {"model": "chat-1", "messages": NATIVE_TURNS[:1], "continue_final_message": True}
    response = await gw.client.post("/api/v1/completions", json=native)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "continue_final_message"
    assert primary.requests == []
