"""A budget's reservation for a medium sent by reference (an image, audio or document by URL).

The input bound is the request's bytes (access.md: byte-level tokenizers never make more tokens
than bytes), but a part sent by URL has almost none here: the upstream fetches it and counts what
it holds. A PDF by URL was reserved as 8,192 tokens and billed as 100,000, so one request spent
twice its key's budget. Such a request reserves the model's context window (no served prompt is
longer); `tpm` keeps the estimate, and an inline medium (its bytes counted) reserves no more.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tests.access.conftest import ADMIN, ADMIN_ENV, bearer
from tests.support.catalog import catalog_toml, model, price
from tests.support.client import COMPLETIONS
from tests.support.gateway import GatewayHandle, StartGateway, provider_table
from tests.support.upstream import ReplayUpstream, reply_json, upstream_fixture

CATALOG = catalog_toml(
    model("doc", ("up", "up-doc"), context_window=131072, max_output=1000, capabilities=("documents", "vision")),
    prices=[price("up", "doc", "1", "1")],  # a dollar per million tokens, in and out
)
PDF_URL = {
    "kind": "document",
    "data": {"url": "https://example.com/annual-report.pdf", "media_type": "application/pdf"},
}
PDF_INLINE = {"kind": "document", "data": {"data": "JVBERi0xLjQK", "media_type": "application/pdf"}}

up = upstream_fixture("up")


def read(part: dict[str, Any]) -> dict[str, Any]:
    content = [{"kind": "text", "data": "Summarise this."}, part]
    return {"model": "doc", "max_tokens": 10, "messages": [{"role": "user", "content": content}]}


def billed(prompt_tokens: int) -> Any:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 10, "total_tokens": prompt_tokens + 10}
    choice = {"index": 0, "message": {"role": "assistant", "content": "A summary."}, "finish_reason": "stop"}
    return reply_json(200, {"id": "chatcmpl-d1", "object": "chat.completion", "choices": [choice], "usage": usage})


async def gateway(start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch) -> GatewayHandle:
    monkeypatch.setenv(ADMIN_ENV, ADMIN)
    auth = {"mode": "keys", "admin_key_env": ADMIN_ENV}
    return await start_gateway(providers=provider_table({"up": up}), catalog=CATALOG, auth=auth)


async def secret(gw: GatewayHandle, **options: Any) -> str:
    made = await gw.client.post("/api/v1/keys", json={"name": "reader", **options}, headers=bearer(ADMIN))
    assert made.status_code == 201, made.text
    value: str = made.json()["secret"]
    return value


async def test_a_document_by_url_reserves_the_context_window_so_the_budget_holds(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = await gateway(start_gateway, up, monkeypatch)
    small = await secret(gw, budget_usd="0.05", budget_period="total")
    up.set_default(billed(100_000))  # what the upstream counts in the PDF: $0.10001, twice the budget
    refused = await gw.client.post(COMPLETIONS, json=read(PDF_URL), headers=bearer(small))
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"] == {
        "message": "budget exceeded: spent $0.00 of $0.05 this total",
        "type": "insufficient_quota",
        "code": 429,
        "request_id": refused.headers["x-request-id"],
    }
    assert up.requests == []  # never sent: 131,082 tokens at $1/M may cost $0.131082
    me = (await gw.client.get("/api/v1/keys/me", headers=bearer(small))).json()
    assert me["spent_usd"] == "0"

    up.enqueue(billed(300))
    inline = await gw.client.post(COMPLETIONS, json=read(PDF_INLINE), headers=bearer(small))
    assert inline.status_code == 200, inline.text  # its bytes are counted: a few hundred tokens reserved
    assert Decimal(str(inline.json()["cost_usd"])) == Decimal("0.00031")

    large = await secret(gw, budget_usd="1", budget_period="total", tpm=20_000)
    admitted = await gw.client.post(COMPLETIONS, json=read(PDF_URL), headers=bearer(large))
    assert admitted.status_code == 200, admitted.text  # `tpm` reserves the estimate, not the window
    assert Decimal(str(admitted.json()["cost_usd"])) == Decimal("0.10001")
    me = (await gw.client.get("/api/v1/keys/me", headers=bearer(large))).json()
    assert me["spent_usd"] == "0.10001"
