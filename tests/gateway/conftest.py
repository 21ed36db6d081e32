"""Two loopback upstreams (`primary`, a `local` kind, and `secondary`, a hosted one) and a gateway
routed to them, over this catalog:
- `chat-1` (alias `chat`, the default): primary (deployment priority 100), secondary (50);
  priced on both, primary with a cache-read rate;
- `vision-1`: primary only, unpriced.
`primary_cost` is the price arithmetic the tests check by hand.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tests.support.catalog import catalog_toml, model, price
from tests.support.gateway import GatewayHandle, StartGateway, provider_table
from tests.support.upstream import ReplayUpstream, upstream_fixture

CHAT_1 = model(
    "chat-1",
    ("primary", "org/chat-1-instruct", 100),
    ("secondary", "chat-1-hosted", 50),
    aliases=["chat"],
    context_window=32768,
    max_output=4096,
    capabilities=["tools", "reasoning", "structured_output"],
    default=True,
)
CATALOG = catalog_toml(
    CHAT_1,
    model("vision-1", ("primary", "org/vision-1", 10), capabilities=["vision"]),
    prices=[
        price("primary", "chat-1", "0.10", "0.40", cache_read="0.025"),
        price("secondary", "chat-1", "1.00", "2.00"),
    ],
)
PRIMARY = Decimal("0.10"), Decimal("0.40"), Decimal("0.025")

primary = upstream_fixture("primary")
secondary = upstream_fixture("secondary")


def primary_cost(input_tokens: int, output_tokens: int, reasoning: int = 0, cache_read: int = 0) -> Decimal:
    p_in, p_out, p_cache = PRIMARY
    return (input_tokens * p_in + (output_tokens + reasoning) * p_out + cache_read * p_cache) / Decimal(1_000_000)


def providers_for(
    primary: ReplayUpstream, secondary: ReplayUpstream, overrides: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    extra = overrides or {}
    return provider_table(
        {"primary": primary, "secondary": secondary},
        primary={"kind": "local", "priority": 10, **extra.get("primary", {})},
        secondary={"priority": 5, **extra.get("secondary", {})},
    )


@pytest.fixture
async def gw(start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream) -> GatewayHandle:
    return await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG)
