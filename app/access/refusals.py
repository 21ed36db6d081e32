"""The 429 of an admission the limiter refused (access.md, "What each limit answers")."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from app.access.keyring import Entry
from app.access.limiter import Ask, Verdict
from app.access.worstcase import from_nano, period_bounds, seconds_until, show_usd
from app.errors import BudgetExceeded, GatewayError, KeyRateLimited
from app.pipeline.events import RateHeaders, header_texts


def refusal(entry: Entry, ask: Ask, verdict: Verdict, headers: RateHeaders, now: datetime) -> GatewayError:
    """The 429 of a refused admission. A request that reserves more tokens than the key's `tpm`
    could never pass, however long it waited: it gets no `Retry-After` (a client would retry it
    forever), and access.md's message goes on to say what to change, as OpenAI's "Request too
    large" does. A refusal no short wait can lift (that one, a spent budget of any period) also
    says `x-should-retry: false`, which the OpenAI and Anthropic SDKs read before anything else:
    the Python ones retried a 429 without `Retry-After` (or with one past 60 s) twice, each refused
    again, and the JS ones wait out any `Retry-After` — a `month` budget's had an agent loop sleep
    until the month ended. The budget's `Retry-After` stays (access.md). The exception: a `total`
    budget refused only for what requests still in flight reserved (its settled spend and this
    request alone would pass): it has no `Retry-After`, and a retry passes once they settle for
    less than their worst case, so the SDKs' own backoff may lift it."""
    record = entry.record
    error: GatewayError
    final = False
    if verdict.refused == "tpm" and ask.tokens > entry.tpm:
        message = (
            f"rate limit reached for this API key (tpm): this request alone reserves {ask.tokens} tokens "
            f"(its input and max_tokens), more than the limit of {entry.tpm} a minute; lower max_tokens"
        )
        error, final = KeyRateLimited(message), True
    elif verdict.refused == "budget":
        period = record.budget_period or "total"
        _tag, _start, end = period_bounds(period, now)
        spent, budget = show_usd(from_nano(verdict.spent)), show_usd(record.budget_usd or Decimal(0))
        message = f"budget exceeded: spent ${spent} of ${budget} this {period}"
        error = BudgetExceeded(message, retry_after=seconds_until(end, now))
        final = error.retry_after is not None or verdict.spent + ask.cost > ask.budget
    else:
        which = verdict.refused
        error = KeyRateLimited(f"rate limit reached for this API key ({which})", retry_after=verdict.retry_after)
    error.extra_headers = header_texts(headers)
    if final:
        error.extra_headers["x-should-retry"] = "false"
    return error
