"""Malformed and unusual upstream answers, as raw bytes from real loopback servers: the mock
(`Reply(raw=...)`, which keeps a raw answer's connection open, so only the adapter can close it)
and, where timing or connection order matters, a bare asyncio server.

Whatever is wrong with an answer's head or body framing, `Provider.events` raises a TRANSIENT
`UpstreamError` (routing fails over), never a bare `ValueError`, and the connection it came on is
closed, not pooled: the server sees it go, and the next request works on a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devtools.mock_http import Reply
from providers import transport
from providers.adapter import Provider, make_client
from providers.config import ProviderConfig, Timeouts
from providers.errors import Failure
from providers.events import Event, Finish, TextDelta, UpstreamMeta, Usage, UsageReport
from tests.providers.test_adapter import HELLO, REQUEST, collect
from tests.support.transcripts import load_transcript
from tests.support.upstream import ReplayUpstream

WHOLE = load_transcript("nonstream_text").chunks[0]
WHOLE_EVENTS: list[Event] = [
    UpstreamMeta("chatcmpl-ns1"),
    TextDelta("Hello there."),
    UsageReport(Usage(input_tokens=10, output_tokens=3)),
    Finish("stop"),
]
JSON = b"content-type: application/json"
CHUNKED = b"transfer-encoding: chunked"


def answer(*lines: bytes, status: bytes = b"HTTP/1.1 200 OK", body: bytes = b'{"id": "x"}') -> bytes:
    return b"\r\n".join([status, *lines, b"", body])


MALFORMED = {
    "content-length-not-digits": answer(JSON, b"content-length: abc"),
    "content-length-negative": answer(JSON, b"content-length: -5"),
    "content-length-overflows": answer(JSON, b"content-length: 99999999999999999999999"),
    "content-length-twice": answer(JSON, b"content-length: 11", b"content-length: 12"),
    "content-length-and-chunked": answer(JSON, b"content-length: 11", CHUNKED),
    "status-line-without-code": answer(JSON, b"content-length: 11", status=b"HTTP/1.1 OK"),
    "status-code-too-long": answer(JSON, b"content-length: 11", status=b"HTTP/1.1 2000 OK"),
    "not-http": answer(JSON, b"content-length: 11", status=b"ICY 200 OK"),
    "http-2-version": answer(JSON, b"content-length: 11", status=b"HTTP/2.0 200 OK"),
    "switching-protocols": answer(b"content-length: 0", status=b"HTTP/1.1 101 Switching Protocols", body=b""),
    "header-without-colon": answer(JSON, b"x-trace abc", b"content-length: 11"),
    "space-before-colon": answer(JSON, b"content-length : 11"),
    "folded-header": answer(JSON, b"x-trace: a", b" b", b"content-length: 11"),
    "head-over-64k": answer(JSON, b"x-pad: " + b"a" * 70_000, b"content-length: 11"),
    "head-never-ends": b"HTTP/1.1 200 OK\r\nx-pad: " + b"a" * 70_000,
    "head-lines-end-in-bare-lf": b'HTTP/1.1 200 OK\ncontent-type: application/json\ncontent-length: 11\n\n{"id": "x"}',
    "content-encoding-not-asked-for": answer(JSON, b"content-encoding: gzip", b"content-length: 11"),
    "chunk-size-not-hex": answer(JSON, CHUNKED, body=b"zz\r\n{}\r\n0\r\n\r\n"),
    "chunk-size-negative": answer(JSON, CHUNKED, body=b"-2\r\n{}\r\n0\r\n\r\n"),
    "chunk-size-with-prefix": answer(JSON, CHUNKED, body=b"0x2\r\n{}\r\n0\r\n\r\n"),
    "chunk-longer-than-its-size": answer(JSON, CHUNKED, body=b"2\r\n{}}\r\n0\r\n\r\n"),
}


@pytest.fixture
async def upstream() -> AsyncIterator[ReplayUpstream]:
    async with ReplayUpstream() as server:
        yield server


@pytest.fixture
async def adapter(upstream: ReplayUpstream) -> AsyncIterator[Provider]:
    client = make_client()
    config = ProviderConfig(name="local", kind="local", base_url=upstream.url, timeouts=Timeouts(first_byte=2.0))
    yield Provider(config, client)
    await client.aclose()


async def closed_by_client(upstream: ReplayUpstream, within: float = 2.0) -> bool:
    """Did the adapter close its connection to `upstream` (the server never does after a raw answer)?"""
    try:
        async with asyncio.timeout(within):
            await upstream.wait_idle()
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("raw", MALFORMED.values(), ids=MALFORMED.keys())
async def test_a_malformed_answer_is_transient_and_closes_its_connection(
    upstream: ReplayUpstream, adapter: Provider, raw: bytes, stream: bool
) -> None:
    upstream.enqueue(Reply(raw=raw))
    events, error = await collect(adapter.events(REQUEST, "m", stream=stream))
    assert events == []
    assert error is not None
    assert (error.kind, error.message) == (Failure.TRANSIENT, "upstream sent a malformed response")
    assert await closed_by_client(upstream)
    upstream.enqueue(Reply(headers=[("content-type", "application/json")], chunks=[WHOLE]))
    assert await collect(adapter.events(REQUEST, "m", stream=False)) == (WHOLE_EVENTS, None)
    assert upstream.open_connections == 1


def split(body: bytes) -> tuple[Any, ...]:
    """(length, bytes) of the body's two halves, for two chunks."""
    half = len(body) // 2
    return len(body[:half]), body[:half], len(body[half:]), body[half:]


