"""A PostgreSQL pooler in transaction mode, as PgBouncer's `pool_mode = transaction` is, for the tests
of a database behind one (CI has PostgreSQL, not PgBouncer).

`TransactionPooler(database)` listens on a loopback port of its own and answers each client's
start-up itself (no authentication, the server's parameters as the server sent them); the client's
messages go to one of `size` server sessions to `database` on 127.0.0.1:5432, taken at the client's
first message and given back at the server's `ReadyForQuery` outside a transaction, so clients take
turns on the same sessions. What a client leaves in a session (a prepared statement) is there for
the next one, as in PgBouncer. It runs on an event loop in a thread of its own (a gateway in the
test's loop and a CLI subprocess alike reach it), like `tests.support.tcp_proxy`.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from types import TracebackType

from tests.support.ports import free_port

_SSL_REQUEST, _GSS_REQUEST = 80877103, 80877104


class _Session:
    """One server session; `client` is the writer of the client it serves now."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.client: asyncio.StreamWriter | None = None


class TransactionPooler:
    def __init__(self, database: str, size: int = 1) -> None:
        self.database, self.size = database, size
        self.port = free_port()
        self.parameters = b""  # the server's ParameterStatus messages, replayed to every client
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pg-pooler", daemon=True)
        self._thread.start()
        self._idle: asyncio.Queue[_Session] | None = None
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[None]] = set()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    async def _start(self) -> None:
        self._idle = asyncio.Queue()
        for _ in range(self.size):
            self._idle.put_nowait(await self._open())
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _open(self) -> _Session:
        reader, writer = await asyncio.open_connection("127.0.0.1", 5432)
        body = struct.pack("!i", 196608) + b"user\0postgres\0database\0" + self.database.encode() + b"\0\0"
        writer.write(struct.pack("!i", len(body) + 4) + body)
        parameters = b""
        while (message := await _message(reader))[:1] != b"Z":
            if message[:1] == b"E":
                raise RuntimeError(f"the server refused the pooler: {message!r}")
            if message[:1] == b"S":
                parameters += message
        self.parameters = parameters
        session = _Session(reader, writer)
        self._relays.add(asyncio.get_running_loop().create_task(self._relay(session)))
        return session

    async def _relay(self, session: _Session) -> None:
        """The server's messages to the client it serves; at `ReadyForQuery` outside a transaction
        the session goes back to the pool before the client can send its next message."""
        assert self._idle is not None
        try:
            while True:
                message = await _message(session.reader)
                client = session.client
                if message[:1] == b"Z" and message[5:6] == b"I":
                    session.client = None
                    self._idle.put_nowait(session)
                if client is not None:
                    client.write(message)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            session.writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._idle is not None
        session: _Session | None = None
        try:
            while True:  # SSL and GSS encryption refused, then the start-up message
                length, code = struct.unpack("!ii", await reader.readexactly(8))
                await reader.readexactly(length - 8)
                if code not in (_SSL_REQUEST, _GSS_REQUEST):
                    break
                writer.write(b"N")
            ok, key, ready = b"R" + struct.pack("!ii", 8, 0), b"K" + struct.pack("!iii", 12, 1, 1), b"Z\0\0\0\x05I"
            writer.write(ok + self.parameters + key + ready)
            while (message := await _message(reader))[:1] != b"X":
                if session is None or session.client is not writer:
                    session = await self._idle.get()
                    session.client = writer
                session.writer.write(message)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if session is not None and session.client is writer:  # gone inside a transaction: its session too
                session.writer.close()
                self._idle.put_nowait(await self._open())
            writer.close()

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in self._relays:
                task.cancel()
            await asyncio.gather(*self._relays, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> TransactionPooler:
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


async def _message(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(5)
    return head + await reader.readexactly(struct.unpack("!i", head[1:])[0] - 4)
