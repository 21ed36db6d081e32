"""Relaying the pipeline's events to an SSE response: rendering, keep-alive pings, prompt cancel.

The pipeline's event generator runs in one pump task per request, which renders each batch of
events (`Pipeline.stream`) to bytes with the ingress's `StreamRenderer`; the response iterates
the `Relay`. That split buys three things without per-chunk timers:
- keep-alive: one repeating timer per request pushes the renderer's `ping` when nothing was sent
  for `interval` seconds, before the first token too, once the request is admitted (a keep-alive
  that starts the response is the renderer's `opening`: Anthropic's `message_start` comes before
  its first `ping`);
- the first item decides the response: an exception before any frame is an ordinary HTTP error
  (rendered by the ingress's error handler), a frame (or a ping, when the upstream is slow to
  start) starts the 200 SSE response;
- cancellation: when the client goes away the handler's task is cancelled (`DisconnectWatch`),
  the relay is closed, which cancels the pump, and the cancellation lands inside the pipeline's
  upstream read, which closes the upstream connection and records the request as `cancelled`.
Frames that queue up while the client is slower than the upstream are sent joined, one write.
The queue holds `BUFFER_BYTES` at most: past that the pump waits for the client to take some, so
the upstream is read at the client's pace (a client that read the head and stopped held an
unbounded queue: 5 GB behind a fast upstream). A client that takes nothing for `CLIENT_STALL_S`
while the queue is full has stopped reading: the request ends there as `cancelled`, its upstream
connection and slot given back.

The response's head, sent with the first frame, carries an API key's `x-ratelimit-*`: the
pipeline writes them into the request's `StreamHead` at admission, before any frame and before a
keep-alive can start the response. (A generator between the pipeline and the relay that tapped
them cost a layer per batch.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator
from typing import Protocol

from app.errors import GatewayError, InternalError
from app.pipeline.events import Event, StreamHead

_END = object()
ADMISSION_RECHECK_S = 0.25  # a keep-alive due before admission ended looks again this soon
BUFFER_BYTES = 1 << 20  # the frames one stream may hold for a slow client (a whole usual answer)
CLIENT_STALL_S = 60.0  # a client that takes none of a full queue for this long has stopped reading


class StreamRenderer(Protocol):
    """One ingress's streaming format: canonical events in, SSE bytes out."""

    ping: bytes
    holds: bool = False  # whether `flush` may have something to say (the relay asks only then)

    def render(self, event: Event) -> bytes:
        """The frames for `event` (b"" when the format has nothing to say for it)."""

    def error(self, error: GatewayError) -> bytes:
        """The frame that ends a stream that failed after it started."""

    def flush(self) -> bytes:
        """What the format held back from the batch just rendered (a text delta waiting for its
        log probabilities, which come in the same batch when the upstream sends them): sent with
        that batch, never behind the next upstream read. Asked only of a format that `holds`:
        a call per batch is ~350 instructions a chunk that every other stream would pay
        (bench/instructions.sh, 64-chunk streams: +0.9 %)."""
        return b""

    def opening(self, head: StreamHead) -> bytes:
        """The keep-alive that starts the response, before any event: `ping`, unless the format's
        stream must open otherwise (a renderer that subclasses this protocol inherits this)."""
        return self.ping


class Relay:
    def __init__(
        self, source: AsyncGenerator[list[Event], None], renderer: StreamRenderer, interval: float, head: StreamHead
    ) -> None:
        self._source = source
        self._renderer = renderer
        self.head = head  # the pipeline's (module doc)
        self._begun = False  # whether `first` has returned: the response has started
        self._interval = interval
        self._items: deque[object] = deque()
        self._queued = 0  # bytes in `_items`
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None  # the pump's, while the queue is full
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(interval, self._tick)
        self._pump = asyncio.create_task(self._run())

    async def _run(self) -> None:
        render = self._renderer.render
        flush = self._renderer.flush if self._renderer.holds else None
        source = self._source
        try:
            async for batch in source:
                data = b"".join([render(event) for event in batch])
                if flush is not None:
                    data += flush()
                if data:
                    self._push(data)
                    if self._queued > BUFFER_BYTES and not await self._room():
                        await source.aclose()  # the client stopped reading: the request ends as cancelled
                        return
        except asyncio.CancelledError:
            await source.aclose()  # cancelled waiting for room, not in the pipeline: it ends as cancelled too
            raise
        except BaseException as exc:
            self._push(exc)
        finally:
            self._push(_END)

    async def _room(self) -> bool:
        """Wait until the client has taken the queue down to `BUFFER_BYTES`; False when it took
        nothing for `CLIENT_STALL_S`."""
        while self._queued > BUFFER_BYTES:
            self._drained = self._loop.create_future()
            try:
                async with asyncio.timeout(CLIENT_STALL_S):
                    await self._drained
            except TimeoutError:
                return False
            finally:
                self._drained = None
        return True

    def _push(self, item: object) -> None:
        self._items.append(item)
        if type(item) is bytes:
            self._queued += len(item)
        self._last = self._loop.time()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _tick(self) -> None:
        idle = self._loop.time() - self._last
        delay = self._interval - idle
        if idle >= self._interval and not self._items:
            if self._begun:
                self._push(self._renderer.ping)
                delay = self._interval
            elif self.head.model is not None:  # admitted
                self._push(self._renderer.opening(self.head))
                delay = self._interval
            else:  # not admitted yet: the head waits for the key's headers (`StreamHead`)
                delay = ADMISSION_RECHECK_S
        self._timer = self._loop.call_later(delay, self._tick)

    async def first(self) -> bytes:
        """The first frame; raises the pipeline's error when it failed before any output."""
        try:
            item = await self._next()
        except BaseException:  # cancelled: the client went away before the first frame
            await self.aclose()
            raise
        if isinstance(item, BaseException):
            await self.aclose()
            raise item
        if item is _END:
            await self.aclose()
            raise InternalError("the completion ended without output")
        self._begun = True
        return item  # type: ignore[return-value]

    async def _next(self) -> object:
        while not self._items:
            self._waiter = self._loop.create_future()
            await self._waiter
            self._waiter = None
        return self._take()

    def _take(self) -> object:
        item = self._items.popleft()
        if type(item) is bytes:
            self._queued -= len(item)
            drained = self._drained
            if drained is not None and self._queued <= BUFFER_BYTES and not drained.done():
                drained.set_result(None)
        return item

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
                        chunks.append(self._error_frame(item))
                        yield b"".join(chunks)
                        return
                    chunks.append(item)  # type: ignore[arg-type]
                    if not self._items:
                        break
                    item = self._take()
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

    def _error_frame(self, exc: BaseException) -> bytes:
        """A failure the pipeline did not turn into an error `Outcome` (a bug): said generically."""
        return self._renderer.error(exc if isinstance(exc, GatewayError) else InternalError("internal error"))
