"""How the front door frames legitimate requests it is not usually sent, on raw sockets: an
HTTP/1.0 client's streamed answer and its `Expect`, an `Expect: 100-continue` request answered
before its body was asked for, an `Upgrade: h2c` offer (`curl --http2`), a chunked body's trailer
fields. Each checks the exact bytes on the wire against RFC 9110/9112.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from tests.access.conftest import ADMIN, bearer, keyed_gateway
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.replies import answer, stream_answer
from tests.support.upstream import ReplayUpstream

WAIT_S = 3.0
TEXT = {"role": "user", "content": "hi"}
DOORS = {
    "/api/v1/completions": {
        "stream": True,
        "messages": [{"role": "user", "content": [{"kind": "text", "data": "hi"}]}],
    },
    "/v1/chat/completions": {"model": "chat-1", "stream": True, "messages": [TEXT]},
    "/v1/messages": {"model": "chat-1", "stream": True, "max_tokens": 16, "messages": [TEXT]},
}
# Each door's stream for the upstream's `stream_answer("ok")`: (event, type) per frame, in order.
FRAMES = {
    "/api/v1/completions": [
        ("stream_event", "stream_start"),
        ("stream_event", "text_start"),
        ("stream_event", "text_delta"),
        ("stream_event", "text_end"),
        ("stream_event", "finish"),
    ],
    "/v1/chat/completions": [(None, "chat.completion.chunk")] * 3 + [(None, "[DONE]")],
    "/v1/messages": [
        ("message_start", "message_start"),
        ("content_block_start", "content_block_start"),
        ("content_block_delta", "content_block_delta"),
        ("content_block_stop", "content_block_stop"),
        ("message_delta", "message_delta"),
        ("message_stop", "message_stop"),
    ],
}
GET = b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n"


async def until_close(gw: GatewayHandle, request: bytes) -> bytes:
    """Send `request` and read until the server closes (`WAIT_S` at most: then what came, and `<open>`)."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        data = b""
        while chunk := await asyncio.wait_for(reader.read(65536), WAIT_S):
            data += chunk
        return data
    except TimeoutError:
        return data + b"<open>"
    finally:
        writer.close()


def split(data: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    return status, dict(line.split(b": ", 1) for line in lines), body


def frames(body: bytes) -> list[tuple[str | None, str]]:
    """Each SSE frame's event name and its data's `type` (or `object`, or `[DONE]`); a frame that is
    not exactly `event:`/`data:` lines (a chunk size among them) fails here."""
    assert body.endswith(b"\n\n"), body[-80:]
    seen = []
    for block in body.decode().split("\n\n")[:-1]:
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        assert set(fields) - {"event"} == {"data"}, block
        data = fields["data"]
        if data != "[DONE]":
            document = msgspec.json.decode(data)
            data = document.get("type") or document["object"]
        seen.append((fields.get("event"), data))
    return seen


@pytest.mark.parametrize("path", list(DOORS))
async def test_an_http_1_0_client_gets_its_stream_delimited_by_the_close_not_chunked(
    gw: GatewayHandle, primary: ReplayUpstream, path: str
) -> None:
    """RFC 9112 6.1: no `Transfer-Encoding` in an answer to HTTP/1.0, which has no chunked coding:
    `curl --http1.0`, ApacheBench, a proxy speaking 1.0 upstream read the hex chunk sizes and CRLFs
    as part of the stream (`85\\r\\nevent: stream_event…`). uvicorn chunked it regardless."""
    primary.enqueue(stream_answer("ok"))
    payload = msgspec.json.encode(DOORS[path])
    request = b"POST %s HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (
        path.encode(),
        len(payload),
    )
    status, headers, body = split(await until_close(gw, request + payload))
    assert status == b"HTTP/1.1 200 OK"
    assert b"transfer-encoding" not in headers
    assert (headers[b"content-type"], headers[b"connection"]) == (b"text/event-stream; charset=utf-8", b"close")
    assert frames(body) == FRAMES[path]
    [row] = await gw.ledger_rows()
    assert (row["status"], row["streamed"], row["output_tokens"]) == ("ok", 1, 1)


async def test_an_http_1_0_client_still_gets_a_json_answer_with_its_length(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    primary.enqueue(answer("ok"))
    payload = msgspec.json.encode({**DOORS["/v1/chat/completions"], "stream": False})
    request = b"POST /v1/chat/completions HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    status, headers, body = split(await until_close(gw, request % len(payload) + payload))
    assert (status, headers[b"connection"], int(headers[b"content-length"])) == (
        b"HTTP/1.1 200 OK",
        b"close",
        len(body),
    )
    assert msgspec.json.decode(body)["choices"][0]["message"]["content"] == "ok"


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST /api/v1/nothing-here HTTP/1.1\r\n", b"HTTP/1.1 404 Not Found"),
        (b"PUT /v1/chat/completions HTTP/1.1\r\n", b"HTTP/1.1 405 Method Not Allowed"),
    ],
    ids=["404", "405"],
)
async def test_an_answer_before_an_expected_body_was_asked_for_closes_the_connection(
    gw: GatewayHandle, head: bytes, status: bytes
) -> None:
    """curl sends `Expect: 100-continue` for a large body and, given a final answer instead of
    `100 Continue`, never sends it. The answer kept the connection alive with its parser waiting
    for those 2,000 bytes: the client's next request on it was read as that body and never
    answered (until the body deadline closed it, 60 s later). RFC 9110 10.1.1: a server that
    answers before reading the content says whether it will close or read it; it now closes."""
    expect = (
        head + b"host: gw\r\ncontent-type: application/json\r\nexpect: 100-continue\r\ncontent-length: 2000\r\n\r\n"
    )
    data = await until_close(gw, expect + GET)
    first, headers, body = split(data)
    assert first == status
    assert headers[b"connection"] == b"close"
    assert body.endswith(b"}")  # then the close: no `<open>`
    assert len(body) == int(headers[b"content-length"])


