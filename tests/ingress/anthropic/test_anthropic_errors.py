"""Errors under `/v1/messages` in Anthropic's shape, `{"type": "error", "error": {"type",
"message"}, "request_id"}`, with api.md's statuses, `x-request-id` and `Retry-After` — and the
`anthropic` SDK's error classes for them."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from tests.ingress.anthropic.catalog import CATALOG, providers_for
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.upstream import ReplayUpstream, reply_json

USER = {"role": "user", "content": "hi"}
BUSY = {"error": {"message": "busy", "type": "rate_limit_error", "code": 429}}
DEEP: dict[str, Any] = {"a": []}
for _ in range(100):
    DEEP = {"a": [DEEP]}


def assert_error(response: httpx.Response, status: int, type_: str, message: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body: dict[str, Any] = response.json()
    request_id = response.headers["x-request-id"]
    assert body == {"type": "error", "error": body["error"], "request_id": request_id}
    assert body["error"]["type"] == type_
    if message is not None:
        assert body["error"]["message"] == message
    return body


def image_of(media_type: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": "iVBORw0KGgo="}}


def tool_round(result: list[Any], *after: dict[str, Any], model: str = "chat-1") -> dict[str, Any]:
    """A tool call and its result, whose `content` is `result`, then the user's `after` blocks."""
    call = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    answer = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": result}, *after]}
    return {"model": model, "max_tokens": 8, "messages": [USER, {"role": "assistant", "content": [call]}, answer]}


