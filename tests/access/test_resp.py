"""The limiter's Redis client (`app.access.resp`) against the real Redis on this machine, and a
loopback server that never answers: replies in order under concurrency, every reply type, the
script loaded on NOSCRIPT, error replies raised, a silent server dropped after the timeout and the
connection opened again on the next call."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from app.access.resp import RespClient, RespError, Script

URL = "redis://127.0.0.1:6379/0"


async def test_concurrent_calls_get_their_own_replies_in_order() -> None:
    client = RespClient(URL)
    key = f"switchyard-test-resp-{uuid.uuid4().hex}"
    try:
        replies = await asyncio.gather(*(client.call("INCR", key) for _ in range(500)))
        assert sorted(replies) == list(range(1, 501))
        assert await client.call("GET", key) == b"500"
        assert await client.call("PING") == b"PONG"
        assert await client.call("GET", key + "-absent") is None
        assert await client.call("HMGET", key + "-absent", "a", "b") == [None, None]
    finally:
        await client.call("DEL", key)
        await client.close()


async def test_a_script_is_loaded_on_noscript_and_returns_nested_replies() -> None:
    client = RespClient(URL)
    script = Script(f"-- {uuid.uuid4().hex}\nreturn {{1, ARGV[1], {{KEYS[1], 2}}, redis.status_reply('OK')}}")
    try:
        for _ in range(2):  # the first call meets NOSCRIPT and loads it; the second runs it by SHA
            assert await client.evalsha(script, ["k"], ["x" * 70_000]) == [1, b"x" * 70_000, [b"k", 2], b"OK"]
        with pytest.raises(RespError, match="ERR"):
            await client.evalsha(Script("return redis.error_reply('ERR nope')"), [], [])
    finally:
        await client.close()


async def test_a_silent_server_is_dropped_after_the_timeout_and_the_next_call_reconnects() -> None:
    connections: list[asyncio.StreamWriter] = []

    async def swallow(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = RespClient(f"redis://127.0.0.1:{port}/0", timeout=0.3)
    try:
        started = time.perf_counter()
        with pytest.raises(RespError, match=r"no answer within 0\.3 s"):
            await asyncio.gather(client.call("PING"), client.call("PING"))
        assert 0.3 <= time.perf_counter() - started < 1.0
        with pytest.raises(RespError):
            await client.call("PING")
        assert len(connections) == 2  # the silent connection was closed, a new one opened
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


async def test_nothing_listening_is_a_resp_error() -> None:
    server = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(RespError, match="cannot connect"):
        await RespClient(f"redis://127.0.0.1:{port}/0").call("PING")
