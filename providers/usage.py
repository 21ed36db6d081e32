"""Upstream usage reports → the five disjoint token buckets, and the upstream's own billed cost.

Every OpenAI-style host reports `prompt_tokens`/`completion_tokens` as totals with optional detail
breakdowns that *overlap* them (cached and cache-write tokens are part of the prompt, reasoning
tokens part of the completion). The ledger wants disjoint buckets whose sum is every token
counted, so the details are subtracted out here, once:

    cache_read_tokens   prompt_tokens_details.cached_tokens (DeepSeek: prompt_cache_hit_tokens)
    cache_write_tokens  prompt_tokens_details.cache_write_tokens, else 0
    input_tokens        prompt_tokens - cache read - cache write
    reasoning_tokens    completion_tokens_details.reasoning_tokens
    output_tokens       completion_tokens - reasoning

A detail may be missing, `null` or `{}` (all mean 0), and is clamped into `[0, total]`, so a
host's inconsistent numbers never produce a negative bucket.

Authoritative cost: OpenRouter-style `usage.cost` is USD, Perplexity's `usage.cost` an object whose
`total_cost` is (its search fee included: drift shows the gap to the catalog's token prices; the
object used to fail the whole report, tokens included), xAI's `usage.cost_in_usd_ticks` is
10^10 ticks per USD. Both become an exact `Decimal`: `OpenAIUsage` declares `cost` as `Decimal`,
and msgspec decodes a JSON number into a Decimal field from its text, so `0.000123456789` is never
a float on the way. Digits past the ledger's 18 decimal places (`LEDGER_SCALE`) are rounded off
(half to even) here, once: the answer said `0.000123456789012345678` while the ledger kept
`0.000123456789012346`, and the reports' sums were not the sums of what clients were told.
"""

from __future__ import annotations

from decimal import Decimal

from msgspec import Struct

from providers.events import Usage, UsageReport

TICKS_EXPONENT = -10  # xAI: 1 USD = 10^10 ticks
# Past these a report is a broken counter (an unsigned wrap-around, a garbage field), not one
# request's usage or bill: it is read as no report, so the row keeps unknown usage instead of
# being refused by the ledger's columns (a cost has 12 integer digits) or overflowing a report's sums.
MAX_REPORTED_TOKENS = 10**9
MAX_BILLED_USD = Decimal(10**9)
LEDGER_SCALE = 18  # the ledger's cost columns' decimal places (catalog.exact.COST_SCALE)
_LEDGER_QUANTUM = Decimal(1).scaleb(-LEDGER_SCALE)


class PromptTokensDetails(Struct):
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None


class CompletionTokensDetails(Struct):
    reasoning_tokens: int | None = None


class CostBreakdown(Struct):
    """Perplexity's `usage.cost`: an object, whose `total_cost` is the USD billed (the others are
    its parts: tokens, the request's search fee)."""

    total_cost: Decimal | None = None


class OpenAIUsage(Struct):
    """`usage` of an OpenAI-style response or chunk, with the vendor extensions we read."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None
    prompt_cache_hit_tokens: int | None = None  # DeepSeek
    cost: Decimal | CostBreakdown | None = None  # OpenRouter: USD billed; Perplexity: a breakdown
    cost_in_usd_ticks: int | None = None  # xAI: 10^10 ticks per USD


def _clamp(value: int | None, high: int) -> int:
    if value is None or value <= 0:
        return 0
    return min(value, high)


def openai_buckets(usage: OpenAIUsage) -> Usage:
    """The five disjoint buckets of an OpenAI-style usage report."""
    prompt = max(usage.prompt_tokens or 0, 0)
    completion = max(usage.completion_tokens or 0, 0)
    prompt_details = usage.prompt_tokens_details
    cached = prompt_details.cached_tokens if prompt_details is not None else None
    if cached is None:
        cached = usage.prompt_cache_hit_tokens
    cache_read = _clamp(cached, prompt)
    written = prompt_details.cache_write_tokens if prompt_details is not None else None
    cache_write = _clamp(written, prompt - cache_read)
    completion_details = usage.completion_tokens_details
    reasoning = _clamp(completion_details.reasoning_tokens if completion_details else None, completion)
    return Usage(
        input_tokens=prompt - cache_read - cache_write,
        output_tokens=completion - reasoning,
        reasoning_tokens=reasoning,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
    )


def counts_tokens(usage: OpenAIUsage) -> bool:
    """Whether `usage` is a report at all: it gives both totals, `prompt_tokens` and
    `completion_tokens`. An empty `usage: {}` (some servers send one on every chunk) or one that
    lacks a total is not: read as a report, it would invent zeros that look like a count
    (ingress.md) — the request's usage stays unknown (NULL in the ledger) unless a later chunk
    reports it. A report without the totals but with a billed `cost` is dropped with them: the
    buckets cannot be known, and a cost whose tokens are unknown cannot be checked (drift). A
    total no count can be (negative, or past `MAX_REPORTED_TOKENS`) makes it no report either:
    read as zero it would be a count of nothing at no cost."""
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    return (
        prompt is not None
        and completion is not None
        and 0 <= prompt <= MAX_REPORTED_TOKENS
        and 0 <= completion <= MAX_REPORTED_TOKENS
    )


def openai_cost(usage: OpenAIUsage) -> Decimal | None:
    """The cost the upstream says it billed, in USD, or None when it did not say — or said
    something no bill can be (a negative amount, not a number, a billion dollars): then the catalog's estimate is
    the cost, as for any upstream that reports none."""
    cost = usage.cost
    if isinstance(cost, CostBreakdown):
        cost = cost.total_cost
    if cost is not None and cost.is_finite() and 0 <= cost < MAX_BILLED_USD:
        exponent = cost.as_tuple().exponent
        if isinstance(exponent, int) and exponent < -LEDGER_SCALE:
            cost = cost.quantize(_LEDGER_QUANTUM)  # the digits the ledger keeps (module doc)
            return Decimal(format(cost.normalize(), "f"))  # no trailing zeros, no exponent
        return cost
    if usage.cost_in_usd_ticks is not None and 0 <= usage.cost_in_usd_ticks < MAX_BILLED_USD.scaleb(-TICKS_EXPONENT):
        return Decimal(usage.cost_in_usd_ticks).scaleb(TICKS_EXPONENT)
    return None


def openai_report(usage: OpenAIUsage) -> UsageReport:
    return UsageReport(usage=openai_buckets(usage), cost_usd=openai_cost(usage))
