"""The limiter's Lua scripts (`app.access.redis_limiter` sends them; the layout is in its docstring).

ADMIT    KEYS window, flight, spend, lease; ARGV request id, tokens, cost (nano-dollars), rpm,
         tpm, max_concurrency, hold (ms), budget (nano-dollars; -1 where the key has none of
         these), the lease asked for (`app.access.lease`: 1 none, 0 also not waiting for other
         processes' leases), the spend record's generation the process knows (empty: none yet;
         `app.access.restore`), and a test's clock (µs, optional).
         Answers "second remaining-requests remaining-tokens reset(ms) leased life(ms) generation"
         when admitted (life -1: a lease was asked for and the limits allow one, but the second
         ends within 10 ms, so none was granted; generation `-` without a budget); {code, …} when
         not: 1 budget, 2 rpm, 3 tpm, 4 max_concurrency (each with Retry-After in ms, the
         window's requests, tokens and when its oldest second leaves), 5 the period's spend not
         loaded, 6 wait this many ms for other processes' leases, 7 the spend record is of
         another generation than the process knows (Redis lost it: restore, then ask again).
SETTLE   the same keys; ARGV groups of six: request id, second, tokens' difference, cost
         reserved (-1: no budget), cost spent, and what it is: `-` a request in flight (taken off
         the in-flight set), `=` settlements summed, a number a lease given back with that many
         requests unused. The cost spent is added to the period's spend whenever that record
         is loaded (has `s`), a request admitted without a budget included (one given a budget while it ran:
         the ledger that loaded the record had no row of it yet), and the reserved count never
         goes below 0 (a record loaded again from the ledger while requests were in flight holds
         none of their reservations: they would otherwise leave it negative, an allowance above
         the budget for good).
LOAD     the period's spend, set only if still absent, with a new generation (ARGV spent, TTL
         in seconds (0: none), generation).
RESTORE  what one process held of a spend record that Redis lost (`app.access.restore`): ARGV
         process id, the generation it knew, a generation for a record that is not there, then
         pairs of minute and reservation. Once per process and generation it knew
         (`p<process id>:<generation>`); answers the record's generation.
GENERATION  `{prefix}:gen`, the Redis data's generation, made on first use: answers it and Redis's
         time (ms) (`app.access.restore`).

The spend hash also holds `g`, its generation: a new one whenever it is loaded from the ledger
again, or made by a restore before that. A settlement adds its cost to `s` only when there is one:
a record restored but not loaded yet has none, and the load reads that row from the ledger.

Reservations of a budget are also kept per minute of admission in the spend hash (`b<minute>`,
and `ob`, the oldest minute that may hold some). A settlement takes its reservation off its
minute's and off `r` only while that minute's field is there. Once a minute is past the hold
(every request admitted in it has ended, by its deadline, or will never settle: a process killed,
a reply or a settlement lost), an admission gives what is left of it back (`r` less it): one check
of `ob` per admission, the walk once a minute (a hash read after an idle spell of half an hour).
A record loaded again from the ledger (Redis restarted; a recount) holds no minutes, so the
settlements of requests admitted before it add their cost and take nothing off.

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
"""

from __future__ import annotations

from typing import Any

from app.access.lease import GRACE_S, LEASE_MIN, LEASE_S
from app.access.limiter import Ask, LimiterDown, Refusal, Verdict

