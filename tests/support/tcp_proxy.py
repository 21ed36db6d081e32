"""A TCP proxy the test controls, for cutting the way to a real database mid-load.

`TcpProxy(target_port)` listens on a loopback port of its own and relays every connection to
`127.0.0.1:target_port`, on an event loop in a thread of its own (so it serves a gateway running
in the test's loop and one in a subprocess alike). `cut()` stops listening and resets every open
connection at once — to the gateway the database is gone, a new connection is refused —
and `restore()` listens on the same port again. Both return when done. `stall()` freezes the
connections open at that moment — they stay open and pass no byte again, a flow a firewall forgot
or a pooler holding a query — while new ones are relayed as before. Use it as a context manager;
`close()` stops the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any

from tests.support.ports import free_port


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.connections = 0  # accepted since the start: a test can see the gateway did connect
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing: set[asyncio.Event] = set()  # one per open connection, cleared by `stall()`
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._thread.start()
        self.restore()

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    def restore(self) -> None:
        """Listen again (a no-op while listening)."""
        self._call(self._listen())

    def cut(self) -> None:
        """Stop listening and reset every relayed connection."""
        self._call(self._cut())

    def stall(self) -> None:
        """Freeze every open connection for good; later connections flow."""
        self._call(self._stall())

    async def _stall(self) -> None:
        for flowing in self._flowing:
            flowing.clear()
        self._flowing.clear()

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port, reuse_address=True)

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            sock = writer.get_extra_info("socket")
            if sock is not None:  # RST, not FIN: what a dead server or a pulled cable looks like
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            writer.transport.abort()
        self._writers.clear()

    async def _cancel_relays(self) -> None:
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.update((client_writer, server_writer))
        flowing = asyncio.Event()
        flowing.set()
        self._flowing.add(flowing)
        await asyncio.gather(
            _pipe(client_reader, server_writer, flowing),
            _pipe(server_reader, client_writer, flowing),
            return_exceptions=True,
        )
        self._flowing.discard(flowing)
        for writer in (client_writer, server_writer):
            self._writers.discard(writer)
            writer.transport.abort()

    def close(self) -> None:
        self.cut()
        self._call(self._cancel_relays())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event) -> None:
    try:
        while data := await reader.read(65536):
            await flowing.wait()  # a stalled connection's bytes go nowhere
            writer.write(data)
            await writer.drain()
    finally:
        writer.transport.abort()
