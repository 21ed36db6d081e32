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
about a second. A settlement is sent without waiting for it (no task per request): its failure
reaches the gate through the `failed` callback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from app.access.limiter import Ask, LimiterDown, Refusal, Verdict
from app.access.resp import RespClient, RespError, Script, bulk
from app.settings import RedisSettings

_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local sec = tonumber(t[1])
local tokens, cost = tonumber(ARGV[2]), tonumber(ARGV[3])
local rpm, tpm = tonumber(ARGV[4]), tonumber(ARGV[5])
local conc, hold, budget = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
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
redis.call('HINCRBY', KEYS[1], 't' .. sec, ARGV[2])
redis.call('EXPIRE', KEYS[1], 61)
if budget >= 0 then redis.call('HINCRBY', KEYS[3], 'r', ARGV[3]) end
local oldest = sec
for _, b in ipairs(rb) do if b[1] < oldest then oldest = b[1] end end
local reset = math.max(0, math.ceil((oldest + 60 - now) * 1000))
return string.format('%d %d %d %d %d', sec, rpm - reqs - 1, reset, tpm - toks - tokens, reset)
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

_LIMITS = 5  # the admission's last arguments: rpm, tpm, max_concurrency, hold, budget
_REFUSALS: dict[int, Refusal] = {1: "budget", 2: "rpm", 3: "tpm", 4: "max_concurrency", 5: "budget_missing"}


class RedisLimiter:
    def __init__(self, settings: RedisSettings, failed: Callable[[str, str], None]) -> None:
        """`failed(key_id, reason)` hears of a settlement Redis did not take (nobody awaits one)."""
        self.prefix = settings.key_prefix
        self.redis = RespClient(settings.url, timeout=1.0)
        self._admit = Script(_ADMIT, 3)
        self._settle = Script(_SETTLE, 3)
        self._load = Script(_LOAD, 1)
        self.failed = failed
        self.retries: set[asyncio.Future[Any]] = set()
        self._names: dict[tuple[str, str], tuple[bytes, bytes, str]] = {}
        self._limits: dict[tuple[int, ...], bytes] = {}  # a key's limits as the admission's last arguments

    def _keys(self, key_id: str, period: str) -> tuple[bytes, bytes, str]:
        """(the three keys encoded, the spend key encoded, the spend key): made once per key and period."""
        names = self._names.get((key_id, period))
        if names is None:
            if len(self._names) > 10_000:
                self._names.clear()
            base = f"{self.prefix}:lim:{{{key_id}}}"
            spend = f"{base}:spend:{period}"
            three = Script.keys(f"{base}:rate", f"{base}:flight", spend)
            names = self._names[(key_id, period)] = (three, Script.keys(spend), spend)
        return names

    async def admit(self, ask: Ask) -> Verdict:
        limits = (ask.rpm, ask.tpm, ask.max_concurrency, ask.hold_ms, ask.budget)
        fixed = self._limits.get(limits)
        if fixed is None:
            if len(self._limits) > 10_000:
                self._limits.clear()
            fixed = self._limits[limits] = b"".join(bulk(b"%d" % limit) for limit in limits)
        keys = self._keys(ask.key_id, ask.period)[0]
        args = (ask.request_id.encode(), b"%d" % ask.tokens, b"%d" % ask.cost)
        reply = await self._call(self._admit, keys, args, fixed)
        if type(reply) is bytes:  # admitted: "second remaining-requests reset remaining-tokens reset"
            second, left_r, reset_r, left_t, reset_t = map(int, reply.split())
            return Verdict(
                second=second,
                remaining_requests=max(0, left_r),
                reset_requests_s=reset_r / 1000,
                remaining_tokens=max(0, left_t),
                reset_tokens_s=reset_t / 1000,
            )
        code = reply[0]
        if code == 1:
            return Verdict(refused="budget", spent=int(reply[2]))
        return Verdict(refused=_REFUSALS[code], retry_after=int(reply[1]) / 1000 if len(reply) > 1 else None)

    async def load_spend(self, ask: Ask, spent: int, ttl_s: int) -> None:
        args = (b"%d" % spent, b"%d" % ttl_s)
        await self._call(self._load, self._keys(ask.key_id, ask.period)[1], args)

    def settle(self, ask: Ask, second: int, tokens: int, cost: int) -> None:
        """Sent without waiting (no future, no task), leaving with the next admission's write."""
        reserved = b"%d" % ask.cost if ask.budget >= 0 else b"-1"
        args = (ask.request_id.encode(), b"%d" % second, b"%d" % (tokens - ask.tokens), reserved, b"%d" % cost)
        keys = self._keys(ask.key_id, ask.period)[0]
        self.redis.post_to(self._settle.command(keys, args), _Settlement(self, ask.key_id, keys, args))

    async def spend(self, key_id: str, period: str) -> tuple[int, int] | None:
        try:
            spent, reserved = await self.redis.call("HMGET", self._keys(key_id, period)[2], "s", "r")
        except RespError as exc:
            raise LimiterDown(str(exc)) from None
        return None if spent is None else (int(spent), int(reserved or 0))

    async def _call(self, script: Script, keys: bytes, args: tuple[bytes, ...], fixed: bytes = b"") -> Any:
        try:
            return await self.redis.evalsha(script, keys, args, fixed, _LIMITS if fixed else 0)
        except RespError as exc:
            raise LimiterDown(f"{type(exc).__name__}: {exc}") from None

    async def drain(self) -> None:
        """Wait for the settlements already sent to be answered (at most the client's timeout)."""
        await self.redis.drain()
        if self.retries:  # settlements resent after NOSCRIPT
            await asyncio.wait(set(self.retries))

    async def close(self) -> None:
        await self.redis.close()


class _Settlement:
    """A settlement's answer: nothing to do when it went through; the script loaded again and the
    settlement resent on NOSCRIPT (Redis restarted); reported to the gate otherwise."""

    __slots__ = ("args", "key_id", "keys", "limiter")

    def __init__(self, limiter: RedisLimiter, key_id: str, keys: bytes, args: tuple[bytes, ...]) -> None:
        self.limiter, self.key_id, self.keys, self.args = limiter, key_id, keys, args

    def __call__(self, reply: Any) -> None:
        if not isinstance(reply, RespError):
            return
        limiter = self.limiter
        if str(reply).startswith("NOSCRIPT"):
            retry = asyncio.ensure_future(limiter.redis.evalsha(limiter._settle, self.keys, self.args))
            limiter.retries.add(retry)
            retry.add_done_callback(self._retried)
        else:
            limiter.failed(self.key_id, f"{type(reply).__name__}: {reply}")

    def _retried(self, done: asyncio.Future[Any]) -> None:
        self.limiter.retries.discard(done)
        error = None if done.cancelled() else done.exception()
        if error is not None:
            self.limiter.failed(self.key_id, f"{type(error).__name__}: {error}")
