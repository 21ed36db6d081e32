"""Dialing a new upstream connection (`providers.dialing`): a host's addresses looked up once for a
burst of connections and kept `ADDRESS_TTL_S`, and raced `STAGGER_S` apart, so an address that drops
connection attempts costs the stagger, not the `connect` timeout.

The host names are resolved by the transport's `lookup`, standing in for DNS: it maps a name to
loopback addresses (each through the real `getaddrinfo`) and counts its calls. The sockets, the
servers and the TLS handshakes are real. An address that drops attempts is a listener on
127.0.0.2 whose accept queue is full: the kernel drops the SYNs it is sent, so a connect waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from providers import dialing
from providers.adapter import Provider, UpstreamClient, make_client
from providers.config import ProviderConfig, Timeouts
from providers.dialing import STAGGER_S, Dialer, Lookup, interleaved
from providers.errors import Failure
from tests.providers.test_adapter import REQUEST, collect
from tests.providers.test_malformed import WHOLE_EVENTS
from tests.support.upstream import ReplayUpstream

NAME = "upstream.test"


def lookup_of(table: dict[str, list[str]], calls: list[str], pause_s: float = 0.0) -> Lookup:
    async def lookup(host: str, port: int) -> list[tuple[Any, ...]]:
        calls.append(host)
        await asyncio.sleep(pause_s)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [info for address in table[host] for info in socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)]

    return lookup


def provider(base_url: str, client: UpstreamClient, connect_s: float = 5.0) -> Provider:
    config = ProviderConfig(
        name="up", kind="fastrun", base_url=base_url, api_key="k", timeouts=Timeouts(connect=connect_s)
    )
    return Provider(config, client)


@contextmanager
def dropping(port: int, host: str = "127.0.0.2") -> Iterator[None]:
    """`host`:`port` drops connection attempts for as long as the block lasts (module doc)."""
    listener = socket.socket()
    listener.bind((host, port))
    listener.listen(0)
    fillers = [socket.socket() for _ in range(3)]
    for filler in fillers:
        filler.setblocking(False)
        filler.connect_ex((host, port))
    time.sleep(0.05)
    try:
        yield
    finally:
        for sock in [*fillers, listener]:
            sock.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def upstream() -> AsyncIterator[ReplayUpstream]:
    async with ReplayUpstream() as server:
        yield server


async def test_an_address_that_drops_connection_attempts_costs_the_stagger_not_the_timeout(
    upstream: ReplayUpstream,
) -> None:
    upstream.enqueue("nonstream_text")
    calls: list[str] = []
    client = make_client(lookup=lookup_of({NAME: ["127.0.0.2", "127.0.0.1"]}, calls))
    try:
        with dropping(upstream.port):
            adapter = provider(f"http://{NAME}:{upstream.port}/v1", client)
            began = time.monotonic()
            assert await collect(adapter.events(REQUEST, "m", stream=False)) == (WHOLE_EVENTS, None)
            took = time.monotonic() - began
    finally:
        await client.aclose()
    assert STAGGER_S <= took < 1.5  # the first address waits STAGGER_S, then the second answers
    assert calls == [NAME]
    [sent] = upstream.requests
    assert sent.headers["host"] == f"{NAME}:{upstream.port}"


async def test_addresses_that_refuse_are_passed_over_at_once(upstream: ReplayUpstream) -> None:
    upstream.enqueue("nonstream_text")
    client = make_client(lookup=lookup_of({NAME: ["127.0.0.2", "127.0.0.3", "127.0.0.1"]}, []))
    try:
        began = time.monotonic()
        adapter = provider(f"http://{NAME}:{upstream.port}/v1", client)
        assert await collect(adapter.events(REQUEST, "m", stream=False)) == (WHOLE_EVENTS, None)
        took = time.monotonic() - began
    finally:
        await client.aclose()
    assert took < STAGGER_S  # two refusals, each starting the next address without the stagger


async def test_a_host_whose_addresses_all_refuse_is_a_connection_failure() -> None:
    client = make_client(lookup=lookup_of({NAME: ["127.0.0.2", "127.0.0.3"]}, []))
    try:
        adapter = provider(f"http://{NAME}:{free_port()}/v1", client)
        events, error = await collect(adapter.events(REQUEST, "m", stream=False))
        assert await adapter.probe_failure() == "ConnectionRefusedError"
    finally:
        await client.aclose()
    assert events == []
    assert error is not None
    assert (error.kind, error.message) == (Failure.TRANSIENT, "upstream connection failed")


async def test_only_addresses_that_drop_attempts_use_the_connect_timeout(upstream: ReplayUpstream) -> None:
    client = make_client(lookup=lookup_of({NAME: ["127.0.0.2"]}, []))
    try:
        with dropping(upstream.port):
            began = time.monotonic()
            adapter = provider(f"http://{NAME}:{upstream.port}/v1", client, connect_s=0.6)
            events, error = await collect(adapter.events(REQUEST, "m", stream=False))
            took = time.monotonic() - began
    finally:
        await client.aclose()
    assert (events, error is not None and error.message) == ([], "upstream timed out")
    assert 0.6 <= took < 1.2
    assert upstream.requests == []


async def test_a_dial_cancelled_with_attempts_in_flight_leaves_no_socket_open() -> None:
    port = free_port()
    with dropping(port, "127.0.0.2"), dropping(port, "127.0.0.3"):
        dialer = Dialer(lookup_of({NAME: ["127.0.0.2", "127.0.0.3"]}, []))
        before = len(os.listdir("/proc/self/fd"))
        task = asyncio.create_task(dialer.dial(NAME, port))
        await asyncio.sleep(STAGGER_S + 0.1)  # both connects under way
        assert len(os.listdir("/proc/self/fd")) == before + 2
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)  # the losing attempt's cancellation runs
        assert len(os.listdir("/proc/self/fd")) == before


async def test_a_burst_of_new_connections_looks_the_host_up_once(upstream: ReplayUpstream) -> None:
    upstream.enqueue("nonstream_text", repeat=12)
    calls: list[str] = []
    client = make_client(lookup=lookup_of({NAME: ["127.0.0.1"]}, calls, pause_s=0.05))
    try:
        adapter = provider(f"http://{NAME}:{upstream.port}/v1", client)
        answers = await asyncio.gather(*(collect(adapter.events(REQUEST, "m", stream=False)) for _ in range(12)))
    finally:
        await client.aclose()
    assert answers == [(WHOLE_EVENTS, None)] * 12
    assert calls == [NAME]
    assert len(upstream.requests) == 12


async def test_an_ip_literal_is_never_looked_up(upstream: ReplayUpstream) -> None:
    upstream.enqueue("nonstream_text")
    calls: list[str] = []
    client = make_client(lookup=lookup_of({}, calls))
    try:
        assert await collect(provider(upstream.url, client).events(REQUEST, "m", stream=False)) == (WHOLE_EVENTS, None)
    finally:
        await client.aclose()
    assert calls == []


async def test_addresses_are_kept_for_their_ttl_and_a_failed_lookup_is_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dialing, "ADDRESS_TTL_S", 0.2)
    calls: list[str] = []
    dialer = Dialer(lookup_of({NAME: ["127.0.0.1"]}, calls))
    loopback = [(socket.AF_INET, ("127.0.0.1", 80))]
    assert await dialer.addresses(NAME, 80) == loopback
    assert await dialer.addresses(NAME, 80) == loopback
    assert calls == [NAME]
    await asyncio.sleep(0.25)
    assert await dialer.addresses(NAME, 80) == loopback
    assert calls == [NAME, NAME]
    for _ in range(2):
        with pytest.raises(socket.gaierror):
            await dialer.addresses("nowhere.test", 80)
    assert calls == [NAME, NAME, "nowhere.test", "nowhere.test"]


def test_addresses_alternate_families_from_the_first_once_each() -> None:
    def info(family: socket.AddressFamily, address: str) -> tuple[Any, ...]:
        sockaddr = (address, 443, 0, 0) if family == socket.AF_INET6 else (address, 443)
        return (family, socket.SOCK_STREAM, 6, "", sockaddr)

    v6, v4 = socket.AF_INET6, socket.AF_INET
    infos = [info(v6, "2001:db8::1"), info(v6, "2001:db8::2"), info(v6, "2001:db8::1"), info(v4, "192.0.2.1")]
    infos += [info(v4, "192.0.2.2"), info(v4, "192.0.2.3")]
    ordered = [(family, sockaddr[0]) for family, sockaddr in interleaved(infos)]
    expected = [(v6, "2001:db8::1"), (v4, "192.0.2.1"), (v6, "2001:db8::2"), (v4, "192.0.2.2"), (v4, "192.0.2.3")]
    assert ordered == expected


def certificate_for(directory: Path, san: str) -> ssl.SSLContext:
    cert, key = directory / "upstream.crt", directory / "upstream.key"
    subject = ["-subj", "/CN=upstream", "-addext", f"subjectAltName={san}"]
    files = ["-keyout", str(key), "-out", str(cert)]
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", *subject, *files],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


@pytest.mark.parametrize(("san", "ok"), [(f"DNS:{NAME}", True), ("IP:127.0.0.1", False)], ids=["name", "address"])
async def test_over_tls_the_certificate_is_checked_for_the_host_name_not_the_address_dialled(
    tmp_path: Path, san: str, ok: bool
) -> None:
    server_context = certificate_for(tmp_path, san)
    client = make_client(
        ssl_context=ssl.create_default_context(cafile=tmp_path / "upstream.crt"),
        lookup=lookup_of({NAME: ["127.0.0.1"]}, []),
    )
    try:
        async with ReplayUpstream(ssl=server_context) as upstream:
            upstream.enqueue("nonstream_text")
            adapter = provider(f"https://{NAME}:{upstream.port}/v1", client)
            events, error = await collect(adapter.events(REQUEST, "m", stream=False))
            if ok:
                assert (events, error) == (WHOLE_EVENTS, None)
            else:
                assert (events, error is not None and error.message) == ([], "upstream connection failed")
                assert await adapter.probe_failure() == "SSLCertVerificationError"
    finally:
        await client.aclose()


class SlowRelay:
    """A relay on 127.0.0.1 and 127.0.0.2 (one port) to `target`, holding each connection's first
    bytes `delay_s`: a TLS handshake takes longer than the stagger, as to a distant host."""

    def __init__(self, target: int, delay_s: float) -> None:
        self.target, self.delay_s, self.accepted = target, delay_s, 0
        self.servers: list[asyncio.Server] = []

    async def start(self) -> int:
        first = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port = int(first.sockets[0].getsockname()[1])
        self.servers = [first, await asyncio.start_server(self._relay, "127.0.0.2", port)]
        return port

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await asyncio.sleep(self.delay_s)
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    def close(self) -> None:
        for server in self.servers:
            server.close()


async def test_a_tls_handshake_slower_than_the_stagger_opens_one_connection(tmp_path: Path) -> None:
    """Only the TCP connects race: with TLS in each attempt, a handshake over 250 ms started a second
    connection (and a second handshake) to the next address for every new connection."""
    server_context = certificate_for(tmp_path, f"DNS:{NAME}")
    client = make_client(
        ssl_context=ssl.create_default_context(cafile=tmp_path / "upstream.crt"),
        lookup=lookup_of({NAME: ["127.0.0.2", "127.0.0.1"]}, []),
    )
    try:
        async with ReplayUpstream(ssl=server_context) as upstream:
            upstream.enqueue("nonstream_text")
            relay = SlowRelay(upstream.port, delay_s=0.4)
            port = await relay.start()
            try:
                adapter = provider(f"https://{NAME}:{port}/v1", client)
                assert await collect(adapter.events(REQUEST, "m", stream=False)) == (WHOLE_EVENTS, None)
            finally:
                relay.close()
    finally:
        await client.aclose()
    assert relay.accepted == 1
