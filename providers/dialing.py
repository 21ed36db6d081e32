"""Dialing an upstream: its host's addresses, kept a while, and a staggered race to connect to them.

Addresses. A host's addresses come from the system resolver (`getaddrinfo`, in a thread) and are
kept `ADDRESS_TTL_S` (10 s, aiohttp's default, which the https path had before `providers.transport`
replaced it). A burst of new connections to a hosted provider then makes one lookup, not one each,
and lookups of one host that overlap share the first. `getaddrinfo` gives no TTL: for up to 10 s a
host that moved is dialled at its old addresses, and a connect that fails there fails the attempt
as any connect error does (providers.md). A failed lookup is not kept. An IP literal (the usual
local server) is never looked up.

Connecting, RFC 8305's "happy eyeballs" (asyncio has it, uvloop does not): the addresses in the
resolver's order with IPv6 and IPv4 alternating; the first attempt starts at once, each next one
`STAGGER_S` later or as soon as an attempt before it fails, all within the one `connect` timeout;
the first connection made (its TLS handshake included, for https) wins, and the others are
cancelled, or closed if they connect after it. So a host whose first address drops packets costs
a quarter of a second, not the whole timeout.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from providers.upstream_connection import Connection

ADDRESS_TTL_S = 10.0  # how long a host's looked-up addresses are used (module doc)
STAGGER_S = 0.25  # RFC 8305's connection attempt delay

Lookup = Callable[[str, int], Awaitable[list[tuple[Any, ...]]]]  # getaddrinfo's answer for (host, port)
Opener = Callable[[str], Coroutine[Any, Any, Connection]]  # connects to one address
Starter = Callable[[], Coroutine[Any, Any, Connection]]


class Dialer:
    """One transport's addresses (`addresses`) and its connection race (`dial`). `lookup` is the
    resolver, `getaddrinfo` by default; tests give their own to map a name to loopback addresses."""

    __slots__ = ("_known", "_lookup", "_pending")

    def __init__(self, lookup: Lookup | None = None) -> None:
        self._lookup = lookup
        self._known: dict[tuple[str, int], tuple[float, list[str]]] = {}  # (host, port): (until, addresses)
        self._pending: dict[tuple[str, int], asyncio.Task[list[str]]] = {}

    async def dial(self, host: str, port: int, opener: Opener) -> Connection:
        """A connection to one of `host`'s addresses, made by `opener` (the caller bounds the time)."""
        addresses = await self.addresses(host, port)
        return await race([_bound(opener, address) for address in addresses], STAGGER_S)

    async def addresses(self, host: str, port: int) -> list[str]:
        if _literal(host):
            return [host]
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

    async def _resolve(self, host: str, port: int) -> list[str]:
        if self._lookup is not None:
            infos = await self._lookup(host, port)
        else:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = interleaved(infos)
        if not addresses:
            raise OSError(f"no address for {host}")
        self._known[(host, port)] = (asyncio.get_running_loop().time() + ADDRESS_TTL_S, addresses)
        return addresses

    def _settled(self, key: tuple[str, int], task: asyncio.Task[list[str]]) -> None:
        self._pending.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: a lookup every caller gave up on fails quietly


def interleaved(infos: list[tuple[Any, ...]]) -> list[str]:
    """`getaddrinfo`'s addresses once each, in its order, the families alternating from the first's
    (RFC 8305, section 4)."""
    by_family: dict[int, list[str]] = {}
    seen: set[str] = set()
    for family, *_, sockaddr in infos:
        address = sockaddr[0]
        if address not in seen:
            seen.add(address)
            by_family.setdefault(family, []).append(address)
    lists = list(by_family.values())
    out: list[str] = []
    for i in range(max(map(len, lists), default=0)):
        out.extend(addresses[i] for addresses in lists if i < len(addresses))
    return out


async def race(openers: list[Starter], delay: float) -> Connection:
    """The first connection any of `openers` makes, starting them `delay` apart or sooner when one
    fails (module doc); if all fail, the first failure, or every failure's text in one `OSError`."""
    if not openers:
        raise OSError("no address to connect to")
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task[Connection]] = {loop.create_task(openers[0]())}
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


def _close_late(task: asyncio.Task[Connection]) -> None:
    """A losing attempt that connected before its cancellation took: closed, never used."""
    if not task.cancelled() and task.exception() is None:
        task.result().close()


def _bound(opener: Opener, address: str) -> Starter:
    return lambda: opener(address)


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
