"""Dialing an upstream: its host's addresses, kept a while, and a staggered race of TCP connects.

Addresses. A host's addresses come from the system resolver (`getaddrinfo`, in a thread) and are
kept `ADDRESS_TTL_S` (10 s, aiohttp's default, which the https path had before `providers.transport`
replaced it). A burst of new connections to a hosted provider then makes one lookup, not one each,
and lookups of one host that overlap share the first. `getaddrinfo` gives no TTL: for up to 10 s a
host that moved is dialled at its old addresses, and a connect that fails there fails the attempt
as any connect error does (providers.md). A failed lookup is not kept. An IP literal (the usual
local server) is never looked up.

Connecting, RFC 8305's "happy eyeballs" (asyncio has it, uvloop does not): TCP connects to the
addresses in the resolver's order with IPv6 and IPv4 alternating; the first starts at once, each
next one `STAGGER_S` later or as soon as one before it fails; the first socket connected wins and
the others are cancelled, or closed if they connect after it. So a host whose first address drops
packets costs a quarter of a second, not the whole `connect` timeout. Only the TCP connects race:
TLS is made once, on the winner (`providers.transport`), since a handshake longer than the stagger
(an upstream more than about 125 ms away) made every new connection open a second one.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

ADDRESS_TTL_S = 10.0  # how long a host's looked-up addresses are used (module doc)
STAGGER_S = 0.25  # RFC 8305's connection attempt delay

Lookup = Callable[[str, int], Awaitable[list[tuple[Any, ...]]]]  # getaddrinfo's answer for (host, port)
Address = tuple[int, tuple[Any, ...]]  # family, socket address
Starter = Callable[[], Coroutine[Any, Any, socket.socket]]


class Dialer:
    """One transport's addresses (`addresses`) and its connection race (`dial`). `lookup` is the
    resolver, `getaddrinfo` by default; tests give their own to map a name to loopback addresses."""

    __slots__ = ("_known", "_lookup", "_pending")

    def __init__(self, lookup: Lookup | None = None) -> None:
        self._lookup = lookup
        self._known: dict[tuple[str, int], tuple[float, list[Address]]] = {}  # (host, port): (until, addresses)
        self._pending: dict[tuple[str, int], asyncio.Task[list[Address]]] = {}

    async def dial(self, host: str, port: int) -> socket.socket:
        """A TCP socket connected to one of `host`'s addresses (the caller bounds the time)."""
        addresses = await self.addresses(host, port)
        if len(addresses) == 1:
            return await tcp_connect(addresses[0])
        return await race([_bound(address) for address in addresses], STAGGER_S)

    def close(self) -> None:
        """Cancel the lookups under way (the transport is closing)."""
        for task in list(self._pending.values()):
            task.cancel()

    async def addresses(self, host: str, port: int) -> list[Address]:
        if _literal(host):
            return interleaved(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST))
        key = (host, port)
        loop = asyncio.get_running_loop()
        known = self._known.get(key)
        if known is not None and known[0] > loop.time():
            return known[1]
        task = self._pending.get(key)
        if task is None:
            task = loop.create_task(self._resolve(host, port))
            self._pending[key] = task
            task.add_done_callback(lambda done: self._settled(key, done))
        return await asyncio.shield(task)  # one caller's cancellation leaves the lookup to the others

    async def _resolve(self, host: str, port: int) -> list[Address]:
        if self._lookup is not None:
            infos = await self._lookup(host, port)
        else:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = interleaved(infos)
        if not addresses:
            raise OSError(f"no address for {host}")
        self._known[(host, port)] = (asyncio.get_running_loop().time() + ADDRESS_TTL_S, addresses)
        return addresses

    def _settled(self, key: tuple[str, int], task: asyncio.Task[list[Address]]) -> None:
        self._pending.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: a lookup every caller gave up on fails quietly


def interleaved(infos: list[tuple[Any, ...]]) -> list[Address]:
    """`getaddrinfo`'s addresses once each, in its order, the families alternating from the first's
    (RFC 8305, section 4)."""
    by_family: dict[int, list[Address]] = {}
    seen: set[Any] = set()
    for family, *_, sockaddr in infos:
        if sockaddr[0] not in seen:
            seen.add(sockaddr[0])
            by_family.setdefault(family, []).append((family, sockaddr))
    lists = list(by_family.values())
    out: list[Address] = []
    for i in range(max(map(len, lists), default=0)):
        out.extend(addresses[i] for addresses in lists if i < len(addresses))
    return out


async def tcp_connect(address: Address) -> socket.socket:
    """A non-blocking TCP socket connected to `address`, with Nagle's delay off (as asyncio's
    transports set it); closed if the connect fails or is cancelled."""
    family, sockaddr = address
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.get_running_loop().sock_connect(sock, sockaddr)
    except BaseException:
        sock.close()
        raise
    return sock


async def race(openers: list[Starter], delay: float) -> socket.socket:
    """The first socket any of `openers` connects, starting them `delay` apart or sooner when one
    fails (module doc); if all fail, the first failure, or every failure's text in one `OSError`."""
    if not openers:
        raise OSError("no address to connect to")
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task[socket.socket]] = {loop.create_task(openers[0]())}
    started = 1
    failures: list[BaseException] = []
    try:
        while running:
            more = started < len(openers)
            done, _ = await asyncio.wait(running, timeout=delay if more else None, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                running.discard(task)
                error = task.exception()
                if error is None:
                    return task.result()
                failures.append(error)
            if more:  # the delay passed, or an attempt failed: the next one starts
                running.add(loop.create_task(openers[started]()))
                started += 1
        raise _failed(failures)
    finally:
        for task in running:
            task.add_done_callback(_close_late)
            task.cancel()


def _failed(failures: list[BaseException]) -> BaseException:
    if len(failures) == 1 or len({str(failure) for failure in failures}) == 1:
        return failures[0]
    first = failures[0]
    errno = first.errno if isinstance(first, OSError) else None
    return OSError(errno, "; ".join(str(failure) for failure in failures))


def _close_late(task: asyncio.Task[socket.socket]) -> None:
    """A losing attempt that connected before its cancellation took: closed, never used."""
    if not task.cancelled() and task.exception() is None:
        task.result().close()


def _bound(address: Address) -> Starter:
    return lambda: tcp_connect(address)


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
