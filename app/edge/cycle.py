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

Two kinds of request, rare, get no `HeldHead` but a `FramedCycle`, which fixes what uvicorn's
framing gets wrong for them:
- an HTTP/1.0 request: uvicorn chunks a response without a length whatever the request's version,
  and RFC 9112 (6.1) forbids `Transfer-Encoding` in an answer to HTTP/1.0, whose client reads the
  chunk sizes as part of the body (hex lines between an SSE stream's frames). Its answer is
  delimited by the close instead (HTTP/1.0 connections are not kept alive). Its `Expect:
  100-continue` is ignored: no 1xx answer goes to an HTTP/1.0 client (RFC 9110 10.1.1, 15.2),
  which reads `HTTP/1.1 100 Continue` as its whole answer;
- a request that asked `Expect: 100-continue` and is answered before its body was asked for (a
  404, a 405): the client never sent that body, so a kept-alive connection would read the client's
  next request as it and answer nothing. The answer closes the connection (RFC 9110 10.1.1: the
  server says it will not read the body), as Go's server does; a lingering close (`_Lingering`),
  so a client that sends the body anyway still reads the answer.

The completion doors' heads are also built faster (`write_head`). uvicorn checks each header on its
own — two regular-expression searches (≈ 14 instructions a byte), a `lower()` and three comparisons
in Python per header, ≈ 5,700 instructions each (callgrind; keys mode's six `x-ratelimit-*` headers
cost 34k a response). A name (value) holds a byte uvicorn refuses exactly when the names (values)
joined end to end do, so a common head — names already lowercase, no `connection` or
`transfer-encoding`, a content length or none — is checked in two passes of `bytes.translate` over
the joined names and values (the bytes uvicorn's patterns refuse, and the capitals it would lower,
derived from those patterns), and written with the same bytes, into the same cycle state
(`content-length`, chunked, keep-alive) as uvicorn's `send` would. Any other head (a capital, a
forbidden byte, a special header, an access log, a paused or disconnected transport, a second start,
a server that is not uvicorn) is left to the cycle's own `send`, which writes, rewrites or refuses
it as before. It is a function the door calls with the cycle's `send`, not a subclass of the cycle:
a cycle whose class is switched after uvicorn made it loses CPython's attribute caches on every
access, which cost more than the headers saved.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle

_SPECIAL = frozenset((b"content-length", b"connection", b"transfer-encoding"))
_LENGTH = frozenset((b"content-length",))
# The bytes uvicorn's patterns refuse in a name (and the capitals it would lower) and in a value:
# a head holding none of them passes its checks unchanged (`write_head`).
_NAME_OFF = bytes(b for b in range(256) if HEADER_RE.search(bytes([b])) or bytes([b]).isupper())
_VALUE_OFF = bytes(b for b in range(256) if HEADER_VALUE_RE.search(bytes([b])))


def hold_head(cycle: RequestResponseCycle) -> None:
    """Give `cycle` (just made by uvicorn, not yet run) a `HeldHead` in front of its transport;
    not a cycle whose client waits for `100 Continue`, which uvicorn writes at the application's
    first `receive` and which must leave then, not in front of the response's head: that one, and
    an HTTP/1.0 request's, become `FramedCycle`s (module doc)."""
    if cycle.scope.get("http_version") == "1.0":
        cycle.waiting_for_100_continue = False  # RFC 9110 10.1.1: ignored in HTTP/1.0 (no 1xx answers)
        cycle.__class__ = FramedCycle
        return
    if cycle.waiting_for_100_continue:
        cycle.__class__ = FramedCycle  # before its task runs: the application gets this `send`
        return
    held = HeldHead(cycle.transport, cycle.on_response)
    cycle.transport = held  # type: ignore[assignment]  # what the cycle calls of it: write, close, is_closing
    cycle.on_response = held.completed