@pytest.mark.parametrize(
    ("payload", "param", "message"),
    [
        ({"messages": [USER]}, "max_tokens", "max_tokens: field required"),
        ({"max_tokens": "many", "messages": [USER]}, "max_tokens", "max_tokens: Expected `int`, got `str`"),
        ({"max_tokens": 0, "messages": [USER]}, "max_tokens", None),
        ({"max_tokens": 8, "messages": []}, "messages", None),
        (  # Anthropic's rule and words: only a last assistant message may be empty
            {"max_tokens": 8, "messages": [{"role": "user", "content": []}]},
            "messages[0].content",
            "messages[0].content: all messages must have non-empty content except for the optional final assistant"
            " message",
        ),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": ""}, USER]},
            "messages[0].content",
            None,
        ),
        (
            {"max_tokens": 8, "messages": [USER, {"role": "assistant", "content": ""}, USER]},
            "messages[1].content",
            None,
        ),
        (  # an empty last assistant message is left out, but not when it is the only one
            {"max_tokens": 8, "messages": [{"role": "assistant", "content": ""}]},
            "messages[0].content",
            "messages[0].content: the only message is empty",
        ),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
            "messages[0].content[0].text",
            "messages[0].content[0].text: text content blocks must be non-empty",
        ),
        (  # a server tool: named by its type, not by the input_schema it has no need of
            {"max_tokens": 8, "messages": [USER], "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools[0].type",
            None,
        ),
        ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role", None),
        ({"max_tokens": 8, "messages": [USER], "temperature": 1.5}, "temperature", None),
        (
            {"max_tokens": 8, "messages": [USER], "stop_sequences": [""]},
            "stop_sequences[0]",
            "stop_sequences[0]: must not be empty",
        ),
        ({"max_tokens": 8, "messages": [USER], "top_k": -1}, "top_k", None),
        ({"max_tokens": 8, "messages": [USER], "stream": "yes"}, "stream", None),
        (
            {"max_tokens": 8, "messages": [USER], "system": [{"type": "image"}]},
            "system[0].type",
            "system[0].type: unknown type 'image'",
        ),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]},
            "messages[0].content[0].type",
            "messages[0].content[0].type: unknown type 'hologram'",
        ),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
            "messages[0].content[0].text: field required",
        ),
        (
            {
                "max_tokens": 8,
                "messages": [
                    USER,
                    {"role": "user", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                ],
            },
            "messages[1].content[0].type",
            "messages[1].content[0].type: a 'tool_use' block cannot appear in a 'user' message",
        ),
        (
            {
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": 3}]}],
            },
            "messages[0].content[0].input",
            None,
        ),
        (
            {
                "model": "vision-1",
                "max_tokens": 8,
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "file:///x"}}]}
                ],
            },
            "messages[0].content[0].source.url",
            None,
        ),
        (  # the same inside a tool's result (its media follow the message's blocks, named where they were)
            tool_round(
                [{"type": "image", "source": {"type": "url", "url": "file:///x"}}],
                {"type": "text", "text": "and?"},
                model="vision-1",
            ),
            "messages[2].content[0].content[0].source.url",
            None,
        ),
        (
            {
                "max_tokens": 8,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": "https://a.test/x.png"}}],
                    }
                ],
            },
            "messages[0].content[0]",
            "messages[0].content[0]: model 'chat-1' does not accept 'image' parts (no 'vision' capability)",
        ),
        (
            {"max_tokens": 8, "messages": [USER], "tools": [{"name": "f"}]},
            "tools[0].input_schema",
            "tools[0].input_schema: field required",
        ),
        (
            {"max_tokens": 8, "messages": [USER], "tool_choice": {"type": "tool", "name": "f"}},
            "tool_choice.type",
            "tool_choice.type: 'tool' needs at least one tool in `tools`",
        ),
        (
            {
                "max_tokens": 8,
                "messages": [USER],
                "tools": [{"name": "g", "input_schema": {}}],
                "tool_choice": {"type": "tool", "name": "f"},
            },
            "tool_choice.name",
            "tool_choice.name: names no declared tool: 'f'",
        ),
        (
            {"max_tokens": 2000, "messages": [USER], "thinking": {"type": "enabled", "budget_tokens": 512}},
            "thinking.budget_tokens",
            None,
        ),
        (
            {"max_tokens": 2000, "messages": [USER], "thinking": {"type": "enabled", "budget_tokens": 2000}},
            "thinking.budget_tokens",
            "thinking.budget_tokens: must be less than max_tokens (2000)",
        ),
        (
            {"max_tokens": 8, "messages": [USER], "model": "no-such-model"},
            "model",
            "model: unknown model 'no-such-model'",
        ),
        # nested past 64 levels: named by the Anthropic field, not the canonical one
        (
            {
                "max_tokens": 8,
                "messages": [
                    USER,
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": DEEP}]},
                ],
            },
            "messages[1].content[0].input",
            None,
        ),
        (
            {"max_tokens": 8, "messages": [USER], "tools": [{"name": "f", "input_schema": DEEP}]},
            "tools[0].input_schema",
            None,
        ),
        # an image's media type is one Anthropic's API takes (text/html went on as a data: URL)
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": [image_of("text/html")]}]},
            "messages[0].content[0].source.media_type",
            None,
        ),
        # an image in a tool's result, for a model without vision: named where it is in the request
        (
            tool_round([{"type": "text", "text": "seen:"}, image_of("image/png")]),
            "messages[2].content[0].content[1]",
            "messages[2].content[0].content[1]: model 'chat-1' does not accept 'image' parts (no 'vision' capability)",
        ),
        (
            {"max_tokens": 8, "messages": [USER], "output_config": {"format": {"type": "json_schema", "schema": DEEP}}},
            "output_config.format.schema",
            None,
        ),
        (
            {"max_tokens": 8, "messages": [USER], "output_format": {"type": "json_schema", "schema": DEEP}},
            "output_format.schema",
            None,
        ),
        # a prompt over the context window, named by the part that holds most of it
        ({"max_tokens": 8, "messages": [USER], "system": "s" * 1_100_000}, "system", None),
        (
            {
                "max_tokens": 8,
                "messages": [USER],
                "output_config": {"format": {"type": "json_schema", "schema": {"description": "d" * 1_100_000}}},
            },
            "output_config.format.schema",
            None,
        ),
    ],
)
async def test_invalid_requests_are_400_naming_the_field(
    gw: GatewayHandle, primary: ReplayUpstream, payload: dict[str, Any], param: str, message: str | None
) -> None:
    response = await gw.client.post("/v1/messages", json=payload)
    body = assert_error(response, 400, "invalid_request_error", message)
    assert body["error"]["param"] == param
    assert body["error"]["message"].startswith(f"{param}: ")
    assert primary.requests == []


