"""Other processes' routing state changes (`app.routing.cluster_events`), applied to this one's.

Times come as durations, never as the publisher's wall clock: replicas' clocks disagree (a clock
audit measured a replica 300 s behind its publisher keep a healthy backend out for 305 s, past
`max_cooldown_s`, and one ahead of it ignore the upstream's Retry-After). A live event carries its
own (`CoolEvent.seconds`, the cool-down left; `DisabledEvent.ago`, the time since the provider was
disabled); one read back from Redis at start or on reconnect is timed by its key's time to live
(`stored_s`), as a cool-down's key lives exactly as long as the cool-down and a disabled record's
`STATE_TTL_S`. Events of a version before those fields are timed by their epoch seconds.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from app.routing.cluster_events import BreakerEvent, CoolEvent, DisabledEvent, Event
from app.routing.router import Backend, Router

STATE_TTL_S = 3600.0  # the longest a breaker or disabled record is kept


def apply_event(router: Router | None, log: Any, event: Event, stored_s: float | None = None) -> None:
    """Another process's state change, applied to ours (never announced again). A breaker or a
    provider that changes state here is logged, with `source="cluster"` and the `origin` worker.
    Times come as durations, not from the publisher's wall clock (replicas' clocks disagree):
    a live event's own (`seconds`, `ago`); one read back from Redis (`stored_s`: its key's time
    to live) from that, as a cool-down's key lives as long as it, a disabled one `STATE_TTL_S`."""
    now = asyncio.get_running_loop().time()
    wall = time.time()  # epoch `t` is loop time `now - (wall - t)`
    if isinstance(event, CoolEvent | BreakerEvent):
        known = router.by_key if router is not None else {}
        backend = known.get((event.provider, event.model, event.upstream_model))
        if backend is None:
            return
        if isinstance(event, BreakerEvent):
            _apply_breaker(backend, event, log)
        else:
            left = stored_s if stored_s is not None else event.seconds
            if left is None:  # from a version before `seconds`
                left = event.until - wall
            if left > 0:
                backend.state.cool_down(now, left, event.reason)
        return
    runtime = router.providers.get(event.provider) if router is not None else None
    if runtime is None or runtime.state.key_missing:
        return
    state = runtime.state
    origin = {"source": "cluster", "origin": event.origin}
    if isinstance(event, DisabledEvent):
        if state.ready:
            log.error("provider_disabled", provider=event.provider, reason=event.reason, **origin)
        ago = wall - event.at if event.ago is None else event.ago  # `at`: from a version before `ago`
        if event.ago is not None and stored_s is not None:
            ago += STATE_TTL_S - stored_s  # its time in Redis since
        state.disable(event.reason, now - ago, quota=event.quota)
        for backend_state in runtime.backends:
            backend_state.evict()
    else:
        if not state.ready:
            log.warning("provider_enabled", provider=event.provider, was=state.disabled_reason, **origin)
        state.enable()


def _apply_breaker(backend: Backend, event: BreakerEvent, log: Any) -> None:
    was_open = backend.state.breaker_open
    if event.open:
        backend.state.breaker_open = True
        backend.state.evict()
    else:
        backend.state.close_breaker()
    if was_open != event.open:
        names = {"provider": event.provider, "model": event.model, "upstream_model": event.upstream_model}
        origin = {"source": "cluster", "origin": event.origin}
        if event.open:
            log.warning("breaker_open", **names, **origin)
        else:
            log.info("breaker_closed", **names, **origin)
