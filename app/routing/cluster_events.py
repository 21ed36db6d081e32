"""The state changes workers and replicas tell each other through Redis (`app.routing.cluster`).

Each is one JSON object, tagged by `type`: the value of its key in Redis and the message on
`{prefix}:events`. `origin` is the worker that made the change (a worker skips its own); times are
wall-clock epoch seconds, since loop clocks differ between processes.
"""

from __future__ import annotations

from msgspec import Struct

from app.routing.state import CoolReason


class CoolEvent(Struct, tag="cool", frozen=True):
    origin: str
    provider: str
    model: str
    upstream_model: str
    until: float  # epoch seconds
    reason: CoolReason
    seconds: float | None = None  # the cool-down left when published: replicas' wall clocks disagree


class BreakerEvent(Struct, tag="breaker", frozen=True):
    origin: str
    provider: str
    model: str
    upstream_model: str
    open: bool


class DisabledEvent(Struct, tag="disabled", frozen=True):
    origin: str
    provider: str
    reason: str
    quota: bool
    at: float  # epoch seconds
    ago: float | None = None  # seconds since it was disabled, when published: wall clocks disagree


class EnabledEvent(Struct, tag="enabled", frozen=True):
    origin: str
    provider: str


Event = CoolEvent | BreakerEvent | DisabledEvent | EnabledEvent