def whole(status: bytes = b"HTTP/1.1 200 OK", *lines: bytes) -> bytes:
    return answer(JSON, *lines, b"content-length: %d" % len(WHOLE), status=status, body=WHOLE)


@pytest.mark.parametrize(
    ("raw", "pooled"),
    [
        pytest.param(whole(), True, id="plain"),
        pytest.param(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n" + whole(),
            True,
            id="after-interim-answers",
        ),
        pytest.param(
            answer(JSON, CHUNKED, body=b"%x;ext=1\r\n%s\r\n%x\r\n%s\r\n0\r\nx-checksum: 1\r\n\r\n" % split(WHOLE)),
            True,
            id="chunked-with-extensions-and-trailers",
        ),
        pytest.param(whole(b"HTTP/1.1 200 OK", b"content-encoding: Identity"), True, id="identity-encoding"),
        pytest.param(whole(b"HTTP/1.1 200 OK", b"content-encoding:"), True, id="empty-encoding"),
        pytest.param(whole(b"HTTP/1.0 200 OK"), False, id="http-1.0"),
        pytest.param(whole(b"HTTP/1.1 200 OK", b"connection: close"), False, id="connection-close"),
        pytest.param(whole(b"HTTP/1.0 200 OK", b"connection: keep-alive"), True, id="http-1.0-keep-alive"),
    ],
)
async def test_well_formed_answers_and_whether_their_connection_is_kept(
    upstream: ReplayUpstream, adapter: Provider, raw: bytes, pooled: bool
) -> None:
    upstream.enqueue(Reply(raw=raw))
    assert await collect(adapter.events(REQUEST, "m", stream=False)) == (WHOLE_EVENTS, None)
    assert await closed_by_client(upstream, within=0.3 if pooled else 2.0) is not pooled


async def read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line[15:]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    await reader.readexactly(length)


async def test_a_request_dropped_on_a_reused_connection_is_a_failure_and_never_sent_again() -> None:
    """providers.md: no hidden retries inside the HTTP client. The server reads the second request
    on the kept-alive connection, works on it and resets without answering: that request may
    have been generated and billed, so it fails (the router's loop decides what next) instead of
    going out again on a fresh connection (it used to: the upstream saw the same POST twice)."""
    requests, connections = 0, 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests, connections
        connections += 1
        await read_request(reader)
        requests += 1
        writer.write(whole())
        await read_request(reader)
        requests += 1
        await asyncio.sleep(0.05)  # "generating"
        writer.transport.abort()  # a reset, no answer

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    client = make_client()
    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        adapter = Provider(ProviderConfig(name="local", kind="local", base_url=url), client)
        assert await collect(adapter.events(REQUEST, "m", stream=False)) == (WHOLE_EVENTS, None)
        events, error = await collect(adapter.events(REQUEST, "m", stream=False))
        assert events == []
        assert error is not None
        assert error.kind is Failure.TRANSIENT
        await asyncio.sleep(0.1)
        assert (requests, connections) == (2, 1)
    finally:
        await client.aclose()
        server.close()


async def test_a_connection_idle_past_max_idle_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pooled connection idle for `MAX_IDLE_S` is closed and a fresh one taken: a server's
    keep-alive timeout (uvicorn's 5 s) never closes a connection the pool would reuse."""
    monkeypatch.setattr(transport, "MAX_IDLE_S", 0.2)
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await read_request(reader)
                writer.write(whole())

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    client = make_client()
    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        adapter = Provider(ProviderConfig(name="local", kind="local", base_url=url), client)
        for pause in (0.0, 0.05, 0.3, 0.0):  # reused, reused, too old: a new one, reused
            await asyncio.sleep(pause)
            assert await collect(adapter.events(REQUEST, "m", stream=False)) == (WHOLE_EVENTS, None)
        assert connections == 2
    finally:
        await client.aclose()
        server.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_chunked_answer_trickled_in_small_pieces_is_read_whole(stream: bool) -> None:
    """Size lines, chunk data and the CRLFs between them split across many reads."""
    if stream:
        chunks = load_transcript("vllm_text_stream").chunks
        head, expected = answer(b"content-type: text/event-stream", CHUNKED, body=b""), HELLO
    else:
        chunks, head, expected = [WHOLE[:100], WHOLE[100:]], answer(JSON, CHUNKED, body=b""), WHOLE_EVENTS
    raw = head + b"".join(b"%x;n=1\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\n\r\n"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for start in range(0, len(raw), 3):
            writer.write(raw[start : start + 3])
            await writer.drain()
            await asyncio.sleep(0.0005)
        await reader.read()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    client = make_client()
    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        adapter = Provider(ProviderConfig(name="local", kind="local", base_url=url), client)
        assert await collect(adapter.events(REQUEST, "m", stream=stream)) == (expected, None)
    finally:
        await client.aclose()
        server.close()
