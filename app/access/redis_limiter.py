"""The limiter in Redis: one Lua script per admission, one per settlement (one round trip each).

Keys of one API key share a hash tag, so the scripts also run on a Redis Cluster:

    {prefix}:lim:{<key id>}:rate           hash  r<second> → requests, t<second> → tokens (61 s TTL)
    {prefix}:lim:{<key id>}:flight         zset  request id → expiry (ms); in-flight requests
    {prefix}:lim:{<key id>}:spend:<period> hash  s → spent, r → reserved (nano-dollars)

The clock is Redis's (`TIME`), so replicas with skewed clocks share one sliding minute. Amounts
are passed to `HINCRBY` as the strings Python wrote (Lua would print a large number in exponent
form); comparisons use Lua numbers, exact for integers below 2^53 (nano-dollars: $9 million).
The spend hash of a calendar period expires a day after the period, `total` never; a missing one
(first use in the period, or a Redis that lost its data) is loaded from the ledger by the gate.

Every Redis failure becomes `LimiterDown` here, the one boundary; the gate decides what follows.
The client (`app.access.resp`: one pipelined connection, not redis-py, whose per-call overhead
halved keys-mode throughput) has a 1 s timeout and no retries: a limited request waits at most
about a second.
"""

from __future__ import annotations

from typing import Any

from app.access.limiter import Ask, LimiterDown, Refusal, Verdict
from app.access.resp import RespClient, RespError, Script
from app.settings import RedisSettings

_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local sec = tonumber(t[1])
local rpm, tpm, tokens = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local conc, hold = tonumber(ARGV[5]), tonumber(ARGV[6])
local budget, cost = tonumber(ARGV[7]), tonumber(ARGV[8])
if budget >= 0 then
  local spend = redis.call('HMGET', KEYS[3], 's', 'r')
  if not spend[1] then return {5} end
  if tonumber(spend[1]) + tonumber(spend[2] or '0') + cost > budget then return {1, 0, spend[1]} end
end
local reqs, toks, rb, tb = 0, 0, {}, {}
local all = redis.call('HGETALL', KEYS[1])
local stale = {}
for i = 1, #all, 2 do
  local f, v = all[i], tonumber(all[i + 1])
  local s = tonumber(string.sub(f, 2))
  if s <= sec - 60 then table.insert(stale, f)
  elseif string.sub(f, 1, 1) == 'r' then reqs = reqs + v; table.insert(rb, {s, v})
  else toks = toks + v; table.insert(tb, {s, v}) end
end
if #stale > 0 then redis.call('HDEL', KEYS[1], unpack(stale)) end
local function wait(buckets, excess)
  table.sort(buckets, function(a, b) return a[1] < b[1] end)
  local freed = 0
  for _, b in ipairs(buckets) do
    freed = freed + b[2]
    if freed >= excess then return math.max(1000, math.ceil((b[1] + 60 - now) * 1000)) end
  end
  return 60000
end
if rpm >= 0 and reqs + 1 > rpm then return {2, wait(rb, reqs + 1 - rpm)} end
if tpm >= 0 and toks + tokens > tpm then return {3, wait(tb, toks + tokens - tpm)} end
if conc >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now * 1000)
  if redis.call('ZCARD', KEYS[2]) >= conc then return {4, 1000} end
  redis.call('ZADD', KEYS[2], now * 1000 + hold, ARGV[1])
  redis.call('PEXPIRE', KEYS[2], hold)
end
redis.call('HINCRBY', KEYS[1], 'r' .. sec, 1)
redis.call('HINCRBY', KEYS[1], 't' .. sec, ARGV[4])
redis.call('EXPIRE', KEYS[1], 61)
if budget >= 0 then redis.call('HINCRBY', KEYS[3], 'r', ARGV[8]) end
local oldest = sec
for _, b in ipairs(rb) do if b[1] < oldest then oldest = b[1] end end
local reset = math.max(0, math.ceil((oldest + 60 - now) * 1000))
return {0, sec, rpm - reqs - 1, reset, tpm - toks - tokens, reset}
"""

_SETTLE = """
if ARGV[3] ~= '0' and redis.call('HEXISTS', KEYS[1], 't' .. ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[1], 't' .. ARGV[2], ARGV[3])
end
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[4] ~= '-1' and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HINCRBY', KEYS[3], 'r', '-' .. ARGV[4])
  redis.call('HINCRBY', KEYS[3], 's', ARGV[5])
end
return 0
"""

_LOAD = """
if redis.call('HSETNX', KEYS[1], 's', ARGV[1]) == 1 then
  redis.call('HSETNX', KEYS[1], 'r', '0')
  if tonumber(ARGV[2]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
end
return 0
"""

_REFUSALS: dict[int, Refusal] = {1: "budget", 2: "rpm", 3: "tpm", 4: "max_concurrency", 5: "budget_missing"}


class RedisLimiter:
    def __init__(self, settings: RedisSettings) -> None:
        self.prefix = settings.key_prefix
        self.redis = RespClient(settings.url, timeout=1.0)
        self._admit = Script(_ADMIT)
        self._settle = Script(_SETTLE)
        self._load = Script(_LOAD)

    def _keys(self, key_id: str, period: str) -> list[str]:
        base = f"{self.prefix}:lim:{{{key_id}}}"
        return [f"{base}:rate", f"{base}:flight", f"{base}:spend:{period}"]

    async def admit(self, ask: Ask) -> Verdict:
        args = (ask.request_id, ask.rpm, ask.tpm, ask.tokens, ask.max_concurrency, ask.hold_ms, ask.budget, ask.cost)
        reply = await self._call(self._admit, self._keys(ask.key_id, ask.period), [str(arg) for arg in args])
        code = int(reply[0])
        if code == 0:
            second, left_r, reset_r, left_t, reset_t = (int(value) for value in reply[1:6])
            return Verdict(
                second=second,
                remaining_requests=max(0, left_r),
                reset_requests_s=reset_r / 1000,
                remaining_tokens=max(0, left_t),
                reset_tokens_s=reset_t / 1000,
            )
        if code == 1:
            return Verdict(refused="budget", spent=int(reply[2]))
        return Verdict(refused=_REFUSALS[code], retry_after=int(reply[1]) / 1000 if len(reply) > 1 else None)

    async def load_spend(self, ask: Ask, spent: int) -> None:
        await self._call(self._load, self._keys(ask.key_id, ask.period)[2:], [str(spent), str(ask.budget_ttl_s)])

    async def settle(self, ask: Ask, second: int, tokens: int, cost: int) -> None:
        reserved = str(ask.cost) if ask.budget >= 0 else "-1"
        args = [ask.request_id, str(second), str(tokens - ask.tokens), reserved, str(cost)]
        await self._call(self._settle, self._keys(ask.key_id, ask.period), args)

    async def spend(self, key_id: str, period: str) -> tuple[int, int] | None:
        try:
            spent, reserved = await self.redis.call("HMGET", self._keys(key_id, period)[2], "s", "r")
        except RespError as exc:
            raise LimiterDown(str(exc)) from None
        return None if spent is None else (int(spent), int(reserved or 0))

    async def _call(self, script: Script, keys: list[str], args: list[str]) -> Any:
        try:
            return await self.redis.evalsha(script, keys, args)
        except RespError as exc:
            raise LimiterDown(f"{type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        await self.redis.close()
