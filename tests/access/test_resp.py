"""The limiter's Redis client (`app.access.resp`) against the real Redis on this machine, and a
loopback server that never answers: replies in order under concurrency, every reply type, the
script loaded on NOSCRIPT, error replies raised, a silent server dropped after the timeout and the
connection opened again on the next call."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from app.access.resp import RespClient, RespError, Script, bulk, encode
from tests.access.conftest import PrivateRedis

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
    script = Script(f"-- {uuid.uuid4().hex}\nreturn {{1, ARGV[1], {{KEYS[1], 2}}, redis.status_reply('OK')}}", 1)
    try:
        for _ in range(2):  # the first call meets NOSCRIPT and loads it; the second runs it by SHA
            reply = await client.evalsha(script, script.command(Script.keys("k"), (b"x" * 70_000,)))
            assert reply == [1, b"x" * 70_000, [b"k", 2], b"OK"]
        failing = Script("return redis.error_reply('ERR nope')", 0)
        with pytest.raises(RespError, match="ERR"):
            await client.evalsha(failing, failing.command(b"", ()))
    finally:
        await client.close()


async def test_the_clients_scripts_are_loaded_by_each_connection_before_its_first_command(
    private_redis: PrivateRedis,
) -> None:
    """After a restart (Redis forgets its scripts and drops the connection) a script's first
    `EVALSHA` runs at once, in its order among the commands posted: on `NOSCRIPT` it went again
    once loaded, behind them (an admission ran before the settlement posted first). A private
    Redis: `SCRIPT FLUSH` is server-wide."""
    script = Script(f"-- {uuid.uuid4().hex}\nreturn ARGV[1]", 0)
    client = RespClient(private_redis.url, scripts=[script])
    other = RespClient(private_redis.url)
    try:
        for _ in range(2):
            assert await client.post(script.command(b"", (b"first",))) == b"first"  # no NOSCRIPT, no retry
            own_id = await client.call("CLIENT", "ID")
            await other.call("SCRIPT", "FLUSH")  # as a restart: the scripts and the connection gone
            await other.call("CLIENT", "KILL", "ID", own_id)
            await _until_lost(client)
    finally:
        await client.close()
        await other.close()


async def test_a_refused_script_load_leaves_the_connection_to_the_scripts_loaded_before(
    private_redis: PrivateRedis,
) -> None:
    """An ACL may allow `EVALSHA` of scripts an operator loaded, and not `SCRIPT LOAD`: the load on
    connecting is refused, and the connection serves all the same (it failed every command)."""
    script = Script(f"-- {uuid.uuid4().hex}\nreturn ARGV[1]", 0)
    admin = RespClient(private_redis.url)
    try:
        await admin.call("SCRIPT", "LOAD", script.source)
        await admin.call("ACL", "SETUSER", "limiter", "on", ">pw", "~*", "&*", "+@all", "-script|load")
    finally:
        await admin.close()
    client = RespClient(f"redis://limiter:pw@127.0.0.1:{private_redis.port}/0", scripts=[script])
    try:
        assert await client.post(script.command(b"", (b"ok",))) == b"ok"
        with pytest.raises(RespError, match="NOPERM"):
            await client.call("SCRIPT", "LOAD", "return 1")
    finally:
        await client.close()


async def _until_lost(client: RespClient) -> None:
    for _ in range(100):
        if not client.connected:
            return
        await asyncio.sleep(0.01)
    pytest.fail("the killed connection was not seen lost")


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


def test_a_script_command_is_the_generic_encoding_of_evalsha() -> None:
    script = Script("return 1", 3)
    keys = Script.keys("a", "{k}:b", "c" * 300)
    for args in [(), (b"1",), (b"", b"22", b"x" * 1000)]:
        expected = encode(("EVALSHA", script.sha, 3, "a", "{k}:b", "c" * 300, *args))
        assert script.command(keys, args) == expected
    tail = b"".join(bulk(value) for value in (b"x", b"7", b"-1"))  # arguments encoded apart, as the limiter does
    assert script.head(3) + keys + tail == encode(("EVALSHA", script.sha, 3, "a", "{k}:b", "c" * 300, "x", "7", "-1"))


class _Recorder:
    """A loopback server that answers `+OK` per command and keeps each read it made, with its time."""

    def __init__(self) -> None:
        self.reads: list[tuple[float, bytes]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            self.reads.append((time.perf_counter(), data))
            writer.write(b"+OK\r\n" * data.count(b"*1\r\n"))
            await writer.drain()


async def test_a_command_nobody_awaits_leaves_in_the_same_write_as_the_turns_others() -> None:
    recorder = _Recorder()
    server = await asyncio.start_server(recorder.serve, "127.0.0.1", 0)
    client = RespClient(f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0")
    try:
        assert await client.call("PING") == b"OK"  # connected
        replies: list[object] = []
        client.post_to(encode(("FIRST",)), replies.append)
        assert await client.call("EAGER") == b"OK"
        assert replies == [b"OK"]  # answered before the command sent after it
        assert recorder.reads[1][1] == encode(("FIRST",)) + encode(("EAGER",))  # one write for both

        client.post_to(encode(("ALONE",)), replies.append)
        for _ in range(20):
            if len(replies) == 2:
                break
            await asyncio.sleep(0.01)
        assert replies == [b"OK", b"OK"]  # sent without anyone awaiting a command after it
        assert recorder.reads[2][1] == encode(("ALONE",))
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


async def test_drain_waits_for_the_answers_of_commands_nobody_awaits() -> None:
    client = RespClient(URL)
    key = f"switchyard-test-resp-{uuid.uuid4().hex}"
    try:
        await client.call("PING")
        replies: list[object] = []
        for _ in range(3):
            client.post_to(encode(("INCR", key)), replies.append)
        await client.drain()
        assert replies == [1, 2, 3]
        assert await client.call("GET", key) == b"3"
    finally:
        await client.call("DEL", key)
        await client.close()


async def test_a_refused_select_drops_its_connection_and_the_next_call_connects_again() -> None:
    """A `SELECT` (or `AUTH`) that errs once used to leave its connection to later commands: they
    ran on database 0 (another process's counters) or met `NOAUTH` until a restart."""
    seen: list[list[bytes]] = []
    server = await asyncio.start_server(_answering(seen, _refusing_select_once()), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = RespClient(f"redis://127.0.0.1:{port}/3", timeout=1.0)
    try:
        with pytest.raises(RespError, match="out of range"):
            await client.call("PING")
        assert await client.call("PING") == b"OK"
        assert seen == [[b"SELECT", b"3"], [b"SELECT", b"3"], [b"PING"]]  # never a PING without its SELECT
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


async def test_a_script_load_refused_while_redis_loads_is_the_connections_failure() -> None:
    """`-LOADING` (a restarted Redis reading its data): the connection is not published without
    its scripts (their first `EVALSHA` would go again behind later commands); the next call
    connects again and loads them."""
    seen: list[list[bytes]] = []
    loading = [True]

    async def reply(parts: list[bytes]) -> bytes:
        if parts[0] == b"SCRIPT" and loading[0]:
            loading[0] = False
            return b"-LOADING Redis is loading the dataset in memory\r\n"
        return b"+OK\r\n"

    server = await asyncio.start_server(_answering(seen, reply), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = RespClient(f"redis://127.0.0.1:{port}/0", timeout=1.0, scripts=[Script("return 1", 0)])
    try:
        with pytest.raises(RespError, match="LOADING"):
            await client.call("PING")
        assert await client.call("PING") == b"OK"
        assert [parts[0] for parts in seen] == [b"SCRIPT", b"SCRIPT", b"PING"]  # never a PING without its scripts
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


def _answering(
    seen: list[list[bytes]], reply: Callable[[list[bytes]], Awaitable[bytes]]
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A fake Redis: each command read is kept in `seen` and answered with what `reply` says."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            parts = [await _bulk(reader) for _ in range(int(line[1:]))]
            seen.append(parts)
            writer.write(await reply(parts))
            await writer.drain()

    return serve


def _refusing_select_once(auth_round_trip: float = 0.0) -> Callable[[list[bytes]], Awaitable[bytes]]:
    """A fake Redis's answers: `+OK`, but an error to the first `SELECT`; `AUTH` after a round trip."""
    refuse = [True]

    async def reply(parts: list[bytes]) -> bytes:
        if parts[0] == b"AUTH":
            await asyncio.sleep(auth_round_trip)
        if parts[0] == b"SELECT" and refuse[0]:
            refuse[0] = False
            return b"-ERR DB index is out of range\r\n"
        return b"+OK\r\n"

    return reply


async def _bulk(reader: asyncio.StreamReader) -> bytes:
    size = int((await reader.readline())[1:])
    return (await reader.readexactly(size + 2))[:-2]


def test_a_connection_closed_before_its_select_is_a_resp_error_and_the_client_recovers() -> None:
    """A peer that accepts and resets at once (a proxy in front of a Redis that is gone, Redis at
    `maxclients`): on uvloop (the gateway's loop) the reset is seen before the connection's
    `SELECT` is posted, which then waited for the connection being made: its own task. Every later
    call of the process hung with it, Redis back or not."""
    uvloop.run(_closed_before_select())


async def _closed_before_select() -> None:
    closing = [3]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if closing[0]:
            closing[0] -= 1
            writer.transport.abort()  # a reset, before anything is read
            return
        while line := await reader.readline():
            [await _bulk(reader) for _ in range(int(line[1:]))]
            writer.write(b"+OK\r\n")
            await writer.drain()

    loop = asyncio.get_running_loop()
    connect = loop.create_connection

    async def slow_to_resume(*args: Any, **kwargs: Any) -> Any:  # as a busy loop is: the reset comes first
        made = await connect(*args, **kwargs)
        await asyncio.sleep(0.05)
        return made

    loop.create_connection = slow_to_resume  # type: ignore[method-assign]
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = RespClient(f"redis://127.0.0.1:{port}/3", timeout=1.0)
    try:
        async with asyncio.timeout(5):
            for _ in range(3):
                with pytest.raises(RespError):
                    await client.call("PING")
            assert await client.call("PING") == b"OK"
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


async def test_a_command_posted_during_auth_runs_after_select() -> None:
    """AUTH and SELECT went one after the other: a command posted during AUTH's round trip left
    before SELECT and ran in database 0 (another deployment's counters)."""
    seen: list[list[bytes]] = []

    async def reply(parts: list[bytes]) -> bytes:
        if parts[0] == b"AUTH":
            await asyncio.sleep(0.05)  # a round trip
        return b"+OK\r\n"

    server = await asyncio.start_server(_answering(seen, reply), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = RespClient(f"redis://:secret@127.0.0.1:{port}/3", timeout=1.0)
    try:
        first = asyncio.ensure_future(client.call("GET", "first"))
        await asyncio.sleep(0.02)  # connected, AUTH on its way
        assert await asyncio.gather(first, client.call("GET", "second")) == [b"OK", b"OK"]
        assert [parts[0] for parts in seen[:2]] == [b"AUTH", b"SELECT"]
        assert sorted(parts[1] for parts in seen[2:]) == [b"first", b"second"]
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


async def test_a_command_posted_while_select_is_refused_never_runs_on_that_connection() -> None:
    """A command posted during the connect went on the connection before its `SELECT` was
    answered; refused, Redis ran it in database 0 and the caller got its reply as a success."""
    seen: list[list[bytes]] = []
    server = await asyncio.start_server(_answering(seen, _refusing_select_once(0.05)), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = RespClient(f"redis://:secret@127.0.0.1:{port}/3", timeout=1.0)
    try:
        first = asyncio.ensure_future(client.call("PING"))
        await asyncio.sleep(0.02)  # connected, AUTH on its way
        second = asyncio.ensure_future(client.call("INCR", "counter"))
        results = await asyncio.gather(first, second, return_exceptions=True)
        assert [type(result) for result in results] == [RespError, RespError]
        assert [parts[0] for parts in seen] == [b"AUTH", b"SELECT"]  # nothing ran in database 0
        assert await client.call("INCR", "counter") == b"OK"  # the next call connects again
        assert [parts[0] for parts in seen[2:]] == [b"AUTH", b"SELECT", b"INCR"]
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
