"""The `openai` SDK through the gateway's chat ingress to a real `transformers serve` (the `local` kind).

Answers are noise, so text is only checked for being there and adding up; the finish reason, the
inclusive usage, the exact cost and the ledger row are checked exactly.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import openai
import pytest

from tests.support.catalog import catalog_toml, model, price

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.local.conftest import LocalServer, PromptTokens
    from tests.support.gateway import GatewayHandle, StartGateway

MAX_TOKENS = 5
PROMPT = "What is the weather like in Paris today?"
PRICE_IN, PRICE_OUT = Decimal("0.10"), Decimal("0.40")
MESSAGES: list[Any] = [{"role": "user", "content": PROMPT}]


@pytest.fixture
async def gw(start_gateway: StartGateway, transformers_server: LocalServer) -> GatewayHandle:
    catalog = catalog_toml(
        model(
            "tiny-local", ("local", transformers_server.model, 100), context_window=1024, max_output=256, default=True
        ),
        prices=[price("local", "tiny-local", str(PRICE_IN), str(PRICE_OUT))],
    )
    providers = {"local": {"kind": "local", "base_url": transformers_server.base_url}}
    return await start_gateway(providers=providers, catalog=catalog)


@pytest.fixture
async def sdk(gw: GatewayHandle) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def expected_usage(prompt_tokens: PromptTokens) -> dict[str, Any]:
    prompt = prompt_tokens([("user", PROMPT)])
    return {
        "prompt_tokens": prompt,
        "completion_tokens": MAX_TOKENS,
        "total_tokens": prompt + MAX_TOKENS,
        "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
        "cost": (prompt * PRICE_IN + MAX_TOKENS * PRICE_OUT) / Decimal(1_000_000),
        "cost_source": "estimated",
    }


async def assert_ledger_row(gw: GatewayHandle, request_id: str, prompt: int, *, streamed: bool) -> None:
    (row,) = await gw.ledger_rows()
    assert (row["request_id"], row["api"], row["model"], row["provider"]) == (
        request_id,
        "openai_chat",
        "tiny-local",
        "local",
    )
    assert (row["status"], row["streamed"], row["stop_reason"]) == ("ok", streamed, "max_tokens")
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_tokens"]) == (prompt, MAX_TOKENS, 0)
    assert Decimal(row["cost_usd"]) == (prompt * PRICE_IN + MAX_TOKENS * PRICE_OUT) / Decimal(1_000_000)


async def test_chat_completion(gw: GatewayHandle, sdk: openai.AsyncOpenAI, prompt_tokens: PromptTokens) -> None:
    raw = await sdk.chat.completions.with_raw_response.create(
        model="tiny-local", messages=MESSAGES, max_tokens=MAX_TOKENS
    )

    completion = raw.parse()
    request_id = raw.headers["x-request-id"]
    assert (completion.id, completion.model, completion.object) == (request_id, "tiny-local", "chat.completion")
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content
    usage = expected_usage(prompt_tokens)
    assert json.loads(raw.http_response.text, parse_float=Decimal)["usage"] == usage
    await assert_ledger_row(gw, request_id, usage["prompt_tokens"], streamed=False)


async def test_streamed_chat_completion(
    gw: GatewayHandle, sdk: openai.AsyncOpenAI, prompt_tokens: PromptTokens
) -> None:
    """Read chunk by chunk (the SDK's `stream()` helper refuses a `length` finish: it raises
    `LengthFinishReasonError`, and a tiny model always runs to the token limit)."""
    stream = await sdk.chat.completions.create(
        model="tiny-local",
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]

    role, *deltas, finish, last = chunks
    assert role.choices[0].delta.role == "assistant"
    texts = [c.choices[0].delta.content for c in deltas]
    assert 1 <= len(texts) <= MAX_TOKENS
    assert all(texts)
    assert (finish.choices[0].delta.content, finish.choices[0].finish_reason) == (None, "length")
    assert {c.id for c in chunks} == {role.id}
    assert {c.model for c in chunks} == {"tiny-local"}
    usage = expected_usage(prompt_tokens)
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.model_dump(exclude={"cost", "cost_source"}, exclude_none=True) == {
        k: v for k, v in usage.items() if k not in ("cost", "cost_source")
    }
    assert Decimal(str(last.usage.model_extra["cost"])) == usage["cost"]  # type: ignore[index]
    await assert_ledger_row(gw, role.id, usage["prompt_tokens"], streamed=True)
