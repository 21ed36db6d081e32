"""The whole gateway in front of a real `transformers serve`: HTTP in, HTTP/SSE and a ledger row out.

The catalog's `tiny-local` model has one deployment, on the `local` provider, whose upstream model
is the tiny model's directory (the name that server insists on). Answers are noise, so the text is
only checked for being there (and, streamed, for adding up to the final response's text); status,
provider, stop reason, the five usage buckets, the cost and the ledger row are checked exactly.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.catalog import catalog_toml, model, price
from tests.support.client import body, parse_sse, post, types

if TYPE_CHECKING:
    from tests.local.conftest import LocalServer, PromptTokens
    from tests.support.gateway import GatewayHandle, StartGateway

MAX_TOKENS = 5
PROMPT = "What is the weather like in Paris today?"
PRICE_IN, PRICE_OUT = Decimal("0.10"), Decimal("0.40")


def _catalog(upstream_model: str) -> str:
    return catalog_toml(
        model("tiny-local", ("local", upstream_model, 100), context_window=1024, max_output=256, default=True),
        prices=[price("local", "tiny-local", str(PRICE_IN), str(PRICE_OUT))],
    )


def _request(*, stream: bool) -> dict[str, Any]:
    return body("tiny-local", stream=stream, text=PROMPT, max_tokens=MAX_TOKENS)


def _expected_usage(prompt_tokens: PromptTokens) -> dict[str, int]:
    return {
        "input_tokens": prompt_tokens([("user", PROMPT)]),
        "output_tokens": MAX_TOKENS,
        "reasoning_tokens": 0,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }


def _cost(usage: dict[str, int]) -> Decimal:
    return (usage["input_tokens"] * PRICE_IN + usage["output_tokens"] * PRICE_OUT) / Decimal(1_000_000)


def _assert_response(body: dict[str, Any], request_id: str, usage: dict[str, int]) -> str:
    """The exact non-streaming response, text aside; returns that text."""
    body = dict(body)
    message = body.pop("message")
    assert message["role"] == "assistant"
    (part,) = message["content"]
    assert part["kind"] == "text"
    assert isinstance(part["data"], str)
    assert part["data"]
    assert body == {
        "id": request_id,
        "model": "tiny-local",
        "provider": "local",
        "stop_reason": "max_tokens",
        "usage": usage,
        "output": None,
        "cost_usd": _cost(usage),
        "cost_source": "estimated",
    }
    text: str = part["data"]
    return text


async def _assert_ledger_row(
    gw: GatewayHandle, request_id: str, server: LocalServer, usage: dict[str, int], *, streamed: bool
) -> None:
    (row,) = await gw.ledger_rows()
    assert row["request_id"] == request_id
    assert (row["model"], row["provider"], row["upstream_model"]) == ("tiny-local", "local", server.model)
    assert (row["status"], row["streamed"], row["attempts"], row["stop_reason"]) == (
        "ok",
        streamed,
        1,
        "max_tokens",
    )
    assert isinstance(row["upstream_request_id"], str)
    assert row["upstream_request_id"]
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_tokens"]) == (
        usage["input_tokens"],
        MAX_TOKENS,
        0,
    )
    assert (row["cache_read_tokens"], row["cache_write_tokens"]) == (0, 0)
    assert Decimal(row["cost_usd"]) == _cost(usage)
    assert row["cost_source"] == "estimated"
    assert row["price_id"] is not None
    assert row["error_type"] is None


@pytest.fixture
async def gw(start_gateway: StartGateway, transformers_server: LocalServer) -> GatewayHandle:
    providers = {"local": {"kind": "local", "base_url": transformers_server.base_url}}
    return await start_gateway(providers=providers, catalog=_catalog(transformers_server.model))


async def test_json_completion_through_the_gateway(
    gw: GatewayHandle, transformers_server: LocalServer, prompt_tokens: PromptTokens
) -> None:
    response = await post(gw, _request(stream=False))

    assert response.status_code == 200, response.text
    request_id = response.headers["x-request-id"]
    usage = _expected_usage(prompt_tokens)
    _assert_response(response.json(parse_float=Decimal), request_id, usage)
    await _assert_ledger_row(gw, request_id, transformers_server, usage, streamed=False)


async def test_streamed_completion_through_the_gateway(
    gw: GatewayHandle, transformers_server: LocalServer, prompt_tokens: PromptTokens
) -> None:
    response = await post(gw, _request(stream=True))

    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    request_id = response.headers["x-request-id"]
    frames = parse_sse(response.text)
    assert {event for event, _ in frames} == {"stream_event"}
    kinds = types(frames)
    deltas = kinds[2:-2]
    assert kinds[:2] == ["stream_start", "text_start"]
    assert kinds[-2:] == ["text_end", "finish"]
    assert 1 <= len(deltas) <= MAX_TOKENS
    assert set(deltas) == {"text_delta"}

    data = [payload for _, payload in frames]
    assert data[0] == {"type": "stream_start", "id": request_id, "model": "tiny-local", "provider": "local"}
    usage = _expected_usage(prompt_tokens)
    finish = data[-1]
    assert (finish["finish_reason"], finish["stop_reason"], finish["usage"]) == ("length", "max_tokens", usage)
    text = _assert_response(finish["response"], request_id, usage)
    assert "".join(frame["delta"] for frame in data[2:-2]) == text
    await _assert_ledger_row(gw, request_id, transformers_server, usage, streamed=True)
