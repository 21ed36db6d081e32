"""What an upstream may send is bounded: a whole answer past `transport.MAX_BODY_BYTES` (declared
or counted while it is read) and a streamed event past `sse.MAX_EVENT_BYTES` without its blank
line are a malformed answer (TRANSIENT, the client's 502), refused as they arrive. Before, a 300 MB
answer was read whole (the gateway at 1 GB), and an event that never ended grew a buffer that
was joined and scanned again at every read until `timeouts.total`: a core at 100 %."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from providers.adapter import PROBE_BODY_MAX, Provider, make_client
from providers.config import ProviderConfig
from providers.errors import Failure, UpstreamError
from providers.sse import MAX_EVENT_BYTES
from providers.transport import MAX_BODY_BYTES
from tests.providers.test_adapter import REQUEST, collect, raw_upstream

BLOCK = 1 << 16


async def _refused(answer: Any, *, stream: bool) -> UpstreamError | None:
    server, url = await raw_upstream(answer)
    client: Any = make_client()
    try:
        adapter = Provider(ProviderConfig(name="local", kind="local", base_url=url), client)
        async with asyncio.timeout(60):
            _, error = await collect(adapter.events(REQUEST, "m", stream=stream))
        return error
    finally:
        server.close()
        await client.aclose()


async def test_a_whole_answer_declared_over_the_bound_is_refused_before_its_body() -> None:
    sent = [0]

    async def declared(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
        writer.write(b"content-length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1))
        while sent[0] < MAX_BODY_BYTES:
            writer.write(b" " * BLOCK)
            sent[0] += BLOCK
            await writer.drain()

    error = await _refused(declared, stream=False)
    assert error is not None
    assert (error.kind, error.message) == (Failure.TRANSIENT, "upstream sent a malformed response")
    assert sent[0] < MAX_BODY_BYTES // 2


async def test_a_chunked_whole_answer_past_the_bound_is_refused_as_it_is_read() -> None:
    """No length declared: counted while read; the bytes past the bound are never buffered."""
    text = b"a" * BLOCK
    sent = [0]

    async def chunked(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        opening = msgspec.json.encode({"id": "x", "choices": [{"index": 0, "message": {"content": ""}}]})[:-6]
        writer.write(b"%x\r\n%s\r\n" % (len(opening), opening))
        while sent[0] < 2 * MAX_BODY_BYTES:
            writer.write(b"%x\r\n%s\r\n" % (len(text), text))
            sent[0] += len(text)
            await writer.drain()

    error = await _refused(chunked, stream=False)
    assert error is not None
    assert (error.kind, error.message) == (Failure.TRANSIENT, "upstream sent a malformed response")
    assert sent[0] < 2 * MAX_BODY_BYTES - BLOCK  # cut off, not read to the end


async def test_a_streamed_event_that_never_ends_is_refused_past_the_bound() -> None:
    sent = [0]

    async def endless(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        writer.write(b'data: {"choices":[{"index":0,"delta":{"content":"')
        while sent[0] < 8 * MAX_EVENT_BYTES:
            writer.write(b"a" * BLOCK)
            sent[0] += BLOCK
            await writer.drain()

    error = await _refused(endless, stream=True)
    assert error is not None
    assert (error.kind, error.message) == (Failure.TRANSIENT, "upstream sent a malformed response")
    assert sent[0] < 2 * MAX_EVENT_BYTES


async def test_a_probe_answer_that_never_ends_is_a_failed_probe_past_the_bound() -> None:
    """A probe's body was read whole, however long (every probe interval); `/models` sent without
    end at loopback speed filled the memory before the probe's 10 s were up."""
    sent = [0]

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b'8\r\n{"data":\r\n')
        try:
            while sent[0] < 4 * PROBE_BODY_MAX:
                writer.write(b"%x\r\n%s\r\n" % (BLOCK, b"[" * BLOCK))
                sent[0] += BLOCK
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client: Any = make_client()
    try:
        config = ProviderConfig(name="fast", kind="fastrun", base_url=f"http://127.0.0.1:{port}/v1", api_key="k")
        adapter = Provider(config, client)
        async with asyncio.timeout(30):
            assert await adapter.probe_report() == ("RemoteProtocolError", None)
        assert sent[0] < 2 * PROBE_BODY_MAX
    finally:
        server.close()
        await client.aclose()
