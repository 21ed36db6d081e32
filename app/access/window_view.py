"""A limited key's rate window as it stands, nothing admitted: the `x-ratelimit-*` headers of the
responses that are not an admission (access.md: every response to a key with limits carries
them). The key-management and report routes and the model lists get them from the guard that
authenticated the key (`app.edge.key_guard`), a completion refused before its admission (a 400
naming a field, a 403 for a model the key may not use) from its door (`app.edge.asgi.serve`).

In-process, the limiter's own buckets; with Redis, one read-only script over the key's window
hash (the layout in `app.access.redis_limiter`), which also counts what other processes' leases
reserved ahead, as an admission's view does. Redis unreachable or slower than `PEEK_TIMEOUT_S`: no
headers (the response itself needs no limit checked), never an error; while `[auth] fail_open`
has this process enforcing its local share, that share's window. Not on the admission path: an
admitted request's headers come with its admission.
"""

from __future__ import annotations

import asyncio

from app.access.keyring import Entry
from app.access.lane import window_key
from app.access.limiter import WINDOW_S, LimiterDown, LocalLimiter, Verdict
from app.access.redis_limiter import RedisLimiter
from app.access.resp import RespError, Script

PEEK_TIMEOUT_S = 0.25  # a slow Redis costs a response that needs no limit checked this much at most

PEEK = Script(
    f"""
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local sec = tonumber(t[1])
local all = redis.call('HGETALL', KEYS[1])
local reqs, toks, oldest = 0, 0, nil
for i = 1, #all, 2 do
  local kind, s = string.sub(all[i], 1, 1), tonumber(string.sub(all[i], 2))
  if s and s > sec - {WINDOW_S} then
    if kind == 'r' then
      reqs = reqs + tonumber(all[i + 1])
      if not oldest or s < oldest then oldest = s end
    elseif kind == 't' then toks = toks + tonumber(all[i + 1]) end
  end
end
local reset = 0
if oldest then reset = math.max(0, math.ceil((oldest + {WINDOW_S} - now) * 1000)) end
return string.format('%d %d %d', reqs, toks, reset)
""",
    1,
)


async def window_now(entry: Entry, local: LocalLimiter, shared: RedisLimiter | None) -> Verdict | None:
    """`entry`'s window now, as an admission's `Verdict` tells it (`AccessGate.window_headers`
    makes the headers); None when Redis cannot say."""
    if shared is None:
        return local.window(entry.record.id, entry.rpm, entry.tpm)
    try:
        command = PEEK.command(PEEK.keys(window_key(shared.prefix, entry.record.id)), ())
        async with asyncio.timeout(PEEK_TIMEOUT_S):
            reply = await shared.redis.evalsha(PEEK, command)
        requests, tokens, reset_ms = (int(field) for field in bytes(reply).split())
    except (RespError, LimiterDown, TimeoutError, TypeError, ValueError):
        return None
    reset = reset_ms / 1000
    return Verdict(
        remaining_requests=max(0, entry.rpm - requests),
        reset_requests_s=reset,
        remaining_tokens=max(0, entry.tpm - tokens),
        reset_tokens_s=reset,
    )
