"""The https path against a real loopback TLS upstream, and the same answers over either scheme.

The certificates are self-signed and made at test time with `openssl`; the adapter trusts one
through `make_client(ssl_context=...)`, with verification on as always. An upstream whose
certificate is not trusted is a classified transport failure. Both schemes go through one transport
(`providers.transport`), so every answer below means the same over http and https; https went to
aiohttp before, which read eight of them otherwise (the tests marked "both schemes").
"""

from __future__ import annotations

import asyncio
import gzip
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from devtools.mock_http import Reply
from providers.adapter import Provider, UpstreamClient, make_client
from providers.config import ProviderConfig, Timeouts
from providers.errors import Failure
from tests.providers.test_adapter import HELLO, REQUEST, collect, timed_out_after
from tests.providers.test_malformed import JSON, MALFORMED, WHOLE, WHOLE_EVENTS, answer, closed_by_client
from tests.support.upstream import ReplayUpstream, played


class Pair(msgspec.Struct):
    cert: Path
    key: Path


def self_signed(directory: Path, name: str) -> Pair:
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    files = ["-keyout", str(pair.key), "-out", str(pair.cert)]
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", *subject, *files],
        check=True,
        capture_output=True,
    )
    return pair


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    directory = tmp_path_factory.mktemp("tls")
    return {name: self_signed(directory, name) for name in ("upstream", "stranger")}


@pytest.fixture
async def upstream(certs: dict[str, Pair]) -> AsyncIterator[ReplayUpstream]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs["upstream"].cert, certs["upstream"].key)
    async with ReplayUpstream(ssl=context) as server:
        yield server


def client_trusting(cert: Path | None) -> UpstreamClient:
    """The production client; `cert` is the one CA it trusts (None: the default, the system's CAs)."""
    return make_client() if cert is None else make_client(ssl_context=ssl.create_default_context(cafile=cert))


@pytest.fixture
async def client(certs: dict[str, Pair]) -> AsyncIterator[UpstreamClient]:
    http = client_trusting(certs["upstream"].cert)
    yield http
    await http.aclose()


def fastrun(upstream: ReplayUpstream, client: UpstreamClient, timeouts: Timeouts | None = None) -> Provider:
    assert upstream.url.startswith("https://127.0.0.1:")
    config = ProviderConfig(
        name="fastrun", kind="fastrun", base_url=upstream.url, api_key="fr_test", timeouts=timeouts or Timeouts()
    )
    return Provider(config, client)


async def test_whole_answer_and_probe_over_tls(upstream: ReplayUpstream, client: UpstreamClient) -> None:
    upstream.enqueue("nonstream_text")
    adapter = fastrun(upstream, client)
    assert await collect(adapter.events(REQUEST, "m", stream=False)) == (WHOLE_EVENTS, None)
    [sent] = upstream.requests
    assert (sent.method, sent.path, sent.headers["authorization"]) == ("POST", "/v1/chat/completions", "Bearer fr_test")
    assert sent.headers["accept-encoding"] == "identity"
    assert msgspec.json.decode(sent.body)["stream"] is False
    assert await adapter.probe() is True
    assert [probe.path for probe in upstream.probes] == ["/v1/models"]


async def test_streamed_answer_over_tls(upstream: ReplayUpstream, client: UpstreamClient) -> None:
    upstream.enqueue("vllm_text_stream")
    events, error = await collect(fastrun(upstream, client).events(REQUEST, "m", stream=True))
    assert (events, error) == (HELLO, None)
    [sent] = upstream.requests
    assert sent.headers["accept"] == "text/event-stream"
    assert sent.headers["accept-encoding"] == "identity"


@pytest.mark.parametrize("trusted", [None, "stranger"], ids=["system-cas", "another-ca"])
async def test_an_untrusted_certificate_is_a_transport_failure(
    upstream: ReplayUpstream, certs: dict[str, Pair], trusted: str | None
) -> None:
    client = client_trusting(None if trusted is None else certs[trusted].cert)
    try:
        adapter = fastrun(upstream, client)
        events, error = await collect(adapter.events(REQUEST, "m", stream=True))
        assert events == []
        assert error is not None
        assert (error.kind, error.message) == (Failure.TRANSIENT, "upstream connection failed")
        assert await adapter.probe() is False
        assert await adapter.probe_failure() == "SSLCertVerificationError"  # the innermost cause, as logged
    finally:
        await client.aclose()
    assert (upstream.requests, upstream.probes) == ([], [])


