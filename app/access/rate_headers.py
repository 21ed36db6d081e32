"""An API key's `x-ratelimit-*` headers (access.md, OpenAI's names): `x-ratelimit-{limit,remaining,
reset}-requests` when the key has `rpm`, `-tokens` when it has `tpm`, made by one format of the
key's template (`Entry.rate_template`) per response. Resets are durations in OpenAI's style (`1s`,
`6m0s`)."""

from __future__ import annotations

from functools import lru_cache

from app.access.keyring import Entry
from app.access.limiter import Verdict
from app.pipeline.events import RateHeaders


def rate_headers(entry: Entry, verdict: Verdict) -> RateHeaders:
    # a refusal's own limit resets when a request would pass (its Retry-After); the others, and an
    # admission's, when the window's oldest second leaves it
    wait = verdict.retry_after
    requests = wait if wait is not None and verdict.refused == "rpm" else verdict.reset_requests_s
    tokens = wait if wait is not None and verdict.refused == "tpm" else verdict.reset_tokens_s
    return admission_headers(
        entry, verdict.remaining_requests, reset_bytes(requests), verdict.remaining_tokens, reset_bytes(tokens)
    )


def admission_headers(
    entry: Entry, requests: int, requests_reset: bytes, tokens: int, tokens_reset: bytes
) -> RateHeaders:
    """The headers of an admission (module doc): the key's template (`Entry.rate_template`, its
    limits in place) filled in by one format per request."""
    if entry.rpm >= 0:
        if entry.tpm >= 0:
            return entry.rate_template % (requests, requests_reset, tokens, tokens_reset)
        return entry.rate_template % (requests, requests_reset)
    if entry.tpm >= 0:
        return entry.rate_template % (tokens, tokens_reset)
    return b""


@lru_cache(maxsize=4096)
def reset_bytes(seconds: float) -> bytes:
    """`duration` as header bytes; resets repeat (whole milliseconds), so they are formatted once."""
    return duration(seconds).encode()


def duration(seconds: float) -> str:
    """OpenAI's reset format: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".")
    return f"{int(minutes)}m{text}s" if minutes else f"{text}s"
