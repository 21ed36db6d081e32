"""The response head, written with two checks instead of two per header: uvicorn's request cycle
with a shorter way through `http.response.start` for the heads this service sends.

uvicorn's `RequestResponseCycle.send` checks each header's name and value with a regular
expression (CR, LF and other bytes a header may not hold), lowercases each name and compares it
with three special names — about 0.8 µs per header, and a limited key's answer has eleven
(`x-ratelimit-*`). `FastHeadCycle.send` makes the same checks once over all names and once over
all values: each expression matches one forbidden byte, so it finds one in the concatenation
exactly when it would have found one in a header. It writes the same bytes uvicorn would, for the
heads it takes: names already lowercase (ours and Litestar's are), each name once, no
`connection` or `transfer-encoding` of the application's own, no access log. Any other head, and
every other message, goes through uvicorn's own `send` unchanged. tests/gateway/test_response_head.py
compares both byte for byte over many heads.

`GuardedHttpToolsProtocol` (`app.edge.connection`) gives each new cycle this class, once uvicorn
has made it (uvicorn builds the cycle itself, by name, in `on_headers_complete`).
"""

from __future__ import annotations

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle

_TAKEN_BY_UVICORN = (b"connection", b"transfer-encoding")
_CHUNKED = b"transfer-encoding: chunked\r\n"
_NO_BODY = (204, 304)


class FastHeadCycle(RequestResponseCycle):
    """uvicorn's cycle, but for the head written in one pass (module doc)."""

    async def send(self, message: ASGISendEvent) -> None:
        if (
            message["type"] == "http.response.start"
            and not self.response_started
            and not self.disconnected
            and not self.flow.write_paused
            and not self.access_log
        ):
            head = self._head(message["status"], [*self.default_headers, *message.get("headers", ())])
            if head is not None:
                self.response_started = True
                self.waiting_for_100_continue = False
                self.transport.write(head)
                return
        await super().send(message)

    def _head(self, status: int, headers: list[tuple[bytes, bytes]]) -> bytes | None:
        """The head's bytes, as uvicorn would write them; None for a head left to uvicorn."""
        fields = dict(headers)
        if len(fields) != len(headers) or any(name in fields for name in _TAKEN_BY_UVICORN):
            return None
        names = b"".join(fields)
        if names != names.lower() or HEADER_RE.search(names) or HEADER_VALUE_RE.search(b"".join(fields.values())):
            return None  # uvicorn lowercases it, or refuses it with its own error
        length = fields.get(b"content-length")
        lines = [STATUS_LINE[status], *[b"%s: %s\r\n" % (name, value) for name, value in headers]]
        if length is not None and self.chunked_encoding is None:
            self.expected_content_length = int(length.decode())
            self.chunked_encoding = False
        if not self.keep_alive:
            lines.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status not in _NO_BODY:
            self.chunked_encoding = True
            lines.append(_CHUNKED)
        lines.append(b"\r\n")
        return b"".join(lines)
