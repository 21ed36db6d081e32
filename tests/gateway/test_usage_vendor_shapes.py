"""Usage reports whose totals are sound but whose vendor extensions have another shape than the
one the gateway reads, and the ledger row of an answer that failed after reporting its usage."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tests.gateway.conftest import primary_cost
from tests.support.client import body, post, stream
from tests.support.gateway import GatewayHandle
from tests.support.replies import chunk
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse

# Perplexity's chat completions (an OpenAI-compatible host): `usage.cost` is a breakdown object,
# not a number; `prompt_tokens` and `completion_tokens` are the counts it billed.
PERPLEXITY_USAGE: dict[str, Any] = {
    "prompt_tokens": 100,
    "completion_tokens": 20,
    "total_tokens": 120,
    "search_context_size": "low",
    "cost": {"input_tokens_cost": 0.0001, "output_tokens_cost": 0.00002, "request_cost": 0.005, "total_cost": 0.00512},
}


def whole(usage: dict[str, Any], finish: str = "stop", upstream_id: str = "chatcmpl-up-1") -> dict[str, Any]:
    return {
        "id": upstream_id,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": finish}],
        "usage": usage,
    }


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_a_cost_breakdown_object_keeps_the_reported_tokens(
    gw: GatewayHandle, primary: ReplayUpstream, streamed: bool
) -> None:
    """The totals were reported: the row must not say unknown (NULL) and unpriced because of
    another vendor's shape of `usage.cost` (providers.md: NULL only when the upstream did not
    report them; cost.md: a priced model with known usage has a cost)."""
    if streamed:
        primary.enqueue(reply_sse([chunk({"content": "Hi"}), chunk({}, "stop"), chunk(None, usage=PERPLEXITY_USAGE)]))
        _, frames = await stream(gw)
        answer = frames[-1][1]["response"]
    else:
        primary.enqueue(reply_json(200, whole(PERPLEXITY_USAGE)))
        response = await post(gw, body("chat-1"))
        assert response.status_code == 200, response.text
        answer = response.json(parse_float=Decimal)
    (row,) = await gw.ledger_rows()
    assert (row["input_tokens"], row["output_tokens"]) == (100, 20)
    assert answer["usage"]["input_tokens"] == 100
    assert (Decimal(row["cost_usd"]), row["cost_source"]) == (Decimal("0.00512"), "authoritative")  # what it billed
    assert Decimal(str(answer["cost_usd"])) == Decimal("0.00512")
    assert Decimal(row["estimated_cost_usd"]) == primary_cost(100, 20)


async def test_a_whole_answer_that_failed_after_its_usage_keeps_the_upstream_id(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """vLLM's `abort` in a whole answer: the row keeps the usage the upstream billed (README), and
    so must keep the id the upstream billed it under, as a streamed `abort` does."""
    primary.enqueue(reply_json(200, whole({"prompt_tokens": 9, "completion_tokens": 2}, "abort", "chatcmpl-aborted")))
    response = await post(gw, body("chat-1", provider="primary"))
    assert response.status_code == 502
    (row,) = await gw.ledger_rows()
    assert (row["status"], row["input_tokens"], row["output_tokens"]) == ("error", 9, 2)
    assert row["upstream_request_id"] == "chatcmpl-aborted"
