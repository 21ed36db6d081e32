"""Routing state shared by every worker and replica through Redis (`[redis]` in config.toml).

Each process keeps routing in its own memory (`app.routing.state`) and decides on it alone: a request
never waits on Redis. What is shared is what changes rarely and matters to everyone:

    event          key (value: the event as JSON)                           expires
    cool-down      {prefix}:cool:{provider}:{model}:{upstream_model}        when the cool-down ends
    breaker open   {prefix}:breaker:{provider}:{model}:{upstream_model}     deleted when it closes
    disabled       {prefix}:disabled:{provider}                             deleted when re-enabled

A change made here (`failover.apply_failure`, `HealthMonitor`) is written as its key and published
on `{prefix}:events` in one transaction, by one background writer (fire and forget; errors are
logged). Changes made while a write is out go in the next one, in order, the latest of each key
only (a key's event is its whole state): a burst of failures takes one connection, not one each
(a task per change grew the pool with every burst). Connections are named `switchyard:{worker_id}`.

A background listener applies the other processes' events (`app.routing.cluster_events`) to the
local state; on start it subscribes first and then loads the keys, so a new worker learns what the
others already know and misses nothing written meanwhile. Times travel as durations, not as the
publisher's wall clock (`app.routing.cluster_apply`). Breaker and disabled keys also expire after
`STATE_TTL_S`, so a record that only a health probe can end does not outlive every gateway that
could probe; a worker that loads one probes for itself anyway.

Redis down: the first failure is logged, every process keeps routing on what it knows, events
meanwhile stay local, and the listener reconnects in the background (then loads the keys again).

Metrics: every second each worker writes its samples (`Metrics.series`: counters, histograms as
their `_bucket`/`_sum` samples, and its in-flight/queued gauges) to the hash
`{prefix}:metrics:{worker_id}` — field the JSON `[name, [label values]]`, value a number — expiring
after `METRICS_TTL_S`, so a worker that went away drops out. Only the fields that changed since the
last write are sent (every one after a failed write, or when that write found the hash gone):
packing every sample through redis-py each second was most of an idle gateway's CPU with Redis
(callgrind). `/metrics` adds the other live workers' hashes to its own numbers (`remote_series`);
concurrent scrapes share one read.
A worker of another version skips the names it does not know.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from app.metrics import Metrics, Series, merged
from app.routing.cluster_apply import STATE_TTL_S, apply_event
from app.routing.cluster_events import BreakerEvent, CoolEvent, DisabledEvent, EnabledEvent, Event
from app.routing.router import Backend, ProviderRuntime, Router
from app.settings import RedisSettings

METRICS_INTERVAL_S = 1.0
METRICS_TTL_S = 10.0
RECONNECT_S = 1.0
# What a lost Redis raises. uvloop raises RuntimeError ("the handler is closed") for a write on a
# connection Redis reset, which redis-py hands up as it is; every block these are caught around
# holds Redis calls only, so there a RuntimeError is the link, not a bug of the gateway.
_ERRORS = (RedisError, OSError, RuntimeError)


_encode = msgspec.json.Encoder().encode
_decode_event = msgspec.json.Decoder(Event).decode
_decode_series = msgspec.json.Decoder(tuple[str, tuple[str, ...]]).decode


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ClusterLink:
    """One process's link to the others: publishes its state changes (a `StatePublisher`),
    applies theirs, and shares its metrics."""

    def __init__(self, settings: RedisSettings, metrics: Metrics, log: Any, worker_id: str | None = None) -> None:
        self.worker_id = worker_id or new_worker_id()
        self.prefix = settings.key_prefix
        self.channel = f"{self.prefix}:events"
        self.metrics = metrics
        self.log = log
        # No retries inside the client: a failed call is logged and the listener reconnects.
        self.redis = Redis.from_url(
            settings.url,
            socket_connect_timeout=1.0,
            socket_timeout=5.0,
            retry=Retry(NoBackoff(), 0),
            client_name=f"switchyard:{self.worker_id}",
        )
        self.available = False
        self._outage_logged = False
        self._router: Router | None = None
        self._pubsub: PubSub | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: dict[str, tuple[bytes, int | None]] = {}  # key → (event, expiry), oldest first
        self._writer: asyncio.Task[None] | None = None
        self._reading: asyncio.Future[Mapping[Series, float] | None] | None = None  # the scrapes' shared read
        self._written: dict[Series, float] = {}  # the metrics hash's fields as Redis last took them
        self._names: dict[Series, bytes] = {}  # each series' field name, encoded once
        self._sharing = asyncio.Lock()  # one metrics write at a time, so Redis keeps the latest samples

    # -- life cycle ------------------------------------------------------------------------------

    async def start(self, router: Router) -> None:
        """Learn the current state (if Redis answers), then listen and share metrics in the background."""
        self._router = router
        await self._connect()
        self._tasks = [asyncio.create_task(self._listen()), asyncio.create_task(self._share_metrics())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        writer = self._writer  # None again once it is done
        if writer is not None:
            await asyncio.wait({writer}, timeout=2.0)
            writer.cancel()
        if self.available:
            with contextlib.suppress(*_ERRORS):
                await self.redis.delete(self._metrics_key(self.worker_id))
        await self._close_pubsub()
        await self.redis.aclose()

    async def _connect(self) -> bool:
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self.channel)
            stored = await self._stored()
        except _ERRORS as exc:
            with contextlib.suppress(*_ERRORS):
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # untyped in redis-py
            self._down(exc)
            return False
        self._pubsub = pubsub  # first: closed by the next reconnect, should applying what was stored fail
        for raw, ttl_ms in stored:
            self._apply_raw(raw, ttl_ms / 1000 if ttl_ms > 0 else None)
        if self._outage_logged:
            self.log.warning("redis_reconnected", worker=self.worker_id)
        self.available, self._outage_logged = True, False
        return True

    async def _close_pubsub(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(*_ERRORS):
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # untyped in redis-py

    def _down(self, exc: BaseException) -> None:
        """Redis failed: log it once per outage; the listener reconnects."""
        self.available = False
        if not self._outage_logged:
            self._outage_logged = True
            self.log.error("redis_unavailable", error=f"{type(exc).__name__}: {exc}", worker=self.worker_id)

    # -- remote events -----------------------------------------------------------------------------

    async def _listen(self) -> None:
        while True:
            try:
                await self._receive()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end the listener for the process's life
                self.log.exception("redis_listener_failed", worker=self.worker_id)
                self.available = False
                await asyncio.sleep(RECONNECT_S)

    async def _receive(self) -> None:
        """Apply the next event, if one comes within a second; reconnect first when needed."""
        if self._pubsub is None or not self.available:
            await self._close_pubsub()
            if not await self._connect():
                await asyncio.sleep(RECONNECT_S)
            return
        try:
            message = await self._pubsub.get_message(timeout=1.0)
        except _ERRORS as exc:
            self._down(exc)
            return
        if message is not None and message.get("type") == "message":
            self._apply_raw(message["data"])

    async def _stored(self) -> list[tuple[bytes | str, int]]:
        """Every cool-down, breaker and disabled provider Redis holds, each with its key's time to
        live in ms (what is left of it, on no wall clock): Redis calls only (`_ERRORS`), applied
        by the caller."""
        stored: list[tuple[bytes | str, int]] = []
        for kind in ("cool", "breaker", "disabled"):
            keys = [key async for key in self.redis.scan_iter(match=f"{self.prefix}:{kind}:*", count=500)]
            if keys:
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.mget(keys)
                    for key in keys:
                        pipe.pttl(key)
                    values, *ttls = await pipe.execute()
                stored += [(raw, ttl) for raw, ttl in zip(values, ttls, strict=True) if raw is not None]
        return stored

    def _apply_raw(self, raw: bytes | str, stored_s: float | None = None) -> None:
        try:
            event = _decode_event(raw)
        except msgspec.DecodeError:
            self.log.warning("redis_event_unreadable", data=str(raw[:200]))
            return
        if event.origin != self.worker_id:
            self.apply(event, stored_s)

    def apply(self, event: Event, stored_s: float | None = None) -> None:
        """Another process's state change, applied to ours (`cluster_apply.apply_event`)."""
        apply_event(self._router, self.log, event, stored_s)

    # -- publishing (StatePublisher) ---------------------------------------------------------------

    def cooled(self, backend: Backend) -> None:
        state = backend.state
        remaining = state.cooling_until - asyncio.get_running_loop().time()
        if remaining <= 0 or state.cool_reason is None:
            return
        until = time.time() + remaining
        names = (backend.name, backend.model_id, backend.upstream_model)
        event = CoolEvent(self.worker_id, *names, until=until, reason=state.cool_reason, seconds=remaining)
        self._publish(self._backend_key("cool", backend), event, math.ceil(remaining * 1000))

    def breaker_changed(self, backend: Backend) -> None:
        is_open = backend.state.breaker_open
        event = BreakerEvent(self.worker_id, backend.name, backend.model_id, backend.upstream_model, is_open)
        self._publish(self._backend_key("breaker", backend), event, _ms(STATE_TTL_S) if is_open else None)

    def provider_disabled(self, provider: ProviderRuntime) -> None:
        state = provider.state
        if state.disabled_reason is None or state.key_missing:
            return
        ago = asyncio.get_running_loop().time() - state.disabled_at
        names = (self.worker_id, provider.config.name, state.disabled_reason, state.quota_exhausted)
        event = DisabledEvent(*names, at=time.time() - ago, ago=ago)
        self._publish(f"{self.prefix}:disabled:{provider.config.name}", event, _ms(STATE_TTL_S))

    def provider_enabled(self, provider: ProviderRuntime) -> None:
        event = EnabledEvent(self.worker_id, provider.config.name)
        self._publish(f"{self.prefix}:disabled:{provider.config.name}", event, None)

    def _backend_key(self, kind: str, backend: Backend) -> str:
        return f"{self.prefix}:{kind}:{backend.name}:{backend.model_id}:{backend.upstream_model}"

    def _publish(self, key: str, event: Event, expire_ms: int | None) -> None:
        """Set (or, with no expiry, delete) `key` and publish the event, in the background."""
        if not self.available:
            return  # the outage is logged; this change stays local
        self._pending.pop(key, None)  # the latest of a key goes last, after the changes made before it
        self._pending[key] = (_encode(event), expire_ms)
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_pending())

    async def _write_pending(self) -> None:
        try:
            while self._pending:
                changes, self._pending = self._pending, {}
                if not await self._write(changes):
                    self._pending.clear()  # Redis is down: these stay local, like the ones after them
        finally:
            self._writer = None

    async def _write(self, changes: Mapping[str, tuple[bytes, int | None]]) -> bool:
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                for key, (payload, expire_ms) in changes.items():
                    if expire_ms is None:
                        pipe.delete(key)
                    else:
                        pipe.set(key, payload, px=max(1, expire_ms))
                    pipe.publish(self.channel, payload)
                await pipe.execute()
        except _ERRORS as exc:
            self._down(exc)
            return False
        return True

    # -- metrics -----------------------------------------------------------------------------------

    def _metrics_key(self, worker_id: str) -> str:
        return f"{self.prefix}:metrics:{worker_id}"

    async def _share_metrics(self) -> None:
        while True:
            await asyncio.sleep(METRICS_INTERVAL_S)
            if self.available and self._router is not None:
                try:
                    await self.write_metrics()
                except Exception:
                    self.log.exception("redis_metrics_failed", worker=self.worker_id)

    async def share_now(self) -> Mapping[Series, float] | None:
        """For a scrape: this worker's samples, written to Redis before the scrape reads the other
        workers' and shown as written, so that any later scrape, through whichever worker, sums at
        least what this one showed. With the hash up to `METRICS_INTERVAL_S` old, a scrape through
        the other worker missed what this one had just counted: the sums fell from one scrape to
        the next, which Prometheus takes for counter resets. None when Redis does not answer."""
        if not self.available or self._router is None:
            return None
        return await self.write_metrics()

    async def write_metrics(self) -> dict[Series, float]:
        """This worker's samples and summed gauges, as a hash that lives `METRICS_TTL_S`: only the
        fields whose values changed since the last write Redis took (most of them do not, from one
        second to the next), every field when that write failed or found the hash gone (expired,
        or lost with Redis's data), so a lost hash is whole again one write later. The samples are
        taken under the lock, so writes reach Redis in the order of their samples. Returns them."""
        async with self._sharing:
            return await self._write_metrics()

    async def _write_metrics(self) -> dict[Series, float]:
        assert self._router is not None
        series = self.metrics.series(self._router)
        written, names = self._written, self._names
        mapping: dict[bytes, float] = {}
        for one, value in series.items():
            if written.get(one) != value:
                name = names.get(one)
                if name is None:
                    name = names[one] = _encode(one)
                mapping[name] = value
        key = self._metrics_key(self.worker_id)
        self._written = {}  # until this write is known to have gone through
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.exists(key)
                if mapping:
                    pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]  # redis's stubs want str keys
                pipe.pexpire(key, _ms(METRICS_TTL_S))
                existed = (await pipe.execute())[0]
        except _ERRORS as exc:
            self._down(exc)
            return series
        if existed or not written:  # a hash found gone got only the changed fields: all, next time
            self._written = series
        return series

    async def remote_series(self) -> Mapping[Series, float] | None:
        """The sum of every other live worker's metrics; None when Redis does not answer. Scrapes
        that come while a read is out share it: one connection, however many scrape at once."""
        if not self.available:
            return None
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read_remote())
            self._reading.add_done_callback(self._read_done)
        return await asyncio.shield(self._reading)

    def _read_done(self, _: asyncio.Future[Mapping[Series, float] | None]) -> None:
        self._reading = None

    async def _read_remote(self) -> Mapping[Series, float] | None:
        own = self._metrics_key(self.worker_id).encode()
        try:
            keys = [k async for k in self.redis.scan_iter(match=self._metrics_key("*"), count=500) if k != own]
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hgetall(key)
                hashes: list[dict[bytes, bytes]] = await pipe.execute()
        except _ERRORS as exc:
            self._down(exc)
            return None
        total: dict[Series, float] = {}
        for fields in hashes:
            for field, value in fields.items():
                merged(total, _decode_series(field), float(value))
        return total


def _ms(seconds: float) -> int:
    return math.ceil(seconds * 1000)
