"""access.md: every response to a key with limits carries OpenAI's `x-ratelimit-*` headers — not
only a completion's admission and its 429: the key's own view (`/api/v1/keys/me`), the model
lists, the usage report, and a completion refused before its admission (a 400 naming a field, a
403 for a model the key may not use). They had none. The window as it stands, nothing admitted:
in-process and from Redis."""

from __future__ import annotations

import time

import pytest

from app.access.window_view import PEEK_TIMEOUT_S
from tests.access.conftest import ADMIN, PrivateRedis, bearer, keyed_gateway
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.replies import answer
from tests.support.tcp_proxy import TcpProxy
from tests.support.upstream import ReplayUpstream
from tests.support.waiting import wait_until

USER = {"role": "user", "content": "hi"}
RATE = ("limit-requests", "remaining-requests", "limit-tokens", "remaining-tokens")


async def _secret(gw: GatewayHandle, **options: object) -> str:
    created = await gw.client.post("/api/v1/keys", json={"name": "w", **options}, headers=bearer(ADMIN))
    assert created.status_code == 201, created.text
    secret: str = created.json()["secret"]
    return secret


async def test_every_response_to_a_limited_key_tells_its_window(
    either_limiter: GatewayHandle, up: ReplayUpstream
) -> None:
    up.set_default(answer("ok"))  # 4 tokens
    headers = bearer(await _secret(either_limiter, rpm=5, tpm=10_000, models=["chat"]))
    assert (await either_limiter.client.post(COMPLETIONS, json=body("chat"), headers=headers)).status_code == 200
    expected = ("5", "4", "10000", "9996")  # one request admitted, settled to its 4 tokens

    async def settled() -> bool:  # Redis's settlement leaves within 20 ms of the answer
        me = await either_limiter.client.get("/api/v1/keys/me", headers=headers)
        return me.headers.get("x-ratelimit-remaining-tokens") == "9996"

    await wait_until(settled, what="the first request's settlement")

    answers = {
        "keys/me": await either_limiter.client.get("/api/v1/keys/me", headers=headers),
        "models": await either_limiter.client.get("/api/v1/models", headers=headers),
        "openai models": await either_limiter.client.get("/v1/models", headers=headers),
        "usage": await either_limiter.client.get("/api/v1/usage", headers=headers),
        "usage 400": await either_limiter.client.get("/api/v1/usage?group_by=nonsense", headers=headers),
        "403 model": await either_limiter.client.post(COMPLETIONS, json=body("other"), headers=headers),
        "400 field": await either_limiter.client.post(COMPLETIONS, json=body("chat", max_tokens=0), headers=headers),
        "400 chat door": await either_limiter.client.post(
            "/v1/chat/completions", json={"model": "chat", "messages": []}, headers=headers
        ),
        "403 messages door": await either_limiter.client.post(
            "/v1/messages", json={"model": "other", "max_tokens": 8, "messages": [USER]}, headers=headers
        ),
        "400 legacy door": await either_limiter.client.post(
            "/v1/completions", json={"model": "chat", "prompt": "x", "max_tokens": 0}, headers=headers
        ),
    }

    seen = {
        name: (response.status_code, tuple(response.headers.get(f"x-ratelimit-{h}") for h in RATE))
        for name, response in answers.items()
    }
    assert seen == {
        "keys/me": (200, expected),
        "models": (200, expected),
        "openai models": (200, expected),
        "usage": (200, expected),
        "usage 400": (400, expected),
        "403 model": (403, expected),
        "400 field": (400, expected),
        "400 chat door": (400, expected),
        "403 messages door": (403, expected),
        "400 legacy door": (400, expected),
    }
    assert len(up.requests) == 1  # nothing more admitted


async def test_a_key_without_a_window_gets_no_window_headers(either_limiter: GatewayHandle) -> None:
    headers = bearer(await _secret(either_limiter, budget_usd="5"))  # a budget alone: no window to describe
    response = await either_limiter.client.get("/api/v1/keys/me", headers=headers)
    assert response.status_code == 200
    assert not [name for name in response.headers if name.startswith("x-ratelimit-")]


async def test_a_silent_redis_costs_a_route_that_needs_no_limit_a_quarter_second_at_most(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, private_redis: PrivateRedis
) -> None:
    """Redis's connection stops answering (not closed): reading the window for `/api/v1/keys/me`
    gives up after `PEEK_TIMEOUT_S` and answers without the headers (it waited out the client's
    whole timeout, a second, on every such response)."""
    up.set_default(answer("ok"))
    with TcpProxy(private_redis.port) as proxy:
        redis = {"url": f"redis://127.0.0.1:{proxy.port}/0", "key_prefix": "s"}
        gw = await keyed_gateway(start_gateway, up, monkeypatch, redis=redis)
        headers = bearer(await _secret(gw, rpm=100))
        assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=headers)).status_code == 200
        proxy.stall()
        started = time.monotonic()
        me = await gw.client.get("/api/v1/keys/me", headers=headers)
        waited = time.monotonic() - started
    assert me.status_code == 200
    assert not [name for name in me.headers if name.startswith("x-ratelimit-")]
    assert PEEK_TIMEOUT_S <= waited < PEEK_TIMEOUT_S + 0.5


async def test_a_stream_waits_for_its_admission_before_a_keep_alive_starts_it(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, private_redis: PrivateRedis
) -> None:
    """An admission slower than the keep-alive (Redis not answering, its client's 1 s timeout): the
    keep-alive started a 200 stream before the key was admitted, without its `x-ratelimit-*`, and
    the refusal that followed was an error event inside it instead of the HTTP error."""
    up.set_default(answer("ok"))
    with TcpProxy(private_redis.port) as proxy:
        redis = {"url": f"redis://127.0.0.1:{proxy.port}/0", "key_prefix": "w"}
        gw = await keyed_gateway(start_gateway, up, monkeypatch, redis=redis, server={"sse_keepalive_s": 0.2})
        headers = bearer(await _secret(gw, rpm=100, max_concurrency=5))  # not leased: Redis admits each
        assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=headers)).status_code == 200
        proxy.stall()  # the connection made stops answering
        refused = await gw.client.post(COMPLETIONS, json=body("chat", stream=True), headers=headers, timeout=10)
    assert (refused.status_code, refused.headers["content-type"]) == (503, "application/json"), refused.text
    assert refused.json()["error"]["message"] == "limits cannot be checked"
