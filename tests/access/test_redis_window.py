"""The Redis limiter's sliding minute (`app.access.redis_limiter`), against the real Redis on this
machine and a Python model of the rules in `app.access.limiter`'s docstring.

The limiter's clock is the test's (`clock`, microseconds), so a seeded walk can cross many
minutes in a second: small steps within a second, steps of a few seconds, the minute's edge, idle
spells of more than a minute and clock jumps of more than two. After every admission the verdict
must be exactly the model's (admitted or which limit refused, remaining requests and tokens,
resets, `Retry-After`), and the window's hash must hold exactly the buckets still inside the minute
with their sums (`R`, `T`) and oldest second (`o`) — the bookkeeping that lets an admission avoid
reading the whole hash.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import AsyncIterator

import pytest
from redis import Redis

from app.access.limiter import Ask, Verdict
from app.access.redis_limiter import RedisLimiter
from app.settings import RedisSettings

URL = "redis://127.0.0.1:6379/0"
RPM, TPM = 7, 500


class Model:
    """The rules, written plainly: buckets by second, a request's tokens settled in its bucket."""

    def __init__(self) -> None:
        self.buckets: dict[int, list[int]] = {}  # second → [requests, tokens]

    def admit(self, now: float, tokens: int) -> Verdict:
        sec = math.floor(now)
        self.buckets = {s: b for s, b in self.buckets.items() if s > sec - 60}
        requests = sum(b[0] for b in self.buckets.values())
        used = sum(b[1] for b in self.buckets.values())
        # a refusal tells the window as it stands (its x-ratelimit-* headers)
        held = max(0, math.ceil((min(self.buckets, default=sec) + 60 - now) * 1000)) / 1000
        window = {
            "remaining_requests": max(0, RPM - requests),
            "reset_requests_s": held,
            "remaining_tokens": max(0, TPM - used),
            "reset_tokens_s": held,
        }
        # Retry-After: until a request would pass, so an rpm refusal waits for tpm too when both refuse
        after = self._wait(now, 1, used + tokens - TPM) if used + tokens > TPM else 0
        if requests + 1 > RPM:
            wait = max(self._wait(now, 0, requests + 1 - RPM), after)
            return Verdict(refused="rpm", retry_after=wait / 1000, **window)
        if after:
            return Verdict(refused="tpm", retry_after=after / 1000, **window)
        bucket = self.buckets.setdefault(sec, [0, 0])
        bucket[0] += 1
        bucket[1] += tokens
        reset = max(0, math.ceil((min(self.buckets) + 60 - now) * 1000)) / 1000
        return Verdict(
            second=sec,
            remaining_requests=max(0, RPM - requests - 1),
            reset_requests_s=reset,
            remaining_tokens=max(0, TPM - used - tokens),
            reset_tokens_s=reset,
        )

    def _wait(self, now: float, which: int, excess: int) -> int:
        freed = 0
        for second in sorted(self.buckets):
            freed += self.buckets[second][which]
            if freed >= excess:
                return max(1000, math.ceil((second + 60 - now) * 1000))
        return 60_000

    def settle(self, second: int, delta: int) -> None:
        if delta and second in self.buckets:
            self.buckets[second][1] += delta


@pytest.fixture
async def walk() -> AsyncIterator[tuple[RedisLimiter, list[int], Redis, str]]:
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    now_us = [1_800_000_000_000_000]
    settings = RedisSettings(url=URL, key_prefix=prefix)  # no leases: they last in the loop's time, not this clock's
    limiter = RedisLimiter(settings, lambda _k, _r: None, clock=lambda: now_us[0], lease_max=1)
    client = Redis.from_url(URL)
    yield limiter, now_us, client, f"{prefix}:lim:{{k1}}:window"
    await limiter.close()
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def _step(rng: random.Random) -> int:
    """Microseconds to the next admission: mostly within the second, sometimes across the minute."""
    kind = rng.random()
    if kind < 0.55:
        return rng.randrange(0, 400_000)
    if kind < 0.85:
        return rng.randrange(400_000, 9_000_000)
    if kind < 0.93:
        return rng.choice((59, 60, 61)) * 1_000_000 + rng.randrange(-2_000, 2_000)
    if kind < 0.98:
        return rng.randrange(61_000_000, 115_000_000)
    return rng.randrange(125_000_000, 4_000_000_000)  # a clock jump: the window is read once


def _window(client: Redis, name: str) -> tuple[dict[int, list[int]], dict[str, int]]:
    stored: dict[bytes, bytes] = client.hgetall(name)  # type: ignore[assignment]  # redis-py's sync stubs
    raw = {field.decode(): int(value) for field, value in stored.items()}
    buckets: dict[int, list[int]] = {}
    for field, value in raw.items():
        if field[0] in "rt":
            buckets.setdefault(int(field[1:]), [0, 0])[field[0] == "t"] = value
    return buckets, {field: raw[field] for field in ("R", "T", "o") if field in raw}


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_sliding_minute_matches_the_model_step_by_step(
    walk: tuple[RedisLimiter, list[int], Redis, str], seed: int
) -> None:
    limiter, now_us, client, name = walk
    rng = random.Random(seed)  # noqa: S311  # a seeded walk, not a secret
    model = Model()
    refused = {"rpm": 0, "tpm": 0}
    for index in range(400):
        now_us[0] += _step(rng)
        tokens = rng.randrange(0, 260)
        ask = Ask(key_id="k1", request_id=f"r{index}", period="total", rpm=RPM, tpm=TPM, tokens=tokens)
        verdict = await limiter.admit(ask)
        expected = model.admit(now_us[0] / 1_000_000, tokens)
        assert verdict == expected, f"step {index}"
        if verdict.refused is not None:
            refused[verdict.refused] += 1
            continue
        buckets, sums = _window(client, name)
        assert buckets == model.buckets, f"step {index}"
        assert sums == {
            "R": sum(b[0] for b in buckets.values()),
            "T": sum(b[1] for b in buckets.values()),
            "o": min(buckets),
        }, f"step {index}"
        if rng.random() < 0.7:  # the real count settles the reservation, usually below it
            delta = rng.randrange(-tokens, 40)
            limiter.settle(ask, verdict.second, tokens + delta, 0)
            model.settle(verdict.second, delta)
            await limiter.drain()
    assert refused["rpm"] > 10, refused  # both limits were reached, often
    assert refused["tpm"] > 10, refused
