"""The catalog the gateway tests run against, and the price arithmetic they check by hand."""

from __future__ import annotations

from decimal import Decimal

CATALOG = """
[models."chat-1"]
aliases = ["chat"]
context_window = 32768
max_output = 4096
capabilities = ["tools", "reasoning", "structured_output"]
default = true

[[models."chat-1".deployments]]
provider = "primary"
upstream_model = "org/chat-1-instruct"
priority = 100

[[models."chat-1".deployments]]
provider = "secondary"
upstream_model = "chat-1-hosted"
priority = 50

[models."vision-1"]
context_window = 8192
max_output = 1024
capabilities = ["vision"]

[[models."vision-1".deployments]]
provider = "primary"
upstream_model = "org/vision-1"
priority = 10

[[prices]]
provider = "primary"
model = "chat-1"
effective_from = 2026-01-01
input = "0.10"
output = "0.40"
cache_read = "0.025"

[[prices]]
provider = "secondary"
model = "chat-1"
effective_from = 2026-01-01
input = "1.00"
output = "2.00"
"""

PRIMARY = Decimal("0.10"), Decimal("0.40"), Decimal("0.025")


def primary_cost(input_tokens: int, output_tokens: int, reasoning: int = 0, cache_read: int = 0) -> Decimal:
    p_in, p_out, p_cache = PRIMARY
    return (input_tokens * p_in + (output_tokens + reasoning) * p_out + cache_read * p_cache) / Decimal(1_000_000)