class FramedCycle(RequestResponseCycle):
    """uvicorn's cycle for an HTTP/1.0 request or one that asked `Expect: 100-continue` (module
    doc): an unframed answer to HTTP/1.0 is delimited by the close, not chunked; an answer given
    before the body was all in or asked for closes the connection. Switched in by `hold_head`: a
    switched class loses CPython's attribute caches, a cost only these rare requests pay."""

    until_close = False  # the body runs to the close: each write is all uvicorn expects

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            if self.waiting_for_100_continue and self.more_body:  # a body nobody asked for, not all in
                self.keep_alive = False
                self.transport = _Lingering(self.transport)  # type: ignore[assignment]  # write, close, is_closing
            if self.scope["http_version"] == "1.0" and self.scope["method"] != "HEAD":
                named = {name.lower() for name, _ in message.get("headers", ())}
                if message["status"] not in (204, 304) and not named & {b"content-length", b"transfer-encoding"}:
                    self.keep_alive = False
                    self.chunked_encoding = False
                    self.until_close = True
        elif self.until_close and message["type"] == "http.response.body":
            self.expected_content_length = len(message.get("body", b""))
        await super().send(message)


class _Lingering:
    """The transport of an answer given before its expected body was asked for (`FramedCycle`):
    uvicorn's close at its end only stops the writing (a `FIN`). The client sends that body anyway
    once its wait for `100 Continue` is over (curl after 1 s, .NET after 350 ms), and a close met
    it with a reset that discarded the answer the client had not read yet. The body is read and
    dropped until it ends or `DRAIN_S` (`app.edge.connection`) closes the connection."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        self._transport.write(data)

    def is_closing(self) -> bool:
        closing: bool = self._transport.is_closing()
        return closing

    def close(self) -> None:
        transport = self._transport
        if transport.is_closing():
            return
        if transport.can_write_eof():
            transport.write_eof()
        else:  # TLS: no half-close
            transport.close()


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
        try:
            self.transport.write(data)
        except RuntimeError:
            # uvloop's transport once closed (uvicorn closes at a client's half-close) until
            # `connection_lost` tells the cycle: the client is gone, its disconnect follows.
            if not self.transport.is_closing():
                raise

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


def write_head(send: Callable[..., Any], status: int, headers: Sequence[Sequence[bytes]], made: bytes = b"") -> bool:
    """Start the response of `send` (an ASGI `send`) with `status` and `headers` as uvicorn's cycle
    would, when it is a uvicorn cycle's and the head a common one (module doc); False when nothing
    was done: send the `http.response.start` message instead, with `made` after `headers`.

    `made`: header lines the gateway formatted itself (`app.pipeline.events.RateHeaders`), which
    pass uvicorn's checks by construction and are none of its special ones — an API key's
    `x-ratelimit-*` (`app.access.rate_headers`: constant lowercase names, values of digits and
    `duration`'s `0-9 . m s`). They are written after `headers` as they are, without the byte
    checks, which cost as much again as a common head's own (bench/RESULTS.md); `tests/access`
    checks every value the gate can make against uvicorn's patterns."""
    cycle = getattr(send, "__self__", None)
    if type(cycle) is not RequestResponseCycle:
        return False
    if cycle.response_started or cycle.access_log or cycle.disconnected or cycle.flow.write_paused:
        return False
    pairs = [*cycle.default_headers, *headers]
    names: Sequence[bytes] = ()
    values: Sequence[bytes] = ()
    if pairs:
        names, values = zip(*pairs, strict=True)
    joined, texts = b"".join(names), b"".join(values)
    if len(joined.translate(None, _NAME_OFF)) != len(joined) or len(texts.translate(None, _VALUE_OFF)) != len(texts):
        return False  # uvicorn lowers or refuses it
    special = _SPECIAL.intersection(names)
    if special and special != _LENGTH:
        return False
    if special:
        cycle.expected_content_length = int(values[names.index(b"content-length")].decode())
        cycle.chunked_encoding = False
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    lines = [*map(b": ".join, pairs)]
    if made:
        lines.append(made)
    if not cycle.keep_alive:
        lines.append(b"connection: close")
    if cycle.chunked_encoding is None and cycle.scope["method"] != "HEAD" and status not in (204, 304):
        cycle.chunked_encoding = True
        lines.append(b"transfer-encoding: chunked")
    lines.append(b"\r\n")  # the last line's end and the empty line
    cycle.transport.write(STATUS_LINE[status] + b"\r\n".join(lines))
    return True
