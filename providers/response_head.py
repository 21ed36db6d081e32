"""An upstream response's head, checked by `httptools` (llhttp, the C parser of uvicorn and Node.js),
and how its body is framed: the plain-HTTP transport's reader of status lines and headers
(`providers.transport`, whose module doc says what is checked and why)."""

from __future__ import annotations

import httptools
import httpx

_VERSIONS = (b"HTTP/1.1 ", b"HTTP/1.0 ")
_IDENTITY = (b"identity", b"")  # the codings the adapter takes (an empty one, as `app.edge.guards` does)


class ResponseHead:
    """A response head checked by llhttp, and how its body is framed; also the parser's callback object
    (`on_header`: no helper allocated), the callbacks it does not want None (httptools looks each up)."""

    __slots__ = ("chunked", "headers", "keep_alive", "length", "status")
    on_message_begin = on_headers_complete = on_body = on_message_complete = None
    on_chunk_header = on_chunk_complete = None

    def __init__(self, data: bytearray) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        parser = httptools.HttpResponseParser(self)
        try:
            parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            raise httpx.RemoteProtocolError(f"malformed upstream response head: {exc}") from exc
        self.status = parser.get_status_code()
        if not data.startswith(_VERSIONS) or self.status == 101:
            raise httpx.RemoteProtocolError("malformed upstream response head: unexpected version or status")
        self.keep_alive = parser.should_keep_alive()
        self.length: int | None = None
        self.chunked = False
        for name, value in self.headers:  # llhttp has checked both, and that only one is here
            if len(name) == 14 and name.lower() == b"content-length":
                self.length = int(value)
            elif len(name) == 17 and name.lower() == b"transfer-encoding":
                self.chunked = value.rpartition(b",")[2].strip().lower() == b"chunked"
            elif len(name) == 16 and name.lower() == b"content-encoding" and value.strip().lower() not in _IDENTITY:
                raise httpx.RemoteProtocolError(f"malformed upstream response: content-encoding {value!r} unasked")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
