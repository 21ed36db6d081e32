"""A small pipelined Redis client for the limiter's two calls per request (admission, settlement).

Why not redis-py: its asyncio client spent 190 to 390 µs of CPU per `EVALSHA` here (connection
pool, retry and lock machinery, with or without hiredis; measured with 32 concurrent callers) —
two calls per request halved the gateway's throughput in keys mode (bench/RESULTS.md). This
client keeps one connection, writes each command as one RESP array and resolves replies in order
(Redis answers a connection's commands in the order it received them), so any number of
concurrent requests share the connection without a pool or a lock. Commands issued in one turn of
the event loop leave in one `send`, and one timer per connection (not one per call) enforces the
timeout: the oldest unanswered command older than `timeout` drops the connection.

A command nobody waits for (the limiter's settlements: `post_to`) has a handler instead of a
future; it leaves in the same `send` as the turn's other commands. When to post it is the caller's
choice: the limiter keeps its settlements for the next admission (`app.access.redis_limiter`).

What it speaks: RESP2 replies (simple strings, errors, integers, bulk strings, nested arrays),
`AUTH` and `SELECT` from the URL (`redis://[[user]:password@]host[:port][/db]`; `rediss://` over
TLS), the client's scripts loaded on each new connection, and `EVALSHA` with the script loaded on
`NOSCRIPT` (when that load was refused, or Redis forgot the scripts on a live connection). Every
failure — connect, timeout, a closed connection, an error reply — raises `RespError` (or a
subclass); a timeout or a lost connection also closes the connection, since later replies could
no longer be matched to their commands, and the next call connects again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast
from urllib.parse import unquote, urlsplit

Reply = Any  # bytes | int | None | list[Reply] | RespError
Handler = Callable[[Reply], None]  # told the reply, an error reply, or the failure, as a RespError
Command = tuple[bytes | str | int, ...]


class RespError(Exception):
    """Redis unreachable, too slow, or an error reply."""


class RespLost(RespError):
    """Redis unreachable or too slow: whether it ran the command is unknown (not an error reply)."""


class _Protocol(asyncio.Protocol):
    def __init__(self, timeout: float) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[asyncio.Future[Reply] | Handler] = deque()
        self.sent_at: deque[float] = deque()
        self.buffer = bytearray()
        self.lost: Exception | None = None
        self.outgoing: list[bytes] = []
        self.timeout = timeout
        self.loop = asyncio.get_running_loop()
        self.watchdog: asyncio.TimerHandle | None = None
        self.flush_soon = False
        self.on_lost: Callable[[], None] | None = None

    def send(self, command: bytes) -> asyncio.Future[Reply]:
        """Queue `command` to leave in this turn of the loop; its future gets the reply."""
        future: asyncio.Future[Reply] = self.loop.create_future()
        self.send_to(command, future)
        return future

    def send_to(self, command: bytes, waiter: asyncio.Future[Reply] | Handler) -> None:
        """Queue `command` to leave in this turn of the loop; `waiter` gets the reply."""
        if not self.flush_soon:
            self.flush_soon = True
            self.loop.call_soon(self._flush)
        self.outgoing.append(command)
        self.waiting.append(waiter)
        self.sent_at.append(self.loop.time())
        if self.watchdog is None:
            self.watchdog = self.loop.call_later(self.timeout, self._watch)

    def _flush(self) -> None:
        self.flush_soon = False
        if not self.outgoing:
            return
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.outgoing))
        self.outgoing.clear()

    def _watch(self) -> None:
        self.watchdog = None
        if not self.sent_at:
            return
        late = self.sent_at[0] + self.timeout - self.loop.time()
        if late <= 0:
            self.fail(RespLost(f"no answer within {self.timeout} s"))
            if self.transport is not None:
                self.transport.close()
        else:
            self.watchdog = self.loop.call_later(late, self._watch)

    def fail(self, error: Exception) -> None:
        self.lost = error
        self.sent_at.clear()
        while self.waiting:
            waiter = self.waiting.popleft()
            if not isinstance(waiter, asyncio.Future):
                waiter(error)
            elif not waiter.done():
                waiter.set_exception(error)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is not an asyncio.Transport subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(RespLost(f"connection lost: {exc}" if exc else "connection closed"))
        if self.on_lost is not None:
            self.on_lost()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        position = 0
        while self.waiting:
            parsed = _parse(self.buffer, position)
            if parsed is None:
                break
            reply, position = parsed
            waiter = self.waiting.popleft()
            self.sent_at.popleft()
            if not isinstance(waiter, asyncio.Future):
                waiter(reply)
            elif not waiter.done():
                waiter.set_result(reply)
        del self.buffer[:position]


def _parse(buffer: bytearray, start: int) -> tuple[Reply, int] | None:
    """One reply from `buffer` at `start`, and where the next begins; None when incomplete."""
    end = buffer.find(b"\r\n", start)
    if end < 0:
        return None
    kind, line = buffer[start], bytes(buffer[start + 1 : end])
    after = end + 2
    if kind == 0x3A:  # ':'
        return int(line), after
    if kind == 0x24:  # '$'
        size = int(line)
        if size < 0:
            return None, after
        if len(buffer) < after + size + 2:
            return None
        return bytes(buffer[after : after + size]), after + size + 2
    if kind == 0x2A:  # '*'
        items: list[Reply] = []
        for _ in range(max(0, int(line))):
            parsed = _parse(buffer, after)
            if parsed is None:
                return None
            item, after = parsed
            items.append(item)
        return (items if int(line) >= 0 else None), after
    if kind == 0x2D:  # '-'
        return RespError(line.decode("utf-8", "replace")), after
    return line, after  # '+': a simple string


def encode(args: tuple[bytes | str | int, ...]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class Greeting(Protocol):
    """What a client's owner says on each new connection, before any other command of its:
    `command`'s reply goes to `heard`, which answers commands to send first (each with its
    handler); `lost` hears that a connection is gone (`app.access.restore`)."""

    def command(self) -> bytes: ...

    def heard(self, reply: Reply) -> list[tuple[bytes, Handler]]: ...

    def lost(self) -> None: ...


class RespClient:
    """One pipelined connection to Redis, opened on first use and again after a failure."""

    def __init__(
        self, url: str, timeout: float = 1.0, scripts: Sequence[Script] = (), greeting: Greeting | None = None
    ) -> None:
        """`scripts` are loaded on every new connection, before any command of the client's (unless
        the ACL refuses the load, `_hello`): after a restart (connections drop, Redis forgets its
        scripts) an `EVALSHA` meeting `NOSCRIPT` was sent again once its script was loaded, behind
        the commands posted meanwhile, so the first admission after a restart could run before the
        settlement that came before it. `greeting` follows them (`Greeting`)."""
        self._greeting = greeting
        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 6379
        self._tls = parts.scheme == "rediss"
        self._hello: list[Command] = []
        if parts.password is not None:
            user = unquote(parts.username) if parts.username else None
            password = unquote(parts.password)
            self._hello.append(("AUTH", user, password) if user else ("AUTH", password))
        if parts.path.strip("/") not in ("", "0"):
            self._hello.append(("SELECT", int(parts.path.strip("/"))))
        self._scripts: list[Command] = [("SCRIPT", "LOAD", script.source) for script in scripts]
        self._timeout = timeout
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Task[_Protocol] | None = None
        self._connecting_posts: set[asyncio.Future[Reply]] = set()

    @property
    def connected(self) -> bool:
        """Whether the connection is up, as far as this process knows (no call is made)."""
        protocol = self._protocol
        return protocol is not None and protocol.lost is None

    async def call(self, *args: bytes | str | int) -> Reply:
        reply = await self.post(encode(args))
        if isinstance(reply, RespError):
            raise reply
        return reply

    def post(self, command: bytes) -> asyncio.Future[Reply]:
        """Send an encoded command; its future holds the reply, an error reply as a `RespError`
        value (not raised), and fails with `RespError` when the connection does."""
        protocol = self._protocol
        if protocol is None or protocol.lost is not None:
            return asyncio.ensure_future(self._post_connected(command))
        return protocol.send(command)

    def post_to(self, command: bytes, handler: Handler) -> None:
        """Send an encoded command nobody awaits, in this turn of the loop: `handler` gets its
        reply, or the failure as a `RespError` — no future, no task."""
        protocol = self._protocol
        if protocol is not None and protocol.lost is None:
            protocol.send_to(command, handler)
            return
        task = asyncio.ensure_future(self._post_connected(command))
        self._connecting_posts.add(task)
        task.add_done_callback(lambda done: self._posted(done, handler))

    def flush(self) -> None:
        """Write what waits to leave in this turn of the loop now (a settlement before an answer)."""
        protocol = self._protocol
        if protocol is not None and protocol.flush_soon:
            protocol._flush()

    def _posted(self, done: asyncio.Future[Reply], handler: Handler) -> None:
        self._connecting_posts.discard(done)
        if done.cancelled():
            handler(RespLost("cancelled"))
            return
        error = done.exception()
        if error is None:
            handler(done.result())
        else:
            handler(error if isinstance(error, RespError) else RespError(str(error)))

    async def _post_connected(self, command: bytes) -> Reply:
        return await (await self._connected()).send(command)

    async def evalsha(self, script: Script, command: bytes) -> Reply:
        """`command`, an `EVALSHA` of `script` (`Script.command`), sent again once the script is
        loaded when Redis answers `NOSCRIPT` (the same bytes: the command names the script's SHA)."""
        reply = await self.post(command)
        if isinstance(reply, RespError):
            reply = await self.after_error(script, command, reply)
        return reply

    async def after_error(self, script: Script, command: bytes, error: RespError) -> Reply:
        """What `evalsha` does with an error reply to `command`, for a caller that posted it itself
        (one coroutine fewer on the way to the reply): on `NOSCRIPT` the script is loaded and the
        command sent again; any other error is raised."""
        if str(error).startswith("NOSCRIPT"):
            await self.call("SCRIPT", "LOAD", script.source)
            reply = await self.post(command)
            if not isinstance(reply, RespError):
                return reply
            error = reply
        raise error

    async def _connected(self) -> _Protocol:
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        try:
            return await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        context = ssl.create_default_context() if self._tls else None
        try:
            _transport, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _Protocol(self._timeout), self._host, self._port, ssl=context),
                self._timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise RespLost(f"cannot connect: {type(exc).__name__}: {exc}") from None
        try:
            await _hello(protocol, self._hello, self._scripts)
            if self._greeting is not None:
                for command, handler in self._greeting.heard(await protocol.send(self._greeting.command())):
                    protocol.send_to(command, handler)  # before the commands waiting for this connection
                protocol.on_lost = self._greeting.lost
        except BaseException:  # AUTH or SELECT refused, or lost: never leave that connection to later commands
            self._drop(protocol)
            raise
        self._protocol = protocol  # only now: a command posted meanwhile waits for the connect
        return protocol

    def _drop(self, protocol: _Protocol) -> None:
        if protocol.watchdog is not None:
            protocol.watchdog.cancel()
        if protocol.transport is not None:
            protocol.transport.close()
        if self._protocol is protocol:
            self._protocol = None

    async def drain(self) -> None:
        """Send what waits to be sent and wait for every answer (the watchdog bounds the wait)."""
        protocol = self._protocol
        if protocol is None or not protocol.waiting:
            return
        with contextlib.suppress(RespError):
            await self.call("PING")  # answered after everything sent before it

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()  # a connection still saying AUTH/SELECT is dropped by its task
        if self._protocol is not None:
            self._drop(self._protocol)