@pytest.mark.parametrize("name", sorted(MALFORMED))
async def test_a_malformed_answer_over_tls_is_transient(
    upstream: ReplayUpstream, client: UpstreamClient, name: str
) -> None:
    upstream.enqueue(Reply(raw=MALFORMED[name]))
    events, error = await collect(fastrun(upstream, client).events(REQUEST, "m", stream=False))
    assert events == []
    assert error is not None
    assert (error.kind, error.message) == (Failure.TRANSIENT, "upstream sent a malformed response")
    assert await closed_by_client(upstream)


async def test_a_stream_over_tls_waits_first_byte_for_its_head_and_idle_between_reads(
    upstream: ReplayUpstream, client: UpstreamClient
) -> None:
    """`first_byte` bounds the head and `idle` each read after it, on the https transport as on
    the plain one (its client's read timeout used to be `idle` for the head too)."""
    adapter = fastrun(upstream, client, Timeouts(first_byte=2.0, idle=0.4))
    upstream.enqueue(played("vllm_text_stream", first_byte_delay_s=0.8))  # a slow head, then chunks at once
    assert await collect(adapter.events(REQUEST, "m", stream=True)) == (HELLO, None)
    upstream.enqueue(played("vllm_text_stream", stall_after=2))
    started = asyncio.get_running_loop().time()
    _events, error = await collect(adapter.events(REQUEST, "m", stream=True))
    assert error is not None
    assert (error.kind, error.message) == (Failure.TIMEOUT, "upstream timed out")
    assert 0.4 <= asyncio.get_running_loop().time() - started < 1.5  # idle, not first_byte


async def test_total_bounds_a_whole_answer_whose_body_trickles_over_tls(
    upstream: ReplayUpstream, client: UpstreamClient
) -> None:
    """As on the plain-HTTP transport (`test_adapter`): each body read within `first_byte`, the
    attempt a timeout once `total` has passed."""
    body = b'{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}'
    chunks = [body[index : index + 1] for index in range(len(body))]
    upstream.enqueue(Reply(headers=[("content-type", "application/json")], chunks=chunks, chunk_delay_s=0.05))
    assert 0.45 < await timed_out_after(fastrun(upstream, client, Timeouts(first_byte=1.0, total=0.5))) < 1.0


async def test_total_bounds_a_stream_that_stalls_over_tls(upstream: ReplayUpstream, client: UpstreamClient) -> None:
    """As on the plain-HTTP transport (`test_adapter`): a stream that stalls after its first chunks
    fails at `total`, not at the end of an `idle` wait longer than it."""
    adapter = fastrun(upstream, client, Timeouts(first_byte=10.0, idle=10.0, total=0.5))
    upstream.enqueue(played("vllm_text_stream", stall_after=2))
    started = asyncio.get_running_loop().time()
    _events, error = await collect(adapter.events(REQUEST, "m", stream=True))
    assert error is not None
    assert (error.kind, error.message) == (Failure.TIMEOUT, "upstream timed out")
    assert 0.45 <= asyncio.get_running_loop().time() - started < 1.5


class Either(msgspec.Struct):
    """An upstream of one scheme and a client that reaches it."""

    upstream: ReplayUpstream
    client: UpstreamClient

    def provider(self, timeouts: Timeouts | None = None) -> Provider:
        config = ProviderConfig(
            name="p", kind="fastrun", base_url=self.upstream.url, api_key="fr_test", timeouts=timeouts or Timeouts()
        )
        return Provider(config, self.client)


@pytest.fixture(params=["http", "https"])
async def either(request: pytest.FixtureRequest, certs: dict[str, Pair]) -> AsyncIterator[Either]:
    context = None
    if request.param == "https":
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certs["upstream"].cert, certs["upstream"].key)
    client = client_trusting(certs["upstream"].cert)
    async with ReplayUpstream(ssl=context) as server:
        yield Either(server, client)
    await client.aclose()


JSON_HEADERS = [("content-type", "application/json")]
CLIENT_ERROR = b'{"error":{"message":"bad max_tokens","type":"invalid_request_error","code":400}}'