ADMIT = """
local now, sec
if ARGV[11] then
  now = tonumber(ARGV[11]) / 1000000
  sec = math.floor(now)
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  sec = tonumber(t[1])
end
local tokens, cost = tonumber(ARGV[2]), tonumber(ARGV[3])
local rpm, tpm = tonumber(ARGV[4]), tonumber(ARGV[5])
local conc, hold, budget = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local want = tonumber(ARGV[9])
local spend, bucket
local spent, reserved = 0, 0
local function past(b) return (b + 1) * 60000 + hold < now * 1000 end  -- no request of minute b can run
if budget >= 0 then
  spend = redis.call('HMGET', KEYS[3], 's', 'r', 'ob', 'g')
  if spend[4] and ARGV[10] ~= '' and spend[4] ~= ARGV[10] then return {7} end
  if not spend[1] then return {5} end
  spent, reserved = tonumber(spend[1]), tonumber(spend[2] or '0')
  bucket = math.floor(sec / 60)
  local ob = tonumber(spend[3] or bucket)
  if past(ob) then
    local freed, b = 0, ob
    if bucket - ob > 30 then
      b = bucket
      local all = redis.call('HGETALL', KEYS[3])
      for i = 1, #all, 2 do
        if string.sub(all[i], 1, 1) == 'b' then
          local at = tonumber(string.sub(all[i], 2))
          if past(at) then freed = freed + tonumber(all[i + 1]); redis.call('HDEL', KEYS[3], all[i])
          elseif at < b then b = at end
        end
      end
    else
      while b < bucket and past(b) do
        local v = redis.call('HGET', KEYS[3], 'b' .. b)
        if v then freed = freed + tonumber(v); redis.call('HDEL', KEYS[3], 'b' .. b) end
        b = b + 1
      end
      while b < bucket and redis.call('HEXISTS', KEYS[3], 'b' .. b) == 0 do b = b + 1 end
    end
    redis.call('HSET', KEYS[3], 'ob', string.format('%d', b))
    if freed > 0 then
      reserved = math.max(0, reserved - freed)
      redis.call('HSET', KEYS[3], 'r', string.format('%d', reserved))
    end
  end
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
local function over(lr, lt, lc)
  if budget >= 0 and spent + reserved - lc + cost > budget then return 1 end
  if rpm >= 0 and reqs - lr + 1 > rpm then return 2 end
  if tpm >= 0 and toks - lt + tokens > tpm then return 3 end
  return false
end
local held = math.max(0, math.ceil((oldest + 60 - now) * 1000))
local code = over(0, 0, 0)
if code then
  if want > 0 then
    local all, lr, lt, lc, soon = redis.call('HGETALL', KEYS[4]), 0, 0, 0, nil
    for i = 1, #all, 2 do
      local n, t, c, ends = string.match(all[i + 1], '(%d+) (%d+) (%d+) (%d+)')
      ends = tonumber(ends)
      if ends + GRACE_MS < now * 1000 then redis.call('HDEL', KEYS[4], all[i])
      else
        lr, lt, lc, soon = lr + tonumber(n), lt + tonumber(t), lc + tonumber(c), math.min(soon or ends, ends)
      end
    end
    if soon and not over(lr, lt, lc) then return {6, math.max(5, math.ceil(soon - now * 1000))} end
  end
  if code == 1 then return {1, 0, reqs, toks, held, spend[1]} end
  local after = 0  -- an rpm refusal waits for tpm too, when both refuse: until a request would pass
  if tpm >= 0 and toks + tokens > tpm then after = wait('t', toks + tokens - tpm) end
  if code == 2 then return {2, math.max(wait('r', reqs + 1 - rpm), after), reqs, toks, held} end
  return {3, after, reqs, toks, held}
end
if conc >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now * 1000)
  if redis.call('ZCARD', KEYS[2]) >= conc then return {4, 1000, reqs, toks, held} end
  redis.call('ZADD', KEYS[2], now * 1000 + hold, ARGV[1])
  redis.call('PEXPIRE', KEYS[2], hold)
end
local n, life = 1, 0
if want > 1 and conc < 0 then
  n = want
  if rpm >= 0 then n = math.min(n, math.floor((rpm - reqs) / 4)) end
  if tpm >= 0 and tokens > 0 then n = math.min(n, math.floor((tpm - toks) / (4 * tokens))) end
  if budget >= 0 and cost > 0 then n = math.min(n, math.floor((budget - spent - reserved) / (4 * cost))) end
  local ms = math.floor(now * 1000)
  local ends = math.min(ms + LEASE_MS, (sec + 1) * 1000)
  life = ends - ms
  if n < LEASE_MIN then n, life = 1, 0 elseif life < 10 then n, life = 1, -1 else
    redis.call('HSET', KEYS[4], ARGV[1], string.format('%d %d %d %d', n - 1, (n - 1) * tokens, (n - 1) * cost, ends))
    redis.call('PEXPIRE', KEYS[4], LEASE_MS + GRACE_MS + 1000)
  end
end
if #dead > 0 then redis.call('HDEL', w, unpack(dead)) end
redis.call('HINCRBY', w, 'r' .. sec, n)
redis.call('HINCRBY', w, 't' .. sec, string.format('%d', n * tokens))
reqs, toks = reqs + n, toks + n * tokens
redis.call('HSET', w, 'R', string.format('%d', reqs), 'T', string.format('%d', toks), 'o', string.format('%d', oldest))
redis.call('EXPIRE', w, 61)
if budget >= 0 and n * cost > 0 then
  redis.call('HINCRBY', KEYS[3], 'r', string.format('%d', n * cost))
  redis.call('HINCRBY', KEYS[3], 'b' .. bucket, string.format('%d', n * cost))
  if not spend[3] then redis.call('HSET', KEYS[3], 'ob', string.format('%d', bucket)) end
end
local reset = math.max(0, math.ceil((oldest + 60 - now) * 1000))
return string.format('%d %d %d %d %d %d %s', sec, rpm - reqs, tpm - toks, reset, n, life, spend and spend[4] or '-')
"""
for _name, _value in (("LEASE_MS", int(LEASE_S * 1000)), ("GRACE_MS", int(GRACE_S * 1000)), ("LEASE_MIN", LEASE_MIN)):
    ADMIT = ADMIT.replace(_name, str(_value))

