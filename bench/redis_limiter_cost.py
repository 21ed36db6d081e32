"""Redis's own CPU per limited request: an admission and a settlement through the Redis limiter
(`app.access.redis_limiter`; since leases, most admissions of this busy key come from its lease and
most settlements travel summed, so Redis sees a fraction of a script call per request), in 16
concurrent callers for `--seconds`, read from Redis's `INFO commandstats` (`usec` of `EVALSHA`,
which counts the scripts' run time in Redis).

    .venv/bin/python bench/redis_limiter_cost.py [--tree PATH] [--seconds 8]

`--tree` imports `app` from another checkout (an A/B of two scripts on the same Redis). Redis on
127.0.0.1:6379 is used with a key prefix of its own, removed afterwards; `CONFIG RESETSTAT` clears
Redis's command statistics first, so run nothing else against that Redis meanwhile. The key has a
budget, rpm and tpm none of the requests reaches, as in bench/run.py's scenario 7, and 3,000
requests go first so that the sliding minute holds buckets.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path


async def measure(seconds: float) -> tuple[int, float, float]:
    from app.access.limiter import Ask
    from app.access.redis_limiter import RedisLimiter
    from app.settings import RedisSettings
    from redis import Redis

    prefix = f"bench-limiter-{uuid.uuid4().hex[:8]}"
    limiter = RedisLimiter(RedisSettings(url="redis://127.0.0.1:6379/0", key_prefix=prefix), lambda *_: None)
    await limiter.load_spend(Ask(key_id="k", request_id="load", period="total"), 0, 0)
    redis = Redis()

    async def one(index: int) -> None:
        limits = {"rpm": 10**8, "tpm": 2 * 10**9, "budget": 10**15}
        ask = Ask(key_id="k", request_id=f"r{index}", period="total", tokens=300, cost=5000, **limits)
        verdict = await limiter.admit(ask)
        limiter.settle(ask, verdict.second, 200, 3000)

    for index in range(3000):
        await one(index)
    await limiter.drain()
    redis.config_resetstat()
    started, served = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        await asyncio.gather(*(one(served + offset) for offset in range(16)))
        served += 16
    await limiter.drain()
    stats = redis.info("commandstats")["cmdstat_evalsha"]
    keys = list(redis.scan_iter(match=f"{prefix}:*"))
    if keys:
        redis.delete(*keys)
    await limiter.close()
    return served, float(stats["usec_per_call"]), float(stats["usec"]) / served


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--seconds", type=float, default=8.0)
    options = parser.parse_args()
    sys.path.insert(0, str(options.tree.resolve()))
    served, per_call, per_request = asyncio.run(measure(options.seconds))
    print(f"{options.tree}: {served:,} requests, EVALSHA {per_call:.2f} us per call, {per_request:.3f} us per request")


if __name__ == "__main__":
    main()
