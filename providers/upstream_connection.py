"""One upstream connection as the plain/TLS transport keeps it (`providers.transport`): an
`asyncio.Protocol` that buffers what it receives for the answer's reader, says when the server's
end came, and wakes the reader waiting in `more` — within a read timeout on the loop's coarse
timers (`providers.timers`)."""

from __future__ import annotations

import asyncio
import select

import httpx

from providers.timers import timers_of

PAUSE_AT = 256 * 1024  # unread bytes at which a connection stops reading its socket (`Connection`)


class Connection(asyncio.Protocol):
    """One upstream connection: what it received, kept in `buffer` for the answer's reader. Past
    `PAUSE_AT` bytes unread the socket is no longer read until the reader waits for more (`more`),
    so a reader that stopped (the relay behind a client that stopped) holds the upstream back
    instead of taking its whole answer into memory (300 MB in 1 s from a fast upstream)."""

    __slots__ = (
        "buffer",
        "closed",
        "eof",
        "error",
        "idle_since",
        "loop",
        "paused",
        "poller",
        "timers",
        "transport",
        "waiter",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.timers = timers_of(loop)
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.eof = False
        self.error: BaseException | None = None
        self.idle_since = 0.0  # when it went back to the pool
        self.poller = select.poll()  # is anything waiting on the socket (`H1Transport._take`)
        self.paused = False  # reading stopped at `PAUSE_AT`

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.poller.register(transport.get_extra_info("socket").fileno(), select.POLLIN)

    def send(self, payload: bytes, body: bytes = b"") -> None:
        """Write a request: `payload`, then `body` when there is one, as it is (a large request
        body, not copied once more behind its head: one `writev`)."""
        assert self.transport is not None
        if body:
            self.transport.writelines((payload, body))
        else:
            self.transport.write(payload)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > PAUSE_AT and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def more(self, read_s: float | None) -> None:
        """Wait for more bytes (or the end); raises httpx.ReadTimeout after `read_s` seconds."""
        if self.closed or self.eof:
            raise httpx.ReadError("upstream closed the connection") from self.error
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        waiter = self.waiter = self.loop.create_future()
        timer = self.timers.call_later(read_s, _expire, waiter) if read_s is not None else None
        try:
            await waiter
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout("upstream sent nothing within the read timeout"))
