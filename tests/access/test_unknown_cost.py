"""An answer whose cost or token count is unknown (the upstream reported no usage, or tokens in a
bucket the catalog has no price for) keeps its reservation, the worst case it was admitted on:
it settled to $0 and 0 tokens, and a key spent without limit (a host with `stream_usage = false`
made every stream free). A failure without usage still settles to 0 (access.md). Both limiters:
the in-process one and Redis's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from decimal import Decimal
from typing import Any

import httpx
import pytest

from tests.access.conftest import ADMIN, bearer, keyed_gateway
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.replies import answer, error
from tests.support.upstream import ReplayUpstream, Reply, played, reply_json
from tests.support.waiting import wait_until

TPM = 100_000


def _reply(usage: dict[str, Any] | None) -> Reply:
    message = {"role": "assistant", "content": "ok"}
    answer_body: dict[str, Any] = {
        "id": "chatcmpl-u",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    if usage is not None:
        answer_body["usage"] = usage
    return reply_json(200, answer_body)


NO_USAGE = _reply(None)
UNPRICED_BUCKET = _reply(  # `chat` has no cache_write price: the cost is unknown
    {"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": {"cache_write_tokens": 1}}
)


async def _key(gw: GatewayHandle, **limits: Any) -> dict[str, str]:
    created = await gw.client.post("/api/v1/keys", json={"name": "u", **limits}, headers=bearer(ADMIN))
    assert created.status_code == 201, created.text
    return bearer(created.json()["secret"])


async def _post(gw: GatewayHandle, headers: dict[str, str]) -> httpx.Response:
    return await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=100), headers=headers)


async def _remaining_tokens(gw: GatewayHandle, headers: dict[str, str]) -> int:
    response = await _post(gw, headers)
    assert response.status_code == 200, response.text
    return int(response.headers["x-ratelimit-remaining-tokens"])


async def _spent(gw: GatewayHandle, headers: dict[str, str]) -> Decimal:
    return Decimal((await gw.client.get("/api/v1/keys/me", headers=headers)).json()["spent_usd"])


async def _equals(value: Awaitable[Decimal], expected: Decimal) -> bool:
    return await value == expected


@pytest.mark.parametrize("reply", [NO_USAGE, UNPRICED_BUCKET], ids=["no-usage", "unpriced-bucket"])
async def test_an_unknown_cost_spends_the_worst_case_of_the_budget(
    either_limiter: GatewayHandle, up: ReplayUpstream, reply: Reply
) -> None:
    up.set_default(reply)
    headers = await _key(either_limiter, budget_usd="1", budget_period="total")
    key_id = (await either_limiter.client.get("/api/v1/keys/me", headers=headers)).json()["id"]
    assert (await _post(either_limiter, headers)).status_code == 200
    await wait_until(lambda: _spent(either_limiter, headers), what="the settlement (Redis's is sent within 20 ms)")
    worst = await _spent(either_limiter, headers)  # it spent nothing before
    patch = {"budget_usd": str(worst * 5 / 2)}  # room for two worst cases, not three
    assert (
        await either_limiter.client.patch(f"/api/v1/keys/{key_id}", json=patch, headers=bearer(ADMIN))
    ).status_code == 200

    statuses = [(await _post(either_limiter, headers)).status_code for _ in range(2)]

    assert statuses == [200, 429]
    await wait_until(lambda: _equals(_spent(either_limiter, headers), 2 * worst), what="two worst cases spent")
    rows = [row for row in await either_limiter.ledger_rows() if row["status"] == "ok"]
    assert [row["cost_usd"] for row in rows] == [None, None]  # the ledger says unknown (cost.md)


async def test_an_unknown_token_count_keeps_its_tpm_reservation(
    either_limiter: GatewayHandle, up: ReplayUpstream
) -> None:
    up.set_default(NO_USAGE)
    headers = await _key(either_limiter, tpm=TPM)
    first = await _remaining_tokens(either_limiter, headers)
    second = await _remaining_tokens(either_limiter, headers)
    assert second == first - (TPM - first)  # the first kept all it reserved (it settled to 0 before)


async def test_a_failure_without_usage_still_settles_to_nothing(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-process limiter's headers are exact (Redis's leases reserve ahead of the requests)."""
    either_limiter = await keyed_gateway(start_gateway, up, monkeypatch)
    up.set_default(answer("ok"))  # 4 tokens
    headers = await _key(either_limiter, tpm=TPM)
    first = await _remaining_tokens(either_limiter, headers)
    up.set_default(error(400, "invalid_request_error"))
    for _ in range(2):
        assert (await _post(either_limiter, headers)).status_code == 400
    up.set_default(answer("ok"))
    assert await _remaining_tokens(either_limiter, headers) == first - 4  # the failures hold nothing


async def test_a_request_cancelled_while_queued_gives_its_reservation_back(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admitted, then queued for the backend's one slot, then its client gone: nothing reached an
    upstream and nothing was counted, so it settles to 0 (it kept its whole worst case)."""
    gw = await keyed_gateway(start_gateway, up, monkeypatch, provider={"max_concurrency": 1})
    up.set_default(answer("ok"))  # 4 tokens
    headers = await _key(gw, tpm=TPM)
    first = await _remaining_tokens(gw, headers)  # TPM less one reservation
    up.set_default(played(answer("ok"), first_byte_delay_s=1.0))
    holder = asyncio.create_task(_post(gw, headers))  # holds the one slot for a second
    await wait_until(lambda: len(up.requests) == 2, what="the slot taken")
    with pytest.raises(httpx.ReadTimeout):
        await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=100), headers=headers, timeout=0.3)
    assert (await holder).status_code == 200
    up.set_default(answer("ok"))
    assert len(up.requests) == 2  # the queued one never reached the upstream
    await wait_until(lambda: _cancelled(gw), what="the queued request's row")
    assert await _remaining_tokens(gw, headers) == first - 4 - 4  # the first two settled to 4, the queued one to 0


async def _cancelled(gw: GatewayHandle) -> bool:
    return [row["status"] for row in await gw.ledger_rows()].count("cancelled") == 1


async def test_a_budgeted_request_without_max_tokens_sends_its_reserved_bound_upstream(
    either_limiter: GatewayHandle, up: ReplayUpstream
) -> None:
    """The worst case reserved the model's max output (`chat`: 1000), but the upstream was told no
    limit and answered 30,000 tokens: one answer spent 4.5 times the budget. The bound goes upstream
    for a key with a budget or `tpm`; a key with neither sends what the client sent."""
    up.set_default(answer("ok"))
    limited = await _key(either_limiter, budget_usd="1", budget_period="total")
    plain = await _key(either_limiter)
    for headers in (limited, plain):
        request = {"model": "chat", "messages": [{"role": "user", "content": [{"kind": "text", "data": "x"}]}]}
        assert (await either_limiter.client.post(COMPLETIONS, json=request, headers=headers)).status_code == 200
    sent = [received.json().get("max_tokens") for received in up.requests]
    assert sent == [1000, None]
