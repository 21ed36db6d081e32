"""What the Anthropic ingress tests route over (their fixtures are in `anthropic_fixtures`):
two loopback upstreams, `primary` and `secondary`, and this catalog:
- `chat-1` (alias `claude-gateway`, the default): primary (deployment priority 100), secondary
  (50); priced on both, primary with a cache-read rate;
- `vision-1`: primary only, with the `vision` and `documents` capabilities, unpriced.
`primary_cost` is the price arithmetic the tests check by hand.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tests.support.catalog import catalog_toml, model, price
from tests.support.gateway import provider_table
from tests.support.upstream import ReplayUpstream

CATALOG = catalog_toml(
    model(
        "chat-1",
        ("primary", "org/chat-1-instruct", 100),
        ("secondary", "chat-1-hosted", 50),
        aliases=["claude-gateway"],
        context_window=131072,
        max_output=32768,  # room for a thinking budget of 16,384 below max_tokens
        capabilities=["tools", "reasoning"],
        default=True,
    ),
    model("vision-1", ("primary", "org/vision-1", 10), capabilities=["vision", "documents"]),
    prices=[
        price("primary", "chat-1", "0.10", "0.40", cache_read="0.025"),
        price("secondary", "chat-1", "1.00", "2.00"),
    ],
)
PRIMARY = Decimal("0.10"), Decimal("0.40"), Decimal("0.025")


def primary_cost(input_tokens: int, output_tokens: int, reasoning: int = 0, cache_read: int = 0) -> Decimal:
    p_in, p_out, p_cache = PRIMARY
    return (input_tokens * p_in + (output_tokens + reasoning) * p_out + cache_read * p_cache) / Decimal(1_000_000)


def providers_for(
    primary: ReplayUpstream, secondary: ReplayUpstream, overrides: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    extra = overrides or {}
    return provider_table(
        {"primary": primary, "secondary": secondary},
        primary={"priority": 10, **extra.get("primary", {})},
        secondary={"priority": 5, **extra.get("secondary", {})},
    )
