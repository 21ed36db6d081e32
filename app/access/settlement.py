"""A settlement command's answer (`app.access.redis_limiter` sends one per key's waiting settlements)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from msgspec import Struct

from app.access.lane import Lane
from app.access.resp import RespClient, RespError, RespLost, Script


class Limiter(Protocol):
    """What a `Settlement` reads of its `RedisLimiter`."""

    redis: RespClient
    settle_script: Script
    resending: dict[bytes, float]
    retries: set[asyncio.Future[Any]]
    failed: Callable[[str, str], None]

    def after_loss(self, lane: Lane, items: list[bytes]) -> bool: ...


class Settlement(Struct):
    """A settlement command's answer (one key's settlements): the script loaded and the command
    resent on NOSCRIPT (Redis restarted); `after_loss` when lost; reported to the gate otherwise.
    Answered or lost, what it gives back of the budget leaves the lane's `held` (`Lane.hold`)."""

    limiter: Limiter
    lane: Lane
    command: bytes
    items: list[bytes]
    releases: dict[int, int] | None = None

    def __call__(self, reply: Any) -> None:
        limiter = self.limiter
        if self.releases is not None:
            self.lane.released(self.releases)
            self.releases = None
        if not isinstance(reply, RespError):
            if limiter.resending:  # taken: no more tries
                for item in self.items:
                    limiter.resending.pop(item, None)
            return
        if str(reply).startswith("NOSCRIPT"):
            retry = asyncio.ensure_future(limiter.redis.evalsha(limiter.settle_script, self.command))
            limiter.retries.add(retry)
            retry.add_done_callback(self._retried)
        elif not (isinstance(reply, RespLost) and limiter.after_loss(self.lane, self.items)):  # slots alone: quiet
            limiter.failed(self.lane.key_id, f"{type(reply).__name__}: {reply}")

    def _retried(self, done: asyncio.Future[Any]) -> None:
        self.limiter.retries.discard(done)
        error = None if done.cancelled() else done.exception()
        if error is not None:
            self.limiter.failed(self.lane.key_id, f"{type(error).__name__}: {error}")
        else:  # went through: as an answer that did
            self(None)
