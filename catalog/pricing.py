"""Cost arithmetic: five token buckets times the price row in effect, exactly (cost.md).

```
cost = input·p_in + cache_read·p_cache_read + cache_write·p_cache_write
     + output·p_out + reasoning·(p_reasoning or p_out)          all per 1e6 tokens
```

A bucket with tokens but no rate makes the whole cost unknown (`None`, "unpriced"), never free —
except cache reads, which fall back to the input rate, and reasoning, which falls back to the
output rate. A bucket with zero tokens needs no rate. Unknown usage (a `None` bucket) is an unknown
cost. The arithmetic runs in a local 50-digit context and is never rounded: rounding is for display.
"""

from __future__ import annotations

import decimal
from decimal import Decimal

from catalog.snapshot import PriceRow

_CONTEXT = decimal.Context(prec=50, rounding=decimal.ROUND_HALF_EVEN, traps=[decimal.InvalidOperation, decimal.Inexact])
_PER_TOKENS = Decimal(1_000_000)


def _rates(price: PriceRow) -> tuple[Decimal | None, ...]:
    """Rates in the order of `estimate_cost`'s buckets, with the spec's two fallbacks applied."""
    cache_read = price.cache_read if price.cache_read is not None else price.input
    reasoning = price.reasoning if price.reasoning is not None else price.output
    return (price.input, cache_read, price.cache_write, price.output, reasoning)


def estimate_cost(
    price: PriceRow | None,
    *,
    input_tokens: int | None,
    output_tokens: int | None,
    reasoning_tokens: int | None,
    cache_read_tokens: int | None,
    cache_write_tokens: int | None,
) -> Decimal | None:
    """The exact USD cost of one request's usage at `price`, or None when it cannot be known."""
    if price is None:
        return None
    buckets = (input_tokens, cache_read_tokens, cache_write_tokens, output_tokens, reasoning_tokens)
    total = Decimal(0)
    for tokens, rate in zip(buckets, _rates(price), strict=True):
        if tokens is None:
            return None
        if tokens < 0:
            raise ValueError(f"negative token count {tokens}")
        if tokens == 0:
            continue
        if rate is None:
            return None
        total = _CONTEXT.add(total, _CONTEXT.multiply(Decimal(tokens), rate))
    return _CONTEXT.divide(total, _PER_TOKENS)
