"""rev3 review: a WebSocket `Upgrade` (the gateway serves none) is refused with a `403` and the
close, first on a connection or after a kept-alive request. After the trailer sink became the
protocol's header list (`_Trailer`), uvicorn's upgrade check read that sink instead of the head:
a WebSocket request after another on the connection got no answer at all (until the body
deadline), and the first on a connection was a 400 saying its chunked body broke HTTP's rules."""

from __future__ import annotations

import pytest

from tests.gateway.test_http_framing import GET, split, until_close
from tests.support.gateway import GatewayHandle

WEBSOCKET = (
    b"GET /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nconnection: Upgrade\r\nupgrade: websocket\r\n"
    b"sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
)


@pytest.mark.parametrize("before", [b"", GET], ids=["first", "after-a-request"])
async def test_a_websocket_upgrade_is_refused_and_closed(gw: GatewayHandle, before: bytes) -> None:
    data = await until_close(gw, before + WEBSOCKET)
    assert not data.endswith(b"<open>"), data
    if before:
        first, headers, rest = split(data)
        assert first == b"HTTP/1.1 200 OK"
        data = rest[int(headers[b"content-length"]) :]
    status, headers, body = split(data)
    assert (status, headers[b"Connection"], body) == (b"HTTP/1.1 403 Forbidden", b"close", b"")
