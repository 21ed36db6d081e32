"""The OpenAI-compatible ingress through real clients: the `openai` SDK (sync and async) and
LangChain's `ChatOpenAI`, pointed at a real gateway (`base_url = gw.url + "/v1"`).

Two loopback upstreams (`primary`, a `local` kind, and `secondary`, a hosted one) over this catalog:
- `chat-1` (alias `chat`, the default): primary (deployment priority 100), secondary (50);
  priced on primary with a cache-read rate, on secondary without; takes raw prompts too
  (`completions`, for `POST /v1/completions`);
- `solo-1`: primary only, priced, chat only (no `completions` capability);
- `free-1`: primary only, unpriced (`cost: null`).

The sync clients block: tests call them through `asyncio.to_thread`, since the gateway runs in the
test's own event loop. Clients never retry (`max_retries=0`), so a queued upstream reply is used
exactly once and an error status reaches the test as the SDK's exception.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from typing import Any

import openai
import pytest

from tests.support.catalog import catalog_toml, model, price
from tests.support.gateway import GatewayHandle, StartGateway, provider_table
from tests.support.upstream import ReplayUpstream, upstream_fixture

CATALOG = catalog_toml(
    model(
        "chat-1",
        ("primary", "org/chat-1-instruct", 100),
        ("secondary", "chat-1-hosted", 50),
        aliases=["chat"],
        context_window=32768,
        max_output=4096,
        capabilities=["tools", "reasoning", "structured_output", "vision", "completions"],
        default=True,
    ),
    model("solo-1", ("primary", "org/solo-1", 100), aliases=["solo"]),
    model("free-1", ("primary", "org/free-1", 100)),
    prices=[
        price("primary", "chat-1", "0.10", "0.40", cache_read="0.025"),
        price("secondary", "chat-1", "1.00", "2.00"),
        price("primary", "solo-1", "0.10", "0.40", cache_read="0.025"),
    ],
)
P_IN, P_OUT, P_CACHE = Decimal("0.10"), Decimal("0.40"), Decimal("0.025")

primary = upstream_fixture("primary")
secondary = upstream_fixture("secondary")


def primary_cost(input_tokens: int, output_tokens: int, reasoning: int = 0, cache_read: int = 0) -> Decimal:
    """What the primary's price rows make of the five buckets (no cache-write rate: none used here)."""
    return (input_tokens * P_IN + (output_tokens + reasoning) * P_OUT + cache_read * P_CACHE) / Decimal(1_000_000)


def providers_for(primary: ReplayUpstream, secondary: ReplayUpstream) -> dict[str, Any]:
    return provider_table(
        {"primary": primary, "secondary": secondary},
        primary={"kind": "local", "priority": 10},
        secondary={"priority": 5},
    )


@pytest.fixture
async def gw(start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream) -> GatewayHandle:
    return await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG)


@pytest.fixture
def client(gw: GatewayHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


@pytest.fixture
async def aclient(gw: GatewayHandle) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


def upstream_body(upstream: ReplayUpstream, index: int = -1) -> dict[str, Any]:
    """The JSON body of a completion request the upstream received."""
    body: dict[str, Any] = upstream.requests[index].json()
    return body