async def _hello(protocol: _Protocol, commands: list[Command], scripts: list[Command]) -> None:
    """`AUTH`, `SELECT` and the scripts' `SCRIPT LOAD` on a new connection, queued at once, before
    the client publishes the connection: a command posted meanwhile waits for the connect
    (published during `AUTH`'s round trip, a command ran before `SELECT`, or after a refused one, in
    database 0). On the connection itself, not through `RespClient.call`: reset before them
    (uvloop may report the reset first), `call` waited for a new connection, the one being made
    (its own task), and every later call of the process with it. A `SCRIPT LOAD` the ACL refuses
    (`NOPERM`: an operator who allows `EVALSHA` of scripts loaded beforehand) is not the
    connection's failure: there the script's `EVALSHA` meets `NOSCRIPT` as it did before. Any other
    refusal is (`LOADING`: a Redis reading its data after a restart): the next call connects again."""
    if protocol.lost is not None:
        raise protocol.lost
    replies = await asyncio.gather(
        *(protocol.send(encode(command)) for command in commands + scripts), return_exceptions=True
    )
    for position, reply in enumerate(replies):
        if not isinstance(reply, BaseException):
            continue
        refused = isinstance(reply, RespError) and not isinstance(reply, RespLost)  # an error reply
        if position >= len(commands) and refused and str(reply).startswith("NOPERM"):
            continue  # a load the ACL refuses: the operator loads the scripts (`-LOADING` is a failure: later)
        raise reply  # an error reply (`RespError`), or the connection's failure


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


class Script:
    """A Lua script and its SHA-1, as `EVALSHA` names it; its commands are encoded here, with the
    fixed head (`EVALSHA <sha> <number of keys>`) made once per argument count."""

    def __init__(self, source: str, keys: int) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        self.key_count = keys
        self._heads: dict[int, bytes] = {}

    @staticmethod
    def keys(*names: str) -> bytes:
        """The keys' part of a command, made once per set of keys by the caller."""
        return b"".join(bulk(name.encode()) for name in names)

    def head(self, count: int) -> bytes:
        """`EVALSHA <sha> <number of keys>` as the start of a command with `count` arguments
        (the keys' part, `keys`, follows it, then the arguments)."""
        head = self._heads.get(count)
        if head is None:
            total = 3 + self.key_count + count
            head = self._heads[count] = b"*%d\r\n" % total + encode(("EVALSHA", self.sha, self.key_count))[4:]
        return head

    def command(self, keys: bytes, args: tuple[bytes, ...]) -> bytes:
        """The whole command: `keys` (from `Script.keys`), then `args`."""
        return b"".join((self.head(len(args)), keys, *[bulk(arg) for arg in args]))