SETTLE = """
local loaded = redis.call('HEXISTS', KEYS[3], 's') == 1
for i = 1, #ARGV, 6 do
  local at, delta, reserved, back = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 5]
  if delta ~= '0' and redis.call('HEXISTS', KEYS[1], 't' .. at) == 1 then
    redis.call('HINCRBY', KEYS[1], 't' .. at, delta)
    redis.call('HINCRBY', KEYS[1], 'T', delta)
  end
  if back == '-' then
    redis.call('ZREM', KEYS[2], ARGV[i])
  elseif back ~= '=' then
    redis.call('HDEL', KEYS[4], ARGV[i])
    if back ~= '0' and redis.call('HEXISTS', KEYS[1], 'r' .. at) == 1 then
      redis.call('HINCRBY', KEYS[1], 'r' .. at, '-' .. back)
      redis.call('HINCRBY', KEYS[1], 'R', '-' .. back)
    end
  end
  local b = reserved ~= '-1' and reserved ~= '0' and 'b' .. math.floor(tonumber(at) / 60)
  if b and redis.call('HEXISTS', KEYS[3], b) == 1 then
    if redis.call('HINCRBY', KEYS[3], b, '-' .. reserved) <= 0 then redis.call('HDEL', KEYS[3], b) end
    if redis.call('HINCRBY', KEYS[3], 'r', '-' .. reserved) < 0 then redis.call('HSET', KEYS[3], 'r', '0') end
  end
  if loaded and ARGV[i + 4] ~= '0' then redis.call('HINCRBY', KEYS[3], 's', ARGV[i + 4]) end
end
return 0
"""

LOAD = """
if redis.call('HSETNX', KEYS[1], 's', ARGV[1]) == 1 then
  redis.call('HSETNX', KEYS[1], 'r', '0')
  redis.call('HSETNX', KEYS[1], 'g', ARGV[3])
  if tonumber(ARGV[2]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[2]) else redis.call('PERSIST', KEYS[1]) end
end
return 0
"""

RESTORE = """
local k = KEYS[1]
local g = redis.call('HGET', k, 'g')
if ARGV[2] == '' or g == ARGV[2] then return g or '' end
if not g then
  g = ARGV[3]
  redis.call('HSET', k, 'g', g)
  if redis.call('HEXISTS', k, 's') == 0 and redis.call('TTL', k) < 0 then redis.call('EXPIRE', k, 86400) end
end
if redis.call('HSETNX', k, 'p' .. ARGV[1] .. ':' .. ARGV[2], '1') == 0 then return g end
local ob = tonumber(redis.call('HGET', k, 'ob') or '-1')
for i = 4, #ARGV, 2 do
  redis.call('HINCRBY', k, 'r', ARGV[i + 1])
  redis.call('HINCRBY', k, 'b' .. ARGV[i], ARGV[i + 1])
  if ob < 0 or tonumber(ARGV[i]) < ob then ob = tonumber(ARGV[i]) end
end
if ob >= 0 then redis.call('HSET', k, 'ob', string.format('%d', ob)) end
return g
"""

GENERATION = """
local g = redis.call('GET', KEYS[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not g then
  g = ARGV[1] .. ':' .. string.format('%d', now)
  redis.call('SET', KEYS[1], g)
end
return {g, string.format('%d', now)}
"""

_REFUSALS: dict[int, Refusal] = {1: "budget", 2: "rpm", 3: "tpm", 4: "max_concurrency", 5: "budget_missing"}
_MISSING: dict[int, Refusal] = {5: "budget_missing"}


def refused(ask: Ask, reply: list[Any]) -> Verdict:
    """The verdict of an admission the script refused (its codes: module doc)."""
    code = reply[0]
    if len(reply) < 5:  # budget_missing, and nothing else (a shorter reply is not the script's: KeyError)
        return Verdict(refused=_MISSING[code])
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


UNREADABLE_REPLY = (TypeError, ValueError, IndexError, KeyError, AttributeError)  # a reply not of a script's shape


def malformed(reply: Any) -> LimiterDown:
    """Redis answered, but not as the script does (a proxy, a failover): as if it were down (503)."""
    return LimiterDown(f"malformed reply from Redis: {repr(reply)[:60]}")
