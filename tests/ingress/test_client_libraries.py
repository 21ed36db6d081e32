"""What client libraries built on the official SDKs (instructor, pydantic-ai, litellm, LlamaIndex,
LangChain) make of the gateway's answers, shown with the SDKs themselves: those libraries reach the
gateway through `openai.OpenAI` / `anthropic.Anthropic` and keep the SDKs' retry policy, so a
refusal the SDK retries is retried by every one of them (the scripts under `repro/` of the audit
that wrote this file ran the libraries themselves).

The SDKs retry a 429 (and a 5xx) unless the answer says otherwise: a `Retry-After` over two
minutes, or `x-should-retry: false`. A refusal that no wait can lift must say so, or each client
sends it `max_retries + 1` times (three by default; LangChain's agents often set more).
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.access.conftest import bearer, keyed_gateway, new_secret
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream, upstream_fixture

up = upstream_fixture("up")
USER: Any = [{"role": "user", "content": "hi"}]


class Sent:
    """Counts the requests an SDK sends, retries included (an httpx event hook on its client)."""

    def __init__(self) -> None:
        self.count = 0

    async def hook(self, _request: httpx.Request) -> None:
        self.count += 1


@pytest.fixture
def sent() -> Sent:
    return Sent()


@pytest.fixture
async def gw(start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch) -> GatewayHandle:
    return await keyed_gateway(start_gateway, up, monkeypatch)


def _openai(gw: GatewayHandle, secret: str, sent: Sent) -> openai.AsyncOpenAI:
    """The SDK as the libraries build it: its default `max_retries` (2)."""
    client = openai.DefaultAsyncHttpxClient(event_hooks={"request": [sent.hook]})
    return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=secret, http_client=client)


def _anthropic(gw: GatewayHandle, secret: str, sent: Sent) -> anthropic.AsyncAnthropic:
    client = anthropic.DefaultAsyncHttpxClient(event_hooks={"request": [sent.hook]})
    return anthropic.AsyncAnthropic(base_url=gw.url, api_key=secret, http_client=client)


async def test_a_spent_total_budget_is_refused_once_not_retried(
    gw: GatewayHandle, up: ReplayUpstream, sent: Sent
) -> None:
    """access.md: a spent budget is 429 `insufficient_quota`, with `Retry-After` until the period
    ends, "none for `total`": a `total` budget never renews, so no retry can pass. Without
    `x-should-retry: false` both SDKs sent the request three times, each refused."""
    secret = await new_secret(gw, budget_usd="0.0001", budget_period="total")

    with pytest.raises(openai.RateLimitError) as chat:
        await _openai(gw, secret, sent).chat.completions.create(model="chat", messages=USER)
    assert (sent.count, chat.value.type) == (1, "insufficient_quota")
    assert chat.value.response.headers["x-should-retry"] == "false"
    assert "retry-after" not in chat.value.response.headers

    sent.count = 0
    with pytest.raises(anthropic.RateLimitError) as claude:
        await _anthropic(gw, secret, sent).messages.create(model="chat", max_tokens=16, messages=USER)
    assert sent.count == 1
    assert claude.value.response.headers["x-should-retry"] == "false"
    assert up.requests == []


async def test_a_request_larger_than_the_tpm_is_refused_once_not_retried(
    gw: GatewayHandle, up: ReplayUpstream, sent: Sent
) -> None:
    """A request that alone reserves more than the key's `tpm` (its input and the model's 1000
    max output tokens, over 500) could never pass: no `Retry-After`, and `x-should-retry: false`,
    so the SDK gives up at once instead of sending it twice more."""
    secret = await new_secret(gw, tpm=500)

    with pytest.raises(openai.RateLimitError) as refused:
        await _openai(gw, secret, sent).chat.completions.create(model="chat", messages=USER)

    assert (sent.count, refused.value.type) == (1, "rate_limit_error")
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert "retry-after" not in refused.value.response.headers
    assert up.requests == []


async def test_a_refusal_that_a_wait_lifts_is_still_retried(gw: GatewayHandle, up: ReplayUpstream) -> None:
    """The rpm refusal keeps its `Retry-After` and no `x-should-retry`: the SDK waits and retries it,
    as it should (a budget's refusal, whatever its period, says not to: tests/ingress/test_js_clients_wire.py)."""
    up.set_default(answer("ok"))
    limited = bearer(await new_secret(gw, rpm=1))
    request = {"model": "chat", "messages": USER}

    first = await gw.client.post("/v1/chat/completions", json=request, headers=limited)
    second = await gw.client.post("/v1/chat/completions", json=request, headers=limited)

    assert (first.status_code, second.status_code) == (200, 429)
    assert 1 <= int(second.headers["retry-after"]) <= 60
    assert "x-should-retry" not in second.headers
