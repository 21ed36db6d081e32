"""Each front door answers 401/403/429 in its own shape, and the official SDKs raise their matching
exception classes: the native API's two views, OpenAI's through the `openai` SDK on
`/v1/chat/completions` and on the legacy `/v1/completions`, Anthropic's through the `anthropic` SDK
on `/v1/messages`; each success carries the key's `x-ratelimit-*` headers."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from tests.access.conftest import ADMIN, MakeKey, bearer, keyed_gateway
from tests.support.client import COMPLETIONS, body, parse_sse
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.replies import answer, chunk, usage_chunk
from tests.support.upstream import ReplayUpstream, Reply, reply_json, reply_sse

INVALID = "invalid or missing API key"
NOT_ALLOWED = "this API key may not use model 'other'"
RPM = "rate limit reached for this API key (rpm)"


def text_answer(text: str) -> Reply:
    """An upstream's legacy text completion (what `/v1/completions` is sent to)."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    return reply_json(
        200,
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 0,
            "model": "up-chat",
            "choices": [choice],
            "usage": usage,
        },
    )


def _message(error: openai.APIStatusError) -> object:
    """The error's own message (the SDK's `message` prefixes the status)."""
    assert isinstance(error.body, dict)
    return error.body["message"]


async def _keys(make_key: MakeKey) -> tuple[dict[str, Any], dict[str, Any]]:
    """A key for `chat` only with rpm 1, spent on its first request."""
    return await make_key(models=["chat"], rpm=1), await make_key()


async def test_native_door(gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream) -> None:
    up.set_default(answer("ok"))
    limited, _ = await _keys(make_key)
    cases = [
        ({"authorization": "Bearer sy-nope"}, "chat", 401, "authentication_error", INVALID),
        (bearer(limited["secret"]), "other", 403, "permission_error", NOT_ALLOWED),
        (bearer(limited["secret"]), "chat", 200, None, None),
        (bearer(limited["secret"]), "chat", 429, "rate_limit_error", RPM),
    ]
    for headers, model, status, kind, message in cases:
        response = await gw.client.post(COMPLETIONS, json=body(model), headers=headers)
        assert response.status_code == status, response.text
        if status == 200:
            limit, left = (response.headers[f"x-ratelimit-{n}-requests"] for n in ("limit", "remaining"))
            assert (limit, left) == ("1", "0")
        if kind is not None:
            data = response.json()
            assert (data["error"]["type"], data["error"]["message"], data["error"]["code"]) == (kind, message, status)
            assert (data["errors"][0]["code"], data["errors"][0]["detail"]) == (kind, message)


async def test_openai_door_through_the_openai_sdk(gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream) -> None:
    up.set_default(answer("ok"))
    limited, _ = await _keys(make_key)
    messages: Any = [{"role": "user", "content": "hi"}]

    def client(secret: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=secret, max_retries=0)

    with pytest.raises(openai.AuthenticationError) as unknown:
        await client("sy-nope").chat.completions.create(model="chat", messages=messages)
    assert (unknown.value.status_code, _message(unknown.value), unknown.value.type) == (
        401,
        INVALID,
        "authentication_error",
    )
    sdk = client(limited["secret"])
    with pytest.raises(openai.PermissionDeniedError) as denied:
        await sdk.chat.completions.create(model="other", messages=messages)
    assert (_message(denied.value), denied.value.type) == (NOT_ALLOWED, "permission_error")
    raw = await sdk.chat.completions.with_raw_response.create(model="chat", messages=messages)
    assert raw.parse().choices[0].message.content == "ok"
    assert raw.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError) as limited_error:
        await sdk.chat.completions.create(model="chat", messages=messages)
    assert (_message(limited_error.value), limited_error.value.type) == (RPM, "rate_limit_error")
    assert 1 <= int(limited_error.value.response.headers["retry-after"]) <= 60
    with pytest.raises(openai.AuthenticationError):
        await client("sy-nope").models.list()
    assert [m.id async for m in sdk.models.list()] == ["chat"]


async def test_legacy_completions_door_through_the_openai_sdk(
    gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream
) -> None:
    up.set_default(text_answer("ok"))
    limited, _ = await _keys(make_key)

    def client(secret: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=secret, max_retries=0)

    with pytest.raises(openai.AuthenticationError) as unknown:
        await client("sy-nope").completions.create(model="chat", prompt="hi", max_tokens=8)
    assert (_message(unknown.value), unknown.value.type) == (INVALID, "authentication_error")
    sdk = client(limited["secret"])
    with pytest.raises(openai.PermissionDeniedError) as denied:
        await sdk.completions.create(model="other", prompt="hi", max_tokens=8)
    assert (_message(denied.value), denied.value.type) == (NOT_ALLOWED, "permission_error")
    raw = await sdk.completions.with_raw_response.create(model="chat", prompt="hi", max_tokens=8)
    assert raw.parse().choices[0].text == "ok"
    assert (raw.headers["x-ratelimit-limit-requests"], raw.headers["x-ratelimit-remaining-requests"]) == ("1", "0")
    with pytest.raises(openai.RateLimitError) as limited_error:
        await sdk.completions.create(model="chat", prompt="hi", max_tokens=8)
    assert (_message(limited_error.value), limited_error.value.type) == (RPM, "rate_limit_error")
    assert 1 <= int(limited_error.value.response.headers["retry-after"]) <= 60
    assert [request.path for request in up.requests] == ["/v1/completions"]


