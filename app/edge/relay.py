"""Relaying pipeline frames to an SSE response, with keep-alive pings and prompt cancellation.

The pipeline's frame generator runs in one pump task per request; the response iterates a
`Relay`. That split buys three things without per-chunk timers:
- keep-alive: one repeating timer per request pushes `event: ping` when nothing was sent for
  `interval` seconds, before the first token too;
- the first item decides the response: an exception before any frame is an ordinary HTTP error,
  a frame (or a ping, when the upstream is slow to start) starts the 200 SSE response;
- cancellation: when the client goes away Litestar cancels the response, `aclose()` cancels the
  pump, and the cancellation lands inside the pipeline's upstream read, which closes the upstream
  connection and records the request as `cancelled`.
Frames that queue up while the client is slower than the upstream are sent joined, one write.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator

from app.edge import unified_format as wire
from app.errors import GatewayError, InternalError, stream_error_view

_END = object()


class Relay:
    def __init__(self, source: AsyncIterator[bytes], interval: float) -> None:
        self._source = source
        self._interval = interval
        self._items: deque[object] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(interval, self._tick)
        self._pump = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for data in self._source:
                self._push(data)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._push(exc)
        finally:
            self._push(_END)

    def _push(self, item: object) -> None:
        self._items.append(item)
        self._last = self._loop.time()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _tick(self) -> None:
        idle = self._loop.time() - self._last
        if idle >= self._interval and not self._items:
            self._push(wire.PING_FRAME)
            idle = 0.0
        self._timer = self._loop.call_later(self._interval - idle, self._tick)

    async def first(self) -> bytes:
        """The first frame; raises the pipeline's error when it failed before any output."""
        item = await self._next()
        if isinstance(item, BaseException):
            await self.aclose()
            raise item
        if item is _END:
            await self.aclose()
            raise InternalError("the completion ended without output")
        return item  # type: ignore[return-value]

    async def _next(self) -> object:
        while not self._items:
            self._waiter = self._loop.create_future()
            await self._waiter
            self._waiter = None
        return self._items.popleft()

    async def frames(self, first: bytes) -> AsyncGenerator[bytes, None]:
        try:
            yield first
            while True:
                item = await self._next()
                chunks: list[bytes] = []
                while True:
                    if item is _END:
                        if chunks:
                            yield b"".join(chunks)
                        return
                    if isinstance(item, BaseException):
                        chunks.append(_error_frame(item))
                        yield b"".join(chunks)
                        return
                    chunks.append(item)  # type: ignore[arg-type]
                    if not self._items:
                        break
                    item = self._items.popleft()
                yield b"".join(chunks)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pump.done():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump


def _error_frame(exc: BaseException) -> bytes:
    error = exc if isinstance(exc, GatewayError) else InternalError("internal error")
    return wire.frame(wire.ErrorEvent(error=stream_error_view(error)))
