"""Each response's head leaves in the same `write` as its first body bytes.

uvicorn's request cycle writes the head when the application sends `http.response.start` and the
body when it sends `http.response.body`: two `write`s, so two `send` system calls and two TCP
segments for every JSON answer. On loopback and on a LAN the kernel's work per segment (and the
client's wake-up per segment) is a good part of a small answer's cost, so `HeldHeadCycle` holds
the head's bytes until the first body message and hands both to the transport in one `write`.

It changes nothing else: uvicorn's own `send` builds and checks the head and frames the body (its
checks, errors, keep-alive, chunking and `HEAD` handling stay its own); only the transport it
writes to is, for the head, a holder, and for the first body, a writer that puts the held head in
front. The bytes on the wire are the same; there are fewer writes. A head is never held past its
body: the first body message sends it, even one uvicorn writes nothing for (an empty body, or any
body of a `HEAD` request). Only an application that fails after its head and before any body
differs: uvicorn closes that connection either way, and here its head is not written first.

`GuardedHttpToolsProtocol` (`app.edge.connection`) gives each new cycle this class once uvicorn
has made it (uvicorn builds the cycle itself, by name, in `on_headers_complete`).
"""

from __future__ import annotations

from typing import Any

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class _Holder:
    """The transport as uvicorn's `send` sees it while it writes a head: the bytes are kept."""

    __slots__ = ("held", "transport")

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.held: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.held.append(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class _Prefixed:
    """The transport while uvicorn writes the first body: the held head goes in front, once."""

    __slots__ = ("held", "transport")

    def __init__(self, transport: Any, held: bytes) -> None:
        self.transport = transport
        self.held = held

    def write(self, data: bytes) -> None:
        held, self.held = self.held, b""
        self.transport.write(held + data if held else data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class HeldHeadCycle(RequestResponseCycle):
    """uvicorn's cycle, but for the head's bytes, which leave with the first body's (module doc)."""

    held: bytes = b""

    async def send(self, message: ASGISendEvent) -> None:
        transport = self.transport
        if message["type"] == "http.response.start" and not self.response_started:
            holder = _Holder(transport)
            self.transport = holder  # type: ignore[assignment]
            try:
                await super().send(message)
            finally:
                self.transport = transport
                self.held = b"".join(holder.held)
            return
        held = self.held
        if not held:
            await super().send(message)
            return
        self.held = b""
        prefixed = _Prefixed(transport, held)
        self.transport = prefixed  # type: ignore[assignment]
        try:
            await super().send(message)
        finally:
            self.transport = transport
            if prefixed.held and not self.disconnected:  # no body bytes were written: the head alone
                transport.write(prefixed.held)
