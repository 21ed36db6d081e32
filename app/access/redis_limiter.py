"""The limiter in Redis: one Lua script per admission, one per settlement (one round trip each).

Keys of one API key share a hash tag, so the scripts also run on a Redis Cluster:

    {prefix}:lim:{<key id>}:window         hash  r<second> → requests, t<second> → tokens, and
                                                 R, T → their sums, o → the oldest second held (61 s TTL)
    {prefix}:lim:{<key id>}:flight         zset  request id → expiry (ms); in-flight requests
    {prefix}:lim:{<key id>}:spend:<period> hash  s → spent, r → reserved (nano-dollars)

The clock is Redis's (`TIME`), so replicas with skewed clocks share one sliding minute (tests may
pass their own, `clock`, in microseconds, to step through the minute without waiting for it). Amounts
are passed to `HINCRBY` as the strings Python wrote (Lua would print a large number in exponent
form); comparisons use Lua numbers, exact for integers below 2^53 (nano-dollars: $9 million).
The spend hash of a calendar period expires a day after the period, `total` never; a missing one
(first use in the period, or a Redis that lost its data) is loaded from the ledger by the gate.

Work in Redis per admission does not grow with the traffic: the window keeps its sums (`R`, `T`)
and its oldest second (`o`) beside the per-second buckets, so an admission reads three fields and
writes four; once per second of traffic an admission also drops the second that left the minute
(after an idle spell, each second that left it: at most 60; after a jump of the clock by more than
two minutes it reads the hash once instead). Only a refusal walks the buckets, to tell when enough
of them leave the minute (`Retry-After`); it writes nothing, so the window's sums always hold
exactly the buckets left in the hash. A rate or concurrency refusal also answers the window as it
stands (requests, tokens, when its oldest second leaves), so the 429's `x-ratelimit-*` headers
tell the truth about the limits it did not hit; so does a budget refusal (checked first, its
message the one to act on, but after the window is read). The script used to read the whole hash
(up to 120 fields) on every admission: Redis's CPU per request (admission and settlement) went
from 31.3 to 23.8 µs (bench/RESULTS.md), on the one Redis every replica shares. The window lives under `:window`, not
the old script's `:rate`, so a rolling upgrade never mixes the two layouts (old hashes expire
within 61 seconds; until then the two generations of processes count apart).

Every Redis failure becomes `LimiterDown` here, the one boundary; the gate decides what follows.
The client (`app.access.resp`: one pipelined connection, not redis-py, whose per-call overhead
halved keys-mode throughput) has a 1 s timeout and no retries: a limited request waits at most
about a second. A settlement is sent without waiting for it (no task per request): its failure
reaches the gate through the `failed` callback.

Settlements wait, briefly, to be sent together: `settle` keeps a request's five arguments, and the
next admission (before its own command, in the same write: they may free what it asks for), or a
timer `LAZY_S` later, sends every settlement waiting as one script call per key. Under load that
is one command, one reply and one handler for the few requests that ended since the last
admission, instead of one each; on loopback every `send` also runs Redis's side of the TCP stack on
the caller's CPU. A settlement that waits 2 ms only holds its reservation 2 ms longer (the limits
err on the side of refusing), and this process's own next admission never sees it unsettled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from msgspec import Struct

from app.access.limiter import Ask, LimiterDown, Refusal, Verdict
from app.access.resp import RespClient, RespError, Script, bulk
from app.settings import RedisSettings

_ADMIT = """
local now, sec
if ARGV[9] then
  now = tonumber(ARGV[9]) / 1000000
  sec = math.floor(now)
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  sec = tonumber(t[1])
end
local tokens, cost = tonumber(ARGV[2]), tonumber(ARGV[3])
local rpm, tpm = tonumber(ARGV[4]), tonumber(ARGV[5])
local conc, hold, budget = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local spend
if budget >= 0 then
  spend = redis.call('HMGET', KEYS[3], 's', 'r')
  if not spend[1] then return {5} end
