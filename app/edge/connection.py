"""Connection guards: uvicorn's httptools protocol with deadlines for the head and the body of a
request and limits on its headers, so a slow or hostile client cannot hold a socket for ever.

uvicorn bounds the idle time between two requests of a keep-alive connection, but nothing else:
a client that connects and sends nothing, sends half a header, or announces a body and never
finishes it holds its connection (and, for the body, the request's task) indefinitely; and the
headers are buffered without limit. `GuardedHttpToolsProtocol` adds, per connection:

- a head deadline (`header_timeout_s`): the request line and headers must be complete within it,
  counted from the connection (for its first request) or from the request's first byte (for the
  next ones). Past it the connection is closed — with a 408 when part of a request had arrived;
- a body deadline (`body_timeout_s`), counted from the end of the headers: the whole body must be
  in by then. Past it the request's application task sees `http.disconnect`, and the client gets
  a 408 (when no response has started) and the close;
- header limits (`max_header_bytes` for the request target and the headers together, `max_headers`
  fields): beyond them a 431 and the close, before any application code runs; and a client that
  asks `Expect: 100-continue` for a `Content-Length` over `max_body_bytes` gets its 413 at once,
  instead of `100 Continue` and then the body it would send for nothing (without `Expect`, the
  app refuses it once the first piece of the body is in: `app.edge.asgi.read_body`). A header line that
  never ends is caught too: every chunk received while the head is unfinished counts, so at most
  one read beyond the limit is ever buffered;
- a write stall bound: a client that takes none of a full buffer for `relay.CLIENT_STALL_S` is
  disconnected (one that stopped reading held its socket and its answer's buffers for ever).

These answers are written here, not by the app (no request has reached it), in the same error
format (`app.errors.error_body`, or Anthropic's under `/v1/messages`) with an `x-request-id`, and
logged with it.

Cost: a timer is armed only when a head or a body is still incomplete after the data received so
far — a request whose head and body arrive in one read, the usual case, arms none (the connection's
first head deadline aside). The headers are counted once they are complete (`len`), and measured
only when the reads that carried them were larger than the limit. Measured: about 1 µs per request
over uvicorn's own protocol. These deadlines and uvicorn's keep-alive timeout run on coarse timers
(`providers.timers`: one loop timer, up to 20 ms late), not a libuv timer each.

Each request's cycle writes to a `HeldHead` (`app.edge.cycle`): its head leaves in one write with
the first body bytes.

`protocol_factory(server_settings)` is what `app.cli` (and the tests' server) pass to uvicorn as
`http=`: a `functools.partial` of the class with the limits, picklable for `--workers N`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable
from typing import Any

import httptools
from msgspec import Struct
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from app.edge import relay
from app.edge.cycle import hold_head
from app.edge.rejection import answered_here, raw_response
from app.edge.unsent import unsent
from app.errors import GatewayError, HeadersTooLarge, InvalidRequest, PayloadTooLarge, RequestTimeout, too_large
from app.ids import uuid7
from app.settings import ServerSettings
from providers.timers import Handle, timers_of

DRAIN_S = 5.0
"""How long the rest of a body already answered is read and dropped before the connection closes."""


class ConnectionLimits(Struct, frozen=True):
    header_timeout_s: float
    body_timeout_s: float
    max_header_bytes: int
    max_headers: int
    max_body_bytes: int
    keep_alive_s: float


# Where the connection is in its current request (ints, not an Enum: read on every callback).
_IDLE = 0  # no byte of the next request yet
_HEAD = 1  # inside a request line and headers
_BODY = 2  # headers done, body not complete


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that has just been answered."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: ConnectionLimits,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits
        self.timeout_keep_alive = limits.keep_alive_s  # type: ignore[assignment]  # uvicorn's is an int
        self._timers = timers_of(self.loop)
        self._phase = _IDLE
        self._deadline: Handle | None = None
        self._chunk = 0  # the size of the data being parsed
        self._head_seen = 0  # the reads that carried part of the head: at least its size
        self._head_bytes = 0  # the reads wholly inside the unfinished head: at most its size
        self._refusal = b""  # an answer waiting for the earlier (pipelined) responses: `_refuse_later`
        self._write_stall: Handle | None = None  # armed while the client takes none of what we write
        self._declined = False  # the request asks an `Upgrade` this server does not make (`_read_again`)

    def pause_writing(self) -> None:
        """The transport's buffer is full: a client that takes none of it for `CLIENT_STALL_S` is
        disconnected (the write stall bound, module doc); a slow one that takes some is not."""
        super().pause_writing()
        if self._write_stall is None and self.transport is not None:
            self._arm_write_stall(unsent(self.transport))

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_stall is not None:
            self._write_stall.cancel()
            self._write_stall = None

    def _arm_write_stall(self, buffered: int) -> None:
        self._write_stall = self._timers.call_later(relay.CLIENT_STALL_S, _call, lambda: self._write_stalled(buffered))

    def _write_stalled(self, buffered: int) -> None:
        """A stall bound after `buffered` bytes were unsent (`unsent`): fewer now, the client took some."""
        self._write_stall = None
        if (transport := self.transport) is not None and not transport.is_closing():
            if (left := unsent(transport)) < buffered:
                self._arm_write_stall(left)
            else:
                transport.abort()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._write_stall is not None:
            self._write_stall.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, but for a request refused from a callback (answered already), and then the
        deadlines: armed only when a head or body is left incomplete."""
        if self._refusal:
            return  # the parser stopped at a refused request: nothing after it is read
        before = self._phase
        self._chunk = len(data)
        if before == _HEAD:
            self._head_seen += len(data)
        self._unset_keepalive_if_required()
        while True:  # once, but for a request read again without its `Upgrade` (`_read_again`)
            try:
                self.parser.feed_data(data)
                break
            except httptools.HttpParserError as exc:
                if not isinstance(exc.__context__, _Refused):  # logged as its `request` line, with its id
                    self.send_400_response("Invalid HTTP request received.")
                return
            except httptools.HttpParserUpgrade as upgrade:
                if not self._declined:
                    if self._should_upgrade():
                        self.handle_websocket_upgrade()
                    return
                data = self._read_again() + data[upgrade.args[0] :]
                self._chunk = len(data)
        phase = self._phase
        if phase == _HEAD:
            if before == _HEAD:
                self._head_bytes += len(data)
                if self._head_bytes > self.limits.max_header_bytes:
                    self._refuse_head(HeadersTooLarge("request headers too large"))
                    return
            if self._deadline is None:
                self._arm(self.limits.header_timeout_s, self._head_timed_out)
        elif phase == _BODY and self._deadline is None:
            self._arm(self.limits.body_timeout_s, self._body_timed_out)

    def on_message_begin(self) -> None:
        self._phase = _HEAD
        self._head_seen = self._chunk
        self._head_bytes = 0
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self._deadline is not None:
            self._disarm()
        limits = self.limits
        if len(self.headers) > limits.max_headers:
            self._refuse_head(HeadersTooLarge(f"more than {limits.max_headers} request headers"))
            raise _Refused
        # Measured only when the reads that carried the head were larger than the limit.
        if self._head_seen > limits.max_header_bytes and self._head_size() > limits.max_header_bytes:
            self._refuse_head(HeadersTooLarge("request headers too large"))
            raise _Refused
        if self.expect_100_continue and declared_length(self.headers) > limits.max_body_bytes:
            self._refuse_head(PayloadTooLarge(too_large(limits.max_body_bytes)))
            raise _Refused
        if self.parser.should_upgrade() and self.parser.get_method() != b"CONNECT":
            if not self._should_upgrade():
                self._declined = True  # read again without its `Upgrade` (`_read_again`)
                return
            super().on_headers_complete()  # a WebSocket's: no cycle, the connection is handed over
            return
        self._phase = _BODY
        super().on_headers_complete()
        hold_head(self.cycle)  # the one uvicorn just made
        self.headers = _TRAILER  # the scope keeps the head's

    def on_message_complete(self) -> None:
        if self._deadline is not None:
            self._disarm()
        self._phase = _IDLE
        if self._declined:
            return
        super().on_message_complete()
        cycle = self.cycle
        if cycle is not None and cycle.response_complete and not cycle.keep_alive:  # lingering close (`_Lingering`)
            self.transport.close()  # the body read after its answer; nothing after it is read
            raise _Refused

    def _read_again(self) -> bytes:
        """The head of a request whose `Upgrade` (not a WebSocket's: `curl --http2`'s `h2c`, on every
        plain-HTTP request) is declined, without it, for a new parser to read again as HTTP/1.1 (RFC
        9110 7.8: a server may ignore the header). httptools takes any `Upgrade` as accepted and
        skips the body: the application got none (a 400 `not valid JSON`), and the connection read
        nothing after it."""
        self._declined = False
        method, version = self.parser.get_method(), self.parser.get_http_version().encode()
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn's
        lines = [b"%s %s HTTP/%s" % (method, self.url, version)]
        for name, value in self.headers:
            if name == b"connection":
                value = b",".join(token for token in value.split(b",") if token.strip().lower() != b"upgrade")
            if name != b"upgrade" and value:
                lines.append(b"%s: %s" % (name, value))
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def _head_size(self) -> int:
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def on_response_complete(self) -> None:
        """uvicorn's, with the keep-alive timeout (armed after every response, cancelled by the
        next request's first bytes) on a coarse timer: a libuv timer made and closed per request
        cost more than the rest of this method. A response sent before its request's body was in
        (`DeclaredTooLarge`, a refusal) leaves the rest of that body to be read and dropped for at
        most `DRAIN_S`, not the body deadline: a client may declare any length (nginx's lingering
        close). A body still coming for a request queued behind this response (pipelined) is that
        request's: its deadline starts again now, as it is next."""
        self.server_state.total_requests += 1
        if self._phase == _BODY:
            self._disarm()
            deadline = self.limits.body_timeout_s
            if self.cycle is not None and self.cycle.response_complete:  # the unread body is the answered one's
                deadline = min(DRAIN_S, deadline)
            self._arm(deadline, self._body_timed_out)
        if self.transport.is_closing():
            return
        if self._refusal and not self.pipeline:
            self.transport.write(self._refusal)
            self.transport.close()
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self.timeout_keep_alive_task = self._timers.call_later(  # type: ignore[assignment]
                self.timeout_keep_alive, HttpToolsProtocol.timeout_keep_alive_handler, self
            )

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._deadline = self._timers.call_later(delay, _call, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head behind a response still being sent: its clock starts after that.
            self._arm(self.limits.header_timeout_s, self._head_timed_out)
        elif self._phase == _HEAD:
            self._refuse_head(RequestTimeout("request headers not received in time"))
        else:
            self.transport.close()

    def _body_timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.cycle is None:
            return
        if self._queued(self.cycle):
            # Its body is not read while an earlier response is being sent: its clock starts after that.
            self._arm(self.limits.body_timeout_s, self._body_timed_out)
        else:
            self._refuse_body(RequestTimeout("request body not received in time"))

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what httptools cannot parse (a CR or a NUL in a header value, a
        broken request line): plain text there, the gateway's JSON error here, as every other."""
        if self._phase == _BODY:  # the head was read: its body's framing (a chunk size) is broken
            self._refuse_body(InvalidRequest("malformed HTTP request: its chunked body breaks HTTP's rules"))
            return
        self._refuse_head(InvalidRequest("malformed HTTP request: a header or the request line breaks HTTP's rules"))

    def _refuse_head(self, error: GatewayError) -> None:
        """Answer `error` and close; after the responses to the earlier (pipelined) requests when
        one is still being sent (`_refuse_later`)."""
        answer = raw_response(error, uuid7(), self.url, self.app)
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(answer)
            self.transport.close()
        else:
            self._refuse_later(answer)

    def _refuse_body(self, error: GatewayError) -> None:
        """Answer `error` to a request whose body cannot be read (too slow, or its chunks broken),
        and close; only close when its response has begun. The application, waiting for that body,
        hears the client gone. A request still queued behind an earlier (pipelined) one is taken
        out of the queue and answered after it (`_refuse_later`)."""
        cycle = self.cycle
        if cycle is None:
            self._refuse_head(error)
            return
        if not cycle.response_started:
            request_id = answered_here(self.scope) or uuid7()  # the app's, if it set one
            answer = raw_response(error, request_id, self.scope.get("raw_path", b""), self.app)
            if self._queued(cycle):
                self.pipeline.popleft()  # the newest: the request whose body broke
                self._refuse_later(answer)
                return
            self.transport.write(answer)
        cycle.disconnected = True  # the application's receive() now says http.disconnect
        cycle.message_event.set()
        self.transport.close()

    def _queued(self, cycle: RequestResponseCycle) -> bool:
        """Whether `cycle` waits in uvicorn's pipeline behind an earlier request's response."""
        return bool(self.pipeline) and self.pipeline[0][0] is cycle

    def _refuse_later(self, answer: bytes) -> None:
        """Keep `answer` until every earlier request's response has been sent (`on_response_complete`
        writes it and closes), reading nothing more: the client pairs responses with its requests in
        order, so an answer written now would be taken for the earlier request's, and a close now would
        lose that answer, whose upstream call was made and billed."""
        self._refusal = answer
        self._disarm()
        self._phase = _IDLE
        self.flow.pause_reading()


class _Trailer(list[tuple[bytes, bytes]]):
    """Where uvicorn puts a chunked body's trailer fields, once the head is read: nowhere. They went
    into the request's headers (`scope["headers"]` is uvicorn's list), a trailer's `authorization`
    choosing the key or its `content-encoding` making a 415 (RFC 9110 6.5.1: a trailer field is not
    merged into the header section); and no header limit counted them."""

    def append(self, field: tuple[bytes, bytes]) -> None:
        pass


_TRAILER = _Trailer()


def _call(callback: Callable[[], None]) -> None:
    callback()


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int:
    """The request's `Content-Length`; 0 without one."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else 0  # a malformed one is httptools' to refuse
    return 0


def connection_limits(server: ServerSettings) -> ConnectionLimits:
    return ConnectionLimits(
        header_timeout_s=server.header_timeout_s,
        body_timeout_s=server.body_timeout_s,
        max_header_bytes=server.max_header_bytes,
        max_headers=server.max_headers,
        max_body_bytes=server.max_body_bytes,
        keep_alive_s=server.keep_alive_s,
    )


def protocol_factory(server: ServerSettings) -> Callable[..., GuardedHttpToolsProtocol]:
    """uvicorn's `http=`: the guarded protocol bound to this server's limits."""
    return functools.partial(GuardedHttpToolsProtocol, limits=connection_limits(server))
