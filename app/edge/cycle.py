"""Each response's head leaves in the same `write` as its first body bytes.

uvicorn's request cycle writes the head when the application sends `http.response.start` and the
body when it sends `http.response.body`: two `write`s, so two `send` system calls and two TCP
segments for every JSON answer. On loopback and on a LAN the kernel's work per segment (and the
client's wake-up per segment) is a good part of a small answer's cost, so each cycle writes to a
`HeldHead` instead of the connection's transport: it keeps the first write (the head) and puts it
in front of the next one (the first body bytes), which leave together.

It changes nothing else: uvicorn's own `send` builds and checks the head and frames the body (its
checks, errors, keep-alive, chunking and `HEAD` handling stay its own); the bytes on the wire and
their order are the same, in one write fewer. A head is never held past its response: the next
write sends it; a response uvicorn writes no body for (a `HEAD` request's) sends it when it
completes (the cycle's `on_response` is `HeldHead.completed`); closing the
connection (an application that failed after its head) sends it first, as uvicorn would have.
The head waits for the first body, so an application that sends its head and only later its first
body bytes shows the client its head that much later; the completion doors send a stream's head
only once its first frame is ready (`app.edge.asgi.send_stream`), and the other routes' bodies
follow their heads at once.

Cost: about 1 µs of Python per response (a head and a body in a loop: 4.3 to 5.2 µs, against 3.3
to 3.6 through uvicorn alone) for one `send` system call and one TCP segment fewer; the throughput
it buys is in bench/RESULTS.md. `GuardedHttpToolsProtocol` (`app.edge.connection`) gives each cycle its
`HeldHead` once uvicorn has made the cycle (uvicorn builds it itself, in `on_headers_complete`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


def hold_head(cycle: RequestResponseCycle) -> None:
    """Give `cycle` (just made by uvicorn, not yet run) a `HeldHead` in front of its transport."""
    held = HeldHead(cycle.transport, cycle.on_response)
    cycle.transport = held  # type: ignore[assignment]  # what the cycle calls of it: write, close, is_closing
    cycle.on_response = held.completed


class HeldHead:
    """A cycle's transport: the first write is held until the next one, or `release` (module doc)."""

    __slots__ = ("_held", "_holding", "_on_response", "transport")

    def __init__(self, transport: asyncio.Transport, on_response: Callable[[], None]) -> None:
        self.transport = transport
        self._held = b""
        self._holding = True  # the next write is the head: held
        self._on_response = on_response

    def write(self, data: bytes) -> None:
        if self._holding:
            self._holding = False
            self._held = data
            return
        held = self._held
        if held:
            self._held = b""
            data = held + data
        self.transport.write(data)

    def release(self) -> None:
        """Write what is held (a response whose body wrote nothing)."""
        self._holding = False
        held, self._held = self._held, b""
        if held and not self.transport.is_closing():
            self.transport.write(held)

    def completed(self) -> None:
        """The cycle's `on_response`: what is held leaves, then uvicorn's own callback runs."""
        self.release()
        self._on_response()

    def close(self) -> None:
        self.release()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()