async def test_a_body_asked_for_with_100_continue_keeps_the_connection(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    primary.enqueue(answer("ok"))
    payload = msgspec.json.encode({**DOORS["/v1/chat/completions"], "stream": False})
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nexpect: 100-continue\r\ncontent-length: %d\r\n\r\n"
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head % len(payload))
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(payload + GET.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n"))
        data = await asyncio.wait_for(reader.read(), WAIT_S)
    finally:
        writer.close()
    first, headers, rest = split(data)
    assert (first, b"connection" in headers) == (b"HTTP/1.1 200 OK", False)
    length = int(headers[b"content-length"])
    assert split(rest[length:])[0] == b"HTTP/1.1 200 OK"  # the next request on the same connection


async def test_an_http_1_0_client_that_sends_expect_gets_no_100_continue(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """RFC 9110 10.1.1 and 15.2: a 100-continue expectation in an HTTP/1.0 request is ignored, and
    no 1xx answer goes to an HTTP/1.0 client, which takes `HTTP/1.1 100 Continue` for its answer."""
    primary.enqueue(answer("ok"))
    payload = msgspec.json.encode({**DOORS["/v1/chat/completions"], "stream": False})
    request = b"POST /v1/chat/completions HTTP/1.0\r\nexpect: 100-continue\r\ncontent-length: %d\r\n\r\n"
    status, _, body = split(await until_close(gw, request % len(payload) + payload))
    assert status == b"HTTP/1.1 200 OK"
    assert msgspec.json.decode(body)["choices"][0]["message"]["content"] == "ok"


H2C = b"connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
CLOSE_GET = b"GET /healthz HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n"


@pytest.mark.parametrize("path", list(DOORS))
async def test_a_declined_h2c_upgrade_is_read_as_http_1_1_body_and_all(
    gw: GatewayHandle, primary: ReplayUpstream, path: str
) -> None:
    """`curl --http2 http://…` offers `Upgrade: h2c` with every request. A server that does not
    upgrade goes on in HTTP/1.1 (RFC 9110 7.8); httptools took the offer as accepted and skipped the
    body: every POST was a 400 `request body is not valid JSON`, and the connection answered
    nothing after it."""
    primary.enqueue(answer("ok"))
    payload = msgspec.json.encode({**DOORS[path], "stream": False})
    head = b"POST %s HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n\r\n"
    data = await until_close(gw, head % (path.encode(), H2C, len(payload)) + payload + CLOSE_GET)
    status, headers, rest = split(data)
    assert (status, b"connection" in headers) == (b"HTTP/1.1 200 OK", False)
    length = int(headers[b"content-length"])
    assert msgspec.json.decode(rest[:length])["model"] == "chat-1"
    assert split(rest[length:])[::2] == (b"HTTP/1.1 200 OK", b'{"status":"ok"}')  # the next request, answered
    assert len(primary.requests) == 1


async def test_a_trailer_field_is_not_taken_for_a_header(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    """RFC 9110 6.5.1: trailer fields are not merged into the header section. uvicorn appended
    them to the request's headers, read after they came: a trailer `content-encoding: gzip` (a
    checksum's coding, say) made this plain JSON body a 415."""
    primary.enqueue(answer("ok"))
    payload = msgspec.json.encode(DOORS["/api/v1/completions"] | {"stream": False})
    head = b"POST /api/v1/completions HTTP/1.1\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n"
    chunked = b"connection: close\r\n\r\n%x;name=value\r\n%s\r\n0\r\ncontent-encoding: gzip\r\n\r\n"
    status, _, body = split(await until_close(gw, head + chunked % (len(payload), payload)))
    assert status == b"HTTP/1.1 200 OK"
    assert msgspec.json.decode(body)["message"]["content"] == [{"kind": "text", "data": "ok"}]


async def test_a_key_in_a_trailer_does_not_authenticate(
    start_gateway: StartGateway, primary: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys mode: the key is read from the request's headers, and a trailer `authorization` was one
    of them — the last one read wins, so a trailer also replaced the head's key (the request billed
    to, and limited by, another key than the one a proxy in front checked)."""
    gw = await keyed_gateway(start_gateway, primary, monkeypatch)
    made = await gw.client.post("/api/v1/keys", json={"name": "k"}, headers=bearer(ADMIN))
    secret = made.json()["secret"].encode()
    payload = msgspec.json.encode({"model": "chat", "messages": [TEXT]})
    head = b"POST /v1/chat/completions HTTP/1.1\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n"
    chunked = b"connection: close\r\n\r\n%x\r\n%s\r\n0\r\nauthorization: Bearer %s\r\n\r\n"
    status, _, body = split(await until_close(gw, head + chunked % (len(payload), payload, secret)))
    assert status == b"HTTP/1.1 401 Unauthorized"
    assert msgspec.json.decode(body)["error"]["type"] == "authentication_error"
    assert primary.requests == []