async def test_anthropic_door_through_the_anthropic_sdk(
    gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream
) -> None:
    up.set_default(answer("ok"))
    limited, _ = await _keys(make_key)
    messages: Any = [{"role": "user", "content": "hi"}]

    def client(secret: str) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url=gw.url, api_key=secret, max_retries=0)  # sends x-api-key

    with pytest.raises(anthropic.AuthenticationError) as unknown:
        await client("sy-nope").messages.create(model="chat", max_tokens=16, messages=messages)
    assert unknown.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": INVALID},
        "request_id": unknown.value.response.headers["x-request-id"],
    }
    sdk = client(limited["secret"])
    with pytest.raises(anthropic.PermissionDeniedError) as denied:
        await sdk.messages.create(model="other", max_tokens=16, messages=messages)
    assert denied.value.body["error"] == {"type": "permission_error", "message": NOT_ALLOWED}  # type: ignore[index]
    raw = await sdk.messages.with_raw_response.create(model="chat", max_tokens=16, messages=messages)
    assert (await raw.parse()).content[0].type == "text"
    assert (raw.headers["x-ratelimit-limit-requests"], raw.headers["x-ratelimit-remaining-requests"]) == ("1", "0")
    with pytest.raises(anthropic.RateLimitError) as limited_error:
        await sdk.messages.create(model="chat", max_tokens=16, messages=messages)
    assert limited_error.value.body["error"] == {"type": "rate_limit_error", "message": RPM}  # type: ignore[index]
    assert 1 <= int(limited_error.value.response.headers["retry-after"]) <= 60


async def test_an_exhausted_budget_is_insufficient_quota_at_every_door(
    gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream
) -> None:
    """A budget below one request's worst case: refused before any upstream call."""
    key = await make_key(budget_usd="0.0001", budget_period="total")
    message = "budget exceeded: spent $0.00 of $0.0001 this total"
    native = await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(key["secret"]))
    assert (native.status_code, native.json()["error"]["type"]) == (429, "insufficient_quota")
    assert native.json()["error"]["message"] == message
    assert "retry-after" not in native.headers  # a `total` budget never renews
    sdk = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key["secret"], max_retries=0)
    with pytest.raises(openai.RateLimitError) as quota:
        await sdk.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    assert (quota.value.type, _message(quota.value)) == ("insufficient_quota", message)
    with pytest.raises(openai.RateLimitError) as legacy:  # its worst case: 18 tokens in, 1000 out
        await sdk.completions.create(model="chat", prompt="hi", max_tokens=1000)
    assert (legacy.value.type, _message(legacy.value)) == ("insufficient_quota", message)
    claude = anthropic.AsyncAnthropic(base_url=gw.url, api_key=key["secret"], max_retries=0)
    with pytest.raises(anthropic.RateLimitError):
        await claude.messages.create(model="chat", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert up.requests == []


async def test_a_stream_slow_to_start_carries_the_window_in_its_head(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upstream slower than the keep-alive: the response starts with it, before `Started`. Its
    head carried no `x-ratelimit-*` (access.md: every response); on `/v1/messages` the stream
    opened with `ping`, where Anthropic sends `message_start` first."""
    gw = await keyed_gateway(start_gateway, up, monkeypatch, server={"sse_keepalive_s": 0.2})
    made = await gw.client.post("/api/v1/keys", json={"name": "k", "rpm": 5}, headers=bearer(ADMIN))
    headers = bearer(made.json()["secret"])
    late = [chunk({"content": "late"}), chunk({}, "stop"), usage_chunk(3, 1)]
    messages = [{"role": "user", "content": "hi"}]
    doors = [
        (COMPLETIONS, body("chat", stream=True), "event: ping"),
        ("/v1/chat/completions", {"model": "chat", "stream": True, "messages": messages}, ": keep-alive"),
        (
            "/v1/messages",
            {"model": "chat", "max_tokens": 8, "stream": True, "messages": messages},
            "event: message_start",
        ),
    ]
    for sent, (path, payload, first) in enumerate(doors, 1):
        up.enqueue(reply_sse(late, first_byte_delay_s=0.5))
        response = await gw.client.post(path, json=payload, headers=headers)
        assert response.status_code == 200, response.text
        assert response.text.startswith(first), (path, response.text[:80])
        assert (response.headers["x-ratelimit-limit-requests"], response.headers["x-ratelimit-remaining-requests"]) == (
            "5",
            str(5 - sent),
        )
    frames = parse_sse(response.text)
    assert [event for event, _ in frames[:2]] == ["message_start", "ping"]
    assert [event for event, _ in frames].count("message_start") == 1
    assert frames[0][1]["message"]["model"] == "chat"
