"""What a request may cost at most, before it is sent: the amount a budget and `tpm` reserve.

Input bound. The gateway has no tokenizer, but byte-level tokenizers never make more tokens than
bytes, so the UTF-8 byte length of everything the upstream tokenizes is an upper bound of the
prompt's tokens. Here that is the length of the JSON encoding of the messages, the system text,
the tools, the schema and the `provider_options` (merged into the upstream's body, where a `tools`
list or vLLM's `documents` are prompt too) (JSON escaping only adds bytes, and the structure's own bytes stand in
for a chat template's role markers), plus `MESSAGE_ALLOWANCE` per message and `TOOL_ALLOWANCE` per
tool for the template's special tokens, plus `MEDIA_ALLOWANCE` per image, audio or document part
(whose token count depends on the model's encoder; a part sent by URL has few bytes here).
A budget's bound is more: a medium sent by reference (a URL other than `data:`) has no bytes here
to bound it (a PDF by URL was 100,000 tokens where 8,192 were reserved, an image on Qwen2.5-VL up
to 16,384), so its request reserves the model's context window, which no served prompt exceeds
(`input_bounds`); `tpm` keeps the estimate, or every such request would pass no `tpm` below it.

Output bound: `max_tokens`, else the model's `max_output`, else its context window; a model with
none of them cannot be bounded, and a budgeted key gets a 400 asking for `max_tokens`.

Rates: for each backend the request may be routed to, the highest input-side rate (input, cache
read, cache write) and the highest output-side rate (output, reasoning), and the highest of those
over the backends: failover may land anywhere in the route. A backend with no input or output
price makes the budget unenforceable: 403 (access.md).

A backend with `gpu_hour_usd` is priced by its busy time, not by the catalog's rates (cost.md,
`cost_source: amortized`): a request's share of that time is at most its attempt's own time in
flight, which the provider's `timeouts.total` bounds, so its worst case there is
`gpu_hour_usd x total / 3600` (`time_bound_nano`), and the reservation is the larger of the two
bounds. Without it, a model with low catalog rates reserved next to nothing and settled at its
GPU time: seven concurrent requests spent seven times a budget.

Money is counted in whole nano-dollars (`NANO` per USD), rounded up, so that Redis can add and
compare it exactly (its Lua numbers are doubles: exact up to $9 million) and rounding never lets
the accounted spend fall below the real one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Any, NamedTuple

import msgspec

from app.errors import InvalidRequest, PermissionDenied
from catalog.keys import BudgetPeriod
from catalog.snapshot import CatalogSnapshot, ModelEntry, PriceRow
from providers.types import MEDIA_PARTS, AnyRequest, CompletionRequest, TextCompletionRequest

MESSAGE_ALLOWANCE = 16
TOOL_ALLOWANCE = 16
MEDIA_ALLOWANCE = 8192
NANO = Decimal(1_000_000_000)
_encode = msgspec.json.encode
NO_PRICE = "this model has no price, so a budget cannot be enforced"


def input_bounds(request: AnyRequest, context_window: int) -> tuple[int, int]:
    """(the input estimate `tpm` reserves, the bound a budget reserves: `context_window` at least
    when a medium is sent by reference) (module doc). Types are compared exactly
    (`providers.types.MEDIA_PARTS` says why): `isinstance` was a third of this function's cost,
    once per content part."""
    extra = _options_bound(request.provider_options) if request.provider_options else 0
    if type(request) is not CompletionRequest:
        assert isinstance(request, TextCompletionRequest)  # a match: `isinstance`'s fast path
        size = len(request.prompt.encode()) + MESSAGE_ALLOWANCE + extra
        return size, size
    size = len(_encode(request.messages)) + MESSAGE_ALLOWANCE * (len(request.messages) + 1) + extra
    if request.system:
        size += len(request.system.encode())
    if request.tools:
        size += len(_encode(request.tools)) + TOOL_ALLOWANCE * len(request.tools)
    if request.schema is not None:
        size += len(_encode(request.schema))
    by_reference = False
    for message in request.messages:  # a loop, not a generator: this runs per request
        for part in message.content:
            if type(part) in MEDIA_PARTS:
                size += MEDIA_ALLOWANCE
                if not by_reference:  # the first medium by reference decides
                    url = part.data.url  # type: ignore[union-attr]  # a medium's (`type` compared: above)
                    by_reference = url is not None and url[:5].lower() != "data:"  # `DATA:` is inline too
    return size, max(size, context_window) if by_reference else size


def _options_bound(options: dict[str, dict[str, Any]]) -> int:
    """`provider_options` go into the upstream's body as they are, and some become prompt tokens
    (`tools`, `functions`, vLLM's `documents` and `chat_template_kwargs`): every provider's
    options, bytes and a tool's allowance per listed tool, count (one budget request carried a
    200 kB tool description there and spent a hundred times its budget)."""
    size = len(_encode(options))
    for entry in options.values():
        for key in ("tools", "functions"):
            listed = entry.get(key)
            if isinstance(listed, list):
                size += TOOL_ALLOWANCE * len(listed)
    return size


def output_bound(request: AnyRequest, model: ModelEntry) -> int:
    bound = request.max_tokens or model.max_output or model.context_window
    if not bound:
        raise InvalidRequest(
            f"max_tokens: model '{model.id}' has no output limit; send max_tokens so a budget can be enforced",
            param="max_tokens",
        )
    return bound


class WorstRates(NamedTuple):
    """The worst-case rates of a route as integers over one power of ten (rate = R / `scale` USD per
    million tokens), and the span of time in which the prices they come from are the ones in effect
    (`start` inclusive, `end` exclusive; None: unbounded): the gate keeps them that long."""

    rate_in: int
    rate_out: int
    scale: int
    start: datetime | None
    end: datetime | None


def budget_priced(snapshot: CatalogSnapshot, provider: str, model: str, when: datetime) -> PriceRow | None:
    """The price row a budget can be enforced by on `provider` at `when` (input and output rates
    known), or None: the one test of `worst_rates` and of the model lists a key with a budget sees."""
    row = snapshot.price_at(provider, model, when)
    return row if row is not None and row.input is not None and row.output is not None else None


def worst_rates(snapshot: CatalogSnapshot, model: ModelEntry, providers: Iterable[str], when: datetime) -> WorstRates:
    """The highest input-side and output-side rates over `providers` at `when` (module doc)."""
    top_in, top_out = Decimal(0), Decimal(0)
    start: datetime | None = None
    end: datetime | None = None
    for provider in providers:
        row = budget_priced(snapshot, provider, model.id, when)
        if row is None:
            raise PermissionDenied(NO_PRICE)
        top_in = max(top_in, row.input or top_in, row.cache_read or top_in, row.cache_write or top_in)  # all ≥ 0
        top_out = max(top_out, row.output or top_out, row.reasoning or top_out)
        start = row.effective_from if start is None else max(start, row.effective_from)
        until = snapshot.price_until(provider, model.id, when)
        end = until if end is None or (until is not None and until < end) else end
    return WorstRates(*scaled((top_in, top_out)), start, end)


def scaled(rates: tuple[Decimal, Decimal]) -> tuple[int, int, int]:
    """Both rates as integers over one power of ten: (R_in, R_out, 10^k) with rate = R / 10^k."""
    digits = max(0, *(-int(rate.as_tuple().exponent) for rate in rates))
    return int(rates[0].scaleb(digits)), int(rates[1].scaleb(digits)), 10**digits


def worst_cost_nano(input_tokens: int, output_tokens: int, rates: WorstRates) -> int:
    """(in x rate_in + out x rate_out) / 10^6 USD in nano-dollars, rounded up: in integers (the
    rates scaled once to whole numbers), exact, without Decimal arithmetic per request."""
    cost = -(-(input_tokens * rates.rate_in + output_tokens * rates.rate_out) * 1000 // rates.scale)
    return cost if cost > 0 else 0


def time_bound_nano(gpu_hour_usd: Decimal, seconds: float) -> int:
    """The most `seconds` of a GPU at `gpu_hour_usd` can cost, in nano-dollars rounded up (exact:
    in fractions, as the amortized cost itself is computed)."""
    return math.ceil(Fraction(gpu_hour_usd) * Fraction(seconds) * 1_000_000_000 / 3600)


def to_nano(usd: Decimal | None) -> int:
    """USD as whole nano-dollars, rounded up; None (unpriced) and negative amounts are 0 (compared
    as integers: a Decimal compared with an int costs as much as the multiplication)."""
    if usd is None:
        return 0
    nano = math.ceil(usd * NANO)
    return nano if nano > 0 else 0


def from_nano(nano: int) -> Decimal:
    return Decimal(nano) / NANO


def period_bounds(period: BudgetPeriod, now: datetime) -> tuple[str, datetime | None, datetime | None]:
    """(tag, start, end) of the UTC calendar period holding `now`; `total` has neither."""
    if period == "total":
        return "total", None, None
    return _calendar(period, now.year, now.month, now.day)


@lru_cache(maxsize=16)
def _calendar(period: BudgetPeriod, year: int, month: int, day_of_month: int) -> tuple[str, datetime, datetime]:
    """The day's or month's bounds, computed once a day per period (strftime is slow per request)."""
    day = datetime(year, month, day_of_month, tzinfo=UTC)
    if period == "day":
        return f"d{day:%Y%m%d}", day, day + timedelta(days=1)
    start = day.replace(day=1)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return f"m{start:%Y%m}", start, end


def seconds_until(end: datetime | None, now: datetime) -> float | None:
    return None if end is None else max(1.0, math.ceil((end - now).total_seconds()))


def show_usd(amount: Decimal) -> str:
    """`12.50`, `0.000375`: at least cents, at most nano-dollars, no trailing zeros beyond cents."""
    text = format(amount.quantize(Decimal("0.000000001")), "f").rstrip("0")
    whole, _, cents = text.partition(".")
    return f"{whole}.{cents.ljust(2, '0')}"