end
local w = KEYS[1]
local head = redis.call('HMGET', w, 'R', 'T', 'o')
local reqs, toks = tonumber(head[1] or '0'), tonumber(head[2] or '0')
local oldest = tonumber(head[3] or sec)
local dead = {}
if oldest < sec - 120 then
  reqs, toks, oldest = 0, 0, sec
  local all = redis.call('HGETALL', w)
  for i = 1, #all, 2 do
    local f = all[i]
    local kind, s = string.sub(f, 1, 1), tonumber(string.sub(f, 2))
    if kind == 'r' or kind == 't' then
      if s <= sec - 60 then dead[#dead + 1] = f
      elseif kind == 'r' then reqs = reqs + tonumber(all[i + 1]); oldest = math.min(oldest, s)
      else toks = toks + tonumber(all[i + 1]) end
    end
  end
elseif oldest <= sec - 60 then
  while oldest <= sec - 60 do
    local f = redis.call('HMGET', w, 'r' .. oldest, 't' .. oldest)
    if f[1] then
      reqs, toks = reqs - tonumber(f[1]), toks - tonumber(f[2] or '0')
      dead[#dead + 1], dead[#dead + 2] = 'r' .. oldest, 't' .. oldest
    end
    oldest = oldest + 1
  end
  while oldest < sec and redis.call('HEXISTS', w, 'r' .. oldest) == 0 do oldest = oldest + 1 end
end
local function wait(kind, excess)
  local freed = 0
  for s = oldest, sec do
    freed = freed + tonumber(redis.call('HGET', w, kind .. s) or '0')
    if freed >= excess then return math.max(1000, math.ceil((s + 60 - now) * 1000)) end
  end
  return 60000
end
local held = math.max(0, math.ceil((oldest + 60 - now) * 1000))
if budget >= 0 and tonumber(spend[1]) + tonumber(spend[2] or '0') + cost > budget then
  return {1, 0, reqs, toks, held, spend[1]}
end
if rpm >= 0 and reqs + 1 > rpm then return {2, wait('r', reqs + 1 - rpm), reqs, toks, held} end
if tpm >= 0 and toks + tokens > tpm then return {3, wait('t', toks + tokens - tpm), reqs, toks, held} end
if conc >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now * 1000)
  if redis.call('ZCARD', KEYS[2]) >= conc then return {4, 1000, reqs, toks, held} end
  redis.call('ZADD', KEYS[2], now * 1000 + hold, ARGV[1])
  redis.call('PEXPIRE', KEYS[2], hold)
end
if #dead > 0 then redis.call('HDEL', w, unpack(dead)) end
redis.call('HINCRBY', w, 'r' .. sec, 1)
redis.call('HINCRBY', w, 't' .. sec, ARGV[2])
reqs, toks = reqs + 1, toks + tokens
redis.call('HSET', w, 'R', string.format('%d', reqs), 'T', string.format('%d', toks), 'o', string.format('%d', oldest))
redis.call('EXPIRE', w, 61)
if budget >= 0 then redis.call('HINCRBY', KEYS[3], 'r', ARGV[3]) end
local reset = math.max(0, math.ceil((oldest + 60 - now) * 1000))
return string.format('%d %d %d %d', sec, rpm - reqs, tpm - toks, reset)
"""

_SETTLE = """
for i = 1, #ARGV, 5 do
  local at, delta, reserved = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if delta ~= '0' and redis.call('HEXISTS', KEYS[1], 't' .. at) == 1 then
    redis.call('HINCRBY', KEYS[1], 't' .. at, delta)
    redis.call('HINCRBY', KEYS[1], 'T', delta)
  end
  redis.call('ZREM', KEYS[2], ARGV[i])
  if reserved ~= '-1' and redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('HINCRBY', KEYS[3], 'r', '-' .. reserved)
    redis.call('HINCRBY', KEYS[3], 's', ARGV[i + 4])
  end
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

LAZY_S = 0.002  # the longest a settlement waits for an admission to leave with (module doc)
_REFUSALS: dict[int, Refusal] = {1: "budget", 2: "rpm", 3: "tpm", 4: "max_concurrency", 5: "budget_missing"}
_THREE = b"$%d\r\n%s\r\n" * 3  # three arguments, each `bulk`
_FIVE = b"$%d\r\n%s\r\n" * 5


def _base(prefix: str, key_id: str) -> str:
    """The start of every Redis key of one API key (its id is the hash tag: module doc)."""
    return f"{prefix}:lim:{{{key_id}}}"


def _spend_key(prefix: str, key_id: str, period: str) -> str:
    return f"{_base(prefix, key_id)}:spend:{period}"


class _Commands:
    """One key's commands in one budget period, encoded but for their per-request arguments: the
    admission's head (`EVALSHA`, its keys) and tail (the key's limits, the clock), the settlement's
    head. Made once per key, period and limits, so a request only formats its own arguments."""

    __slots__ = ("admit_head", "admit_tail", "key_id", "keys", "settle_script", "spend_keys")

    def __init__(self, limiter: RedisLimiter, key_id: str, period: str, limits: tuple[int, ...]) -> None:
        base = _base(limiter.prefix, key_id)
        spend = _spend_key(limiter.prefix, key_id, period)
        three = Script.keys(f"{base}:window", f"{base}:flight", spend)
        self.spend_keys = Script.keys(spend)
        tail = b"".join(bulk(b"%d" % limit) for limit in limits)  # ARGV[4..8]
        count = 3 + len(limits) + (limiter.clock is not None)  # ARGV[9]: the test's clock
        self.admit_head, self.admit_tail = limiter.admit_script.head(count) + three, tail
        self.key_id, self.keys, self.settle_script = key_id, three, limiter.settle_script

    def settlement(self, items: list[bytes]) -> bytes:
        """One `EVALSHA` of the settlement script for `items` (each five encoded arguments)."""
        return b"".join((self.settle_script.head(5 * len(items)), self.keys, *items))


class RedisLimiter:
    def __init__(
        self, settings: RedisSettings, failed: Callable[[str, str], None], clock: Callable[[], int] | None = None
    ) -> None:
        """`failed(key_id, reason)` hears of a settlement Redis did not take (nobody awaits one);
        `clock` (microseconds since the epoch) replaces Redis's `TIME` in admissions (tests)."""
        self.prefix = settings.key_prefix
        self.redis = RespClient(settings.url, timeout=1.0)
        self.admit_script = Script(_ADMIT, 3)
        self.settle_script = Script(_SETTLE, 3)
        self._load = Script(_LOAD, 1)
        self.failed = failed
        self.clock = clock
        self.retries: set[asyncio.Future[Any]] = set()
        self._commands: dict[tuple[str, str, int, int, int, int, int], _Commands] = {}
        self._unsent: dict[_Commands, list[bytes]] = {}  # settlements waiting to be sent, by key
        self._unsent_timer: asyncio.TimerHandle | None = None

    def _of(self, ask: Ask) -> _Commands:
        key = (ask.key_id, ask.period, ask.rpm, ask.tpm, ask.max_concurrency, ask.hold_ms, ask.budget)
        commands = self._commands.get(key)
        if commands is None:
            if len(self._commands) > 10_000:
                self._commands.clear()
            commands = self._commands[key] = _Commands(self, ask.key_id, ask.period, key[2:])
        return commands

    async def admit(self, ask: Ask) -> Verdict:
        if self._unsent:  # before this admission, in the same write: they may free what it asks for
            self._send_settlements()
        commands = self._of(ask)
        rid, tokens, cost = ask.request_id.encode(), b"%d" % ask.tokens, b"%d" % ask.cost
        own = _THREE % (len(rid), rid, len(tokens), tokens, len(cost), cost)
        tail = commands.admit_tail if self.clock is None else commands.admit_tail + bulk(b"%d" % self.clock())
        command = b"".join((commands.admit_head, own, tail))
        try:  # `RespClient.evalsha`, unrolled: the reply is awaited here, one coroutine fewer
            reply = await self.redis.post(command)
            if isinstance(reply, RespError):
                reply = await self.redis.after_error(self.admit_script, command, reply)
        except RespError as exc:
            raise LimiterDown(f"{type(exc).__name__}: {exc}") from None
        if type(reply) is bytes:  # admitted: "second remaining-requests remaining-tokens reset"
            second, left_r, left_t, reset = map(int, reply.split())
            return Verdict(
                second=second,
                remaining_requests=max(0, left_r),
                reset_requests_s=reset / 1000,
                remaining_tokens=max(0, left_t),
                reset_tokens_s=reset / 1000,
            )
        code = reply[0]
        if len(reply) < 5:  # budget_missing
            return Verdict(refused=_REFUSALS[code])
        held = int(reply[4]) / 1000  # the window as it stands, for the refusal's x-ratelimit-* headers
        return Verdict(
            refused=_REFUSALS[code],
            retry_after=int(reply[1]) / 1000 if code != 1 else None,
            spent=int(reply[5]) if code == 1 else 0,
            remaining_requests=max(0, ask.rpm - int(reply[2])),
            reset_requests_s=held,
            remaining_tokens=max(0, ask.tpm - int(reply[3])),
            reset_tokens_s=held,
        )

    async def load_spend(self, ask: Ask, spent: int, ttl_s: int) -> None:
        args = (b"%d" % spent, b"%d" % ttl_s)
        await self._call(self._load, self._load.command(self._of(ask).spend_keys, args))

    def settle(self, ask: Ask, second: int, tokens: int, cost: int) -> None:
        """Kept until the next admission's write, or `LAZY_S` (one script call per key for all the
        settlements waiting then: module doc); nobody waits for it."""
        rid, at, delta = ask.request_id.encode(), b"%d" % second, b"%d" % (tokens - ask.tokens)
        reserved, spent = (b"%d" % ask.cost if ask.budget >= 0 else b"-1"), b"%d" % cost
        own = _FIVE % (len(rid), rid, len(at), at, len(delta), delta, len(reserved), reserved, len(spent), spent)
        commands = self._of(ask)
        unsent = self._unsent.get(commands)
        if unsent is None:
            self._unsent[commands] = [own]
        else:
            unsent.append(own)
        if self._unsent_timer is None:
            self._unsent_timer = asyncio.get_running_loop().call_later(LAZY_S, self._send_settlements)

    def _send_settlements(self) -> None:
        """Every waiting settlement, one command per key, queued to leave in this turn of the loop."""
        if self._unsent_timer is not None:
            self._unsent_timer.cancel()
            self._unsent_timer = None
        unsent, self._unsent = self._unsent, {}
        for commands, items in unsent.items():
            command = commands.settlement(items)
            self.redis.post_to(command, _Settlement(self, commands.key_id, command))

    async def spend(self, key_id: str, period: str) -> tuple[int, int] | None:
        try:
            spent, reserved = await self.redis.call("HMGET", _spend_key(self.prefix, key_id, period), "s", "r")
        except RespError as exc:
            raise LimiterDown(str(exc)) from None
        return None if spent is None else (int(spent), int(reserved or 0))

    async def _call(self, script: Script, command: bytes) -> Any:
        try:
            return await self.redis.evalsha(script, command)
        except RespError as exc:
            raise LimiterDown(f"{type(exc).__name__}: {exc}") from None

    async def drain(self) -> None:
        """Send the settlements waiting and wait for every answer (at most the client's timeout)."""
        if self._unsent:
            self._send_settlements()
        await self.redis.drain()
        if self.retries:  # settlements resent after NOSCRIPT
            await asyncio.wait(set(self.retries))

    async def close(self) -> None:
        await self.redis.close()


class _Settlement(Struct):
    """A settlement's answer: nothing to do when it went through; the script loaded again and the
    settlement resent on NOSCRIPT (Redis restarted); reported to the gate otherwise. One per
    settlement command (the settlements of one key sent together)."""

    limiter: RedisLimiter
    key_id: str
    command: bytes

    def __call__(self, reply: Any) -> None:
        if not isinstance(reply, RespError):
            return
        limiter = self.limiter
        if str(reply).startswith("NOSCRIPT"):
            retry = asyncio.ensure_future(limiter.redis.evalsha(limiter.settle_script, self.command))
            limiter.retries.add(retry)
            retry.add_done_callback(self._retried)
        else:
            limiter.failed(self.key_id, f"{type(reply).__name__}: {reply}")

    def _retried(self, done: asyncio.Future[Any]) -> None:
        self.limiter.retries.discard(done)
        error = None if done.cancelled() else done.exception()
        if error is not None:
            self.limiter.failed(self.key_id, f"{type(error).__name__}: {error}")
