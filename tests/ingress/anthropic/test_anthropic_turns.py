"""Anthropic's turns: consecutive messages of one role are one turn, and a last assistant message
with text is a prefill the answer continues (on hosts that can continue it)."""

from __future__ import annotations

from typing import Any

import anthropic

from tests.ingress.anthropic.catalog import CATALOG, providers_for
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream

USER = {"role": "user", "content": "Weather in Paris?"}
PREFILL = {"role": "assistant", "content": '{"city": "Paris", "sky": "'}


async def test_consecutive_turns_of_one_role_are_one_message(
    client: anthropic.AsyncAnthropic, primary: ReplayUpstream
) -> None:
    """Anthropic combines consecutive user (or assistant) turns into one; sent apart, a template
    that wants roles to alternate (Gemma's: "Conversation roles must alternate") refuses them."""
    primary.enqueue(answer("ok"))
    call = {"type": "tool_use", "id": "t1", "name": "f", "input": {"q": 1}}
    messages: list[Any] = [
        USER,
        {"role": "user", "content": [{"type": "text", "text": "In Celsius."}]},
        {"role": "assistant", "content": "Let me look."},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18"}]},
        {"role": "user", "content": "Thanks."},
    ]
    await client.messages.create(model="chat-1", max_tokens=16, messages=messages)
    sent = primary.requests[0].json()["messages"]
    assert sent == [
        {"role": "user", "content": "Weather in Paris?\nIn Celsius."},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [{"id": "t1", "function": {"name": "f", "arguments": '{"q":1}'}, "type": "function"}],
        },
        {"role": "tool", "content": "18", "tool_call_id": "t1"},
        {"role": "user", "content": "Thanks."},
    ]
    assert "continue_final_message" not in primary.requests[0].json()


async def test_a_rejected_block_of_a_combined_turn_is_named_where_it_was_sent(gw: GatewayHandle) -> None:
    """Combining turns renumbers the canonical messages; a 400 still names the client's block:
    in the turn combined, in a turn after it, and a tool result's image moved twice (out of its
    block, then with its turn)."""
    image = {"type": "image", "source": {"type": "url", "url": "https://a.test/x.png"}}
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
    result = {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "seen:"}, image]}
    cases: list[tuple[list[Any], str]] = [
        ([USER, {"role": "user", "content": [image]}], "messages[1].content[0]"),
        (
            [USER, USER, {"role": "assistant", "content": "a"}, {"role": "user", "content": [image]}],
            "messages[3].content[0]",
        ),
        ([USER, USER, call, {"role": "user", "content": [result]}], "messages[3].content[0].content[1]"),
    ]
    for messages, param in cases:
        response = await gw.client.post("/v1/messages", json={"model": "chat-1", "max_tokens": 8, "messages": messages})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param
        assert error["message"] == f"{param}: model 'chat-1' does not accept 'image' parts (no 'vision' capability)"
    bad_url = {"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}
    messages = [USER, USER, {"role": "assistant", "content": "a"}, {"role": "user", "content": [bad_url]}]
    response = await gw.client.post("/v1/messages", json={"model": "vision-1", "max_tokens": 8, "messages": messages})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "messages[3].content[0].source.url"


async def test_a_prefill_is_continued_by_a_local_server(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    """vLLM and SGLang continue a last assistant message with `continue_final_message: true` and
    `add_generation_prompt: false` (without them the template closes the turn and the model starts
    another: the prefill's JSON is not continued). Sent to `local` servers only, unless a provider
    says otherwise; a last assistant message of tool calls alone is no prefill."""
    local = providers_for(primary, secondary, {"primary": {"kind": "local"}})
    gw = await start_gateway(providers=local, catalog=CATALOG)
    primary.enqueue(answer('sunny"}'))
    primary.enqueue(answer("ok"))
    async with anthropic.AsyncAnthropic(base_url=gw.url, api_key="unused", max_retries=0) as sdk:
        message = await sdk.messages.create(model="chat-1", max_tokens=16, messages=[USER, PREFILL])
        call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
        await sdk.messages.create(model="chat-1", max_tokens=16, messages=[USER, call])
    assert message.content[0].text == 'sunny"}'  # type: ignore[union-attr]
    first, second = (request.json() for request in primary.requests)
    assert first["messages"][-1] == {"role": "assistant", "content": PREFILL["content"]}
    assert (first["continue_final_message"], first["add_generation_prompt"]) == (True, False)
    assert "continue_final_message" not in second
    assert "add_generation_prompt" not in second


async def test_a_prefill_goes_as_a_plain_turn_where_the_host_cannot_continue_it(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    """`transformers serve` refuses fields it does not know (422): `continue_final_message = false`
    on a local provider sends none; an `openai_compatible` host gets none by default and the
    fields when its config says it takes them."""
    overrides = {"primary": {"kind": "local", "continue_final_message": False}, "secondary": {"priority": 1}}
    for providers in (
        providers_for(primary, secondary, overrides),
        providers_for(primary, secondary),
        providers_for(primary, secondary, {"primary": {"continue_final_message": True}}),
    ):
        gw = await start_gateway(providers=providers, catalog=CATALOG)
        primary.enqueue(answer("x"))
        response = await gw.client.post(
            "/v1/messages", json={"model": "chat-1", "max_tokens": 8, "messages": [USER, PREFILL]}
        )
        assert response.status_code == 200, response.text
    plain, default, opted = (request.json() for request in primary.requests)
    assert "continue_final_message" not in plain
    assert "continue_final_message" not in default
    assert plain["messages"][-1] == default["messages"][-1] == {"role": "assistant", "content": PREFILL["content"]}
    assert (opted["continue_final_message"], opted["add_generation_prompt"]) == (True, False)