@pytest.mark.parametrize("status", [200, 400])
async def test_a_gzip_body_not_asked_for_is_malformed_on_both_schemes(either: Either, status: int) -> None:
    """aiohttp's body was decoded by httpx on https: the 200 was billed, the 400 read as the client's."""
    body = gzip.compress(WHOLE if status == 200 else CLIENT_ERROR)
    either.upstream.enqueue(Reply(status, [*JSON_HEADERS, ("content-encoding", "gzip")], [body]))
    events, error = await collect(either.provider().events(REQUEST, "m", stream=False))
    assert events == []
    assert error is not None
    assert (error.kind, error.message) == (Failure.TRANSIENT, "upstream sent a malformed response")


@pytest.mark.parametrize(
    "head",
    [[b"x-pad: " + b"a" * 9000], [b"x-h%d: v" % index for index in range(130)]],
    ids=["a-9kb-header", "130-headers"],
)
async def test_a_large_head_within_64k_is_read_on_both_schemes(either: Either, head: list[bytes]) -> None:
    """aiohttp refused a header line over 8,190 bytes and more than 128 headers (a 502 and a cool-down)."""
    either.upstream.enqueue(Reply(raw=answer(JSON, *head, b"content-length: %d" % len(WHOLE), body=WHOLE)))
    assert await collect(either.provider().events(REQUEST, "m", stream=False)) == (WHOLE_EVENTS, None)


async def test_bytes_after_a_whole_answer_do_not_fail_it_on_both_schemes(either: Either) -> None:
    """aiohttp read them as the next status line and failed the answer the upstream had completed."""
    either.upstream.enqueue(Reply(raw=answer(JSON, b"content-length: %d" % len(WHOLE), body=WHOLE + b"GARBAGE")))
    assert await collect(either.provider().events(REQUEST, "m", stream=False)) == (WHOLE_EVENTS, None)
    assert await closed_by_client(either.upstream)  # not pooled: its stray bytes


async def test_a_repeated_retry_after_is_read_on_both_schemes(either: Either) -> None:
    """httpx joined the two into "30, 30" on https, which reads as no hint: a 1 s cool-down."""
    either.upstream.enqueue(Reply(429, [*JSON_HEADERS, ("retry-after", "30"), ("retry-after", "30")], [b"{}"]))
    _events, error = await collect(either.provider().events(REQUEST, "m", stream=False))
    assert error is not None
    assert (error.kind, error.retry_after) == (Failure.CAPACITY, 30.0)


async def test_a_streams_error_body_that_stalls_waits_idle_on_both_schemes(either: Either) -> None:
    """Each read of a stream's answer, an error body's too, waits `idle`; https waited `first_byte`."""
    either.upstream.enqueue(Reply(429, [*JSON_HEADERS, ("retry-after", "30")], [b'{"error":', b"{}}"], stall_after=1))
    started = asyncio.get_running_loop().time()
    _events, error = await collect(
        either.provider(Timeouts(first_byte=5.0, idle=0.5)).events(REQUEST, "m", stream=True)
    )
    assert error is not None
    assert (error.kind, error.retry_after) == (Failure.CAPACITY, 30.0)  # classified by status and headers
    assert 0.45 <= asyncio.get_running_loop().time() - started < 2.0


async def test_a_reset_is_a_connection_failure_on_both_schemes(either: Either) -> None:
    """The mock's reset waited for a TLS transport's write buffer to drain, which it never said:
    every https reset test was a stall."""
    either.upstream.enqueue(played("nonstream_text", reset_after=0))
    started = asyncio.get_running_loop().time()
    _events, error = await collect(either.provider().events(REQUEST, "m", stream=False))
    assert error is not None
    assert (error.kind, error.message) == (Failure.TRANSIENT, "upstream connection failed")
    assert asyncio.get_running_loop().time() - started < 1.0


async def test_a_probe_is_not_retried_on_another_connection_on_both_schemes(either: Either) -> None:
    """providers.md: no hidden retries inside the HTTP client. aiohttp sent a GET again on a fresh
    connection when a reused one was reset, and the probe said healthy."""
    either.upstream.enqueue(Reply(200, JSON_HEADERS, [b'{"object":"list","data":[]}']), path="/v1/models")
    either.upstream.enqueue(played("nonstream_text", reset_after=0), path="/v1/models")
    adapter = either.provider()
    assert await adapter.probe_failure() is None
    assert await adapter.probe_failure() == "ConnectionResetError"
    seen = [*either.upstream.requests, *either.upstream.probes]
    assert ([sent.path for sent in seen], either.upstream.connections_made) == (["/v1/models"] * 2, 1)
