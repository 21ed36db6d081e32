"""What the JavaScript clients need on the wire: `openai` (openai-node 6), `@anthropic-ai/sdk` 1 and
the Vercel AI SDK (`ai` 6 with `@ai-sdk/openai`, `@ai-sdk/openai-compatible`, `@ai-sdk/anthropic`).

The project's test environment has no npm install step, so these tests assert the exact bytes and
headers those clients act on, as read from their sources:
- before retrying, openai-node and the Anthropic SDK read `x-should-retry` (`"false"`: raise now)
  and then wait for whatever `retry-after-ms` or `Retry-After` says: openai-node with no upper
  bound, the Anthropic SDK up to 2^31 ms (24.8 days); the Python SDKs, which the other ingress
  tests drive, still cap the wait at 60 s;
- the AI SDK retries 408, 409, 429 and 5xx, and honours a Retry-After under 60 s.
"""

from __future__ import annotations

import pytest

from tests.access.conftest import bearer, keyed_gateway, new_secret, up
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream

__all__ = ["up"]  # the keyed gateway's upstream fixture

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def keyed(start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch) -> GatewayHandle:
    up.set_default(answer("ok"))
    return await keyed_gateway(start_gateway, up, monkeypatch)


@pytest.mark.parametrize("period", ["day", "month", "total"])
async def test_a_spent_budget_tells_the_sdks_not_to_retry(keyed: GatewayHandle, period: str) -> None:
    """openai-node and the Anthropic SDK slept out a day or month budget's Retry-After (up to 24
    days, the agent loop hung silently) before raising; a `total` one was retried twice for nothing.
    Retry-After stays (access.md); `x-should-retry: false` makes both SDKs raise at once."""
    secret = await new_secret(keyed, budget_usd="0.000001", budget_period=period)

    chat = await keyed.client.post(CHAT, json={"model": "chat", "messages": HI}, headers=bearer(secret))
    messages = await keyed.client.post(
        MESSAGES, json={"model": "chat", "max_tokens": 10, "messages": HI}, headers={"x-api-key": secret}
    )

    assert (chat.status_code, chat.json()["error"]["type"]) == (429, "insufficient_quota")
    assert (messages.status_code, messages.json()["error"]["type"]) == (429, "rate_limit_error")
    for response in (chat, messages):
        assert response.headers["x-should-retry"] == "false"
        if period == "total":
            assert "retry-after" not in response.headers
        else:
            assert int(response.headers["retry-after"]) > 60  # the period's end: no SDK should sleep it out


async def test_a_request_larger_than_tpm_tells_the_sdks_not_to_retry(keyed: GatewayHandle) -> None:
    """It could never pass (no Retry-After): the SDKs retried it twice all the same."""
    secret = await new_secret(keyed, tpm=100)

    response = await keyed.client.post(
        CHAT, json={"model": "chat", "messages": HI, "max_tokens": 500}, headers=bearer(secret)
    )

    assert (response.status_code, response.json()["error"]["type"]) == (429, "rate_limit_error")
    assert response.headers["x-should-retry"] == "false"
    assert "retry-after" not in response.headers


async def test_an_rpm_refusal_stays_retryable(keyed: GatewayHandle) -> None:
    """A window that reopens within the minute: the SDKs wait its Retry-After and retry."""
    secret = await new_secret(keyed, rpm=1)
    first = await keyed.client.post(CHAT, json={"model": "chat", "messages": HI}, headers=bearer(secret))
    assert first.status_code == 200

    refused = await keyed.client.post(CHAT, json={"model": "chat", "messages": HI}, headers=bearer(secret))

    assert (refused.status_code, refused.json()["error"]["type"]) == (429, "rate_limit_error")
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert "x-should-retry" not in refused.headers