async def test_malformed_json_and_non_object(gw: GatewayHandle) -> None:
    response = await gw.client.post("/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
    assert_error(response, 400, "invalid_request_error")
    response = await gw.client.post("/v1/messages", json=[1])
    assert_error(response, 400, "invalid_request_error", "request body must be a JSON object")


async def test_sdk_raises_bad_request_for_missing_max_tokens_wrong_type_and_unknown_model(
    client: anthropic.AsyncAnthropic, primary: ReplayUpstream
) -> None:
    with pytest.raises(anthropic.BadRequestError) as missing:
        await client.messages.create(model="chat-1", max_tokens=anthropic.omit, messages=[USER], timeout=10)  # type: ignore[arg-type]
    assert (missing.value.type, missing.value.api_message) == ("invalid_request_error", "max_tokens: field required")
    assert missing.value.response.headers["x-request-id"] == missing.value.body["request_id"]  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as wrong:
        await client.messages.create(model="chat-1", max_tokens=8, messages=[USER], extra_body={"top_p": "high"})
    assert wrong.value.api_message == "top_p: Expected `float | null`, got `str`"
    with pytest.raises(anthropic.BadRequestError) as unknown:
        await client.messages.create(model="claude-nowhere-1", max_tokens=8, messages=[USER])
    assert (unknown.value.type, unknown.value.api_message) == (
        "invalid_request_error",
        "model: unknown model 'claude-nowhere-1'",
    )
    assert primary.requests == []


async def test_at_capacity_is_rate_limit_error_with_retry_after(
    gw: GatewayHandle, client: anthropic.AsyncAnthropic, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    primary.enqueue(reply_json(429, BUSY, headers={"retry-after": "7"}))
    secondary.enqueue(reply_json(429, BUSY, headers={"retry-after": "3"}))
    with pytest.raises(anthropic.RateLimitError) as caught:
        await client.messages.create(model="chat-1", max_tokens=8, messages=[USER])
    error = caught.value
    assert error.response.headers["retry-after"] == "3"
    assert error.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "all backends for this model are at capacity"},
        "request_id": error.response.headers["x-request-id"],
    }
    (row,) = await gw.ledger_rows()
    assert (row["api"], row["status"], row["error_status"], row["attempts"]) == ("anthropic_messages", "error", 429, 2)


async def test_all_backends_refusing_is_502_api_error(
    gw: GatewayHandle, client: anthropic.AsyncAnthropic, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    primary.enqueue(reply_json(503, {"error": {"message": "down", "type": "unavailable", "code": 503}}))
    secondary.enqueue(reply_json(500, {"detail": "boom"}))
    with pytest.raises(anthropic.InternalServerError) as caught:
        async with client.messages.stream(model="chat-1", max_tokens=8, messages=[USER]) as stream:
            await stream.get_final_message()
    assert caught.value.status_code == 502
    assert caught.value.type == "api_error"
    assert caught.value.api_message == "all backends refused the request (primary: 503; secondary: 500)"


async def test_no_backend_available_is_503_overloaded_error(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SWITCHYARD_TEST_UNSET_KEY", raising=False)
    no_key = {"api_key_env": "SWITCHYARD_TEST_UNSET_KEY"}
    gw = await start_gateway(
        providers=providers_for(primary, secondary, {"primary": no_key, "secondary": no_key}), catalog=CATALOG
    )
    async with anthropic.AsyncAnthropic(base_url=gw.url, api_key="unused", max_retries=0) as client:
        with pytest.raises(anthropic.ServiceUnavailableError) as caught:
            await client.messages.create(model="chat-1", max_tokens=8, messages=[USER])
    assert caught.value.type == "overloaded_error"
    assert "retry-after" in caught.value.response.headers
    (row,) = await gw.ledger_rows()
    assert (row["api"], row["error_status"], row["attempts"]) == ("anthropic_messages", 503, 0)


async def test_upstream_timeout_is_504_api_error(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    fast = {"timeouts": {"first_byte": 0.3, "idle": 0.3}}
    gw = await start_gateway(
        providers=providers_for(primary, secondary, {"primary": fast, "secondary": fast}), catalog=CATALOG
    )
    stalled = reply_json(200, {"id": "late"}, first_byte_delay_s=5.0)
    primary.enqueue(stalled)
    secondary.enqueue(stalled)
    response = await gw.client.post("/v1/messages", json={"max_tokens": 8, "messages": [USER]})
    assert_error(response, 504, "api_error")


async def test_framework_errors_under_the_route(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    gw = await start_gateway(
        providers=providers_for(primary, secondary), catalog=CATALOG, server={"max_body_bytes": 2048}
    )
    response = await gw.client.post(
        "/v1/messages", json={"max_tokens": 8, "messages": [{"role": "user", "content": "x" * 4096}]}
    )
    assert_error(response, 413, "request_too_large", "request body too large (the limit is 2048 bytes)")
    response = await gw.client.get("/v1/messages")
    assert_error(response, 405, "invalid_request_error", "method not allowed")
    response = await gw.client.post("/v1/messages/count_tokens", json={"messages": [USER]})
    assert_error(response, 404, "not_found_error", "no such endpoint")
    async with anthropic.AsyncAnthropic(base_url=gw.url, api_key="unused", max_retries=0) as client:
        with pytest.raises(anthropic.NotFoundError) as caught:
            await client.messages.count_tokens(model="chat-1", messages=[USER])
    assert caught.value.type == "not_found_error"
    response = await gw.client.get("/api/v1/nothing")  # elsewhere, the gateway's own two-view shape
    assert response.status_code == 404
    assert response.json()["error"]["code"] == 404
    assert await gw.ledger_rows() == []
