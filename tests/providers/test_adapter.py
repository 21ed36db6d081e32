"""`Provider` against a real loopback HTTP/1.1 server that replays recorded transcripts and
injects faults (resets, stalls, silence), through the production client (`make_client`): the
tests' `ReplayUpstream`, and a raw socket server for answers no well-behaved server sends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest

from devtools.mock_http import Reply
from providers.adapter import Provider, make_client
from providers.config import KIND_DEFAULTS, ProviderConfig, Timeouts
from providers.errors import Failure, UpstreamError
from providers.events import (
    Event,
    Finish,
    TextDelta,
    ToolCallArgs,
    ToolCallStart,
    UpstreamMeta,
    Usage,
    UsageReport,
)
from providers.types import CompletionRequest
from tests.support.ports import free_port
from tests.support.upstream import ReplayUpstream, played, reply_json, upstream_fixture

REQUEST = msgspec.convert(
    {"messages": [{"role": "user", "content": [{"kind": "text", "data": "Say hello"}]}], "max_tokens": 8},
    CompletionRequest,
)
HELLO = [
    UpstreamMeta("chatcmpl-7f3a9c2e1b0d4e5f"),
    TextDelta("Hel"),
    TextDelta("lo"),
    TextDelta(" world"),
    UsageReport(Usage(input_tokens=12, output_tokens=3)),
    Finish("stop"),
]

upstream = upstream_fixture("upstream")


@pytest.fixture
async def client() -> AsyncIterator[Any]:
    http = make_client()
    yield http
    await http.aclose()


def provider(upstream: ReplayUpstream, client: Any, **fields: Any) -> Provider:
    config = ProviderConfig(
        name="fastrun", kind="fastrun", base_url=upstream.url, api_key="fr_test", headers={"x-team": "core"}
    )
    return Provider(msgspec.structs.replace(config, **fields), client)


async def collect(events: AsyncIterator[Event]) -> tuple[list[Event], UpstreamError | None]:
    seen: list[Event] = []
    try:
        async for event in events:
            seen.append(event)
    except UpstreamError as exc:
        return seen, exc
    return seen, None


def serve(upstream: ReplayUpstream, name: str, **faults: Any) -> None:
    """Every request gets transcript `name`, played with `faults` (reset_after, stall_after …)."""
    upstream.set_default(played(name, **faults))


def answer_probes(upstream: ReplayUpstream, statuses: dict[str, int]) -> None:
    """Bare statuses for the probe paths; a path not named answers 404 (not the built-in 200)."""
    for path in ("/health", "/v1/models"):
        upstream.enqueue(Reply(statuses.get(path, 404)), path=path)


async def closed(upstream: ReplayUpstream) -> None:
    """The client hung up: no connection to the upstream is left open."""
    async with asyncio.timeout(2):
        await upstream.wait_idle()


async def test_streamed_answer_and_the_request_sent(upstream: ReplayUpstream, client: Any) -> None:
    serve(upstream, "vllm_text_stream.json")
    events, error = await collect(provider(upstream, client).events(REQUEST, "qwen3-8b", stream=True))
    assert error is None
    assert events == HELLO
    [sent] = upstream.requests
    assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
    assert sent.headers["authorization"] == "Bearer fr_test"
    assert sent.headers["accept"] == "text/event-stream"
    assert sent.headers["accept-encoding"] == "identity"  # a compressed answer is malformed (test_malformed)
    assert sent.headers["x-team"] == "core"
    assert sent.headers["user-agent"] == "switchyard"  # aiohttp sent its own over https; some front ends need one
    assert msgspec.json.decode(sent.body) == {
        "model": "qwen3-8b",
        "messages": [{"role": "user", "content": "Say hello"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 8,
    }


async def test_whole_answer(upstream: ReplayUpstream, client: Any) -> None:
    serve(upstream, "nonstream_tool_calls.json")
    events, error = await collect(provider(upstream, client).events(REQUEST, "m", stream=False))
    assert error is None
    assert events == [
        UpstreamMeta("chatcmpl-ns2"),
        ToolCallStart(0, "call_x1", "get_weather"),
        ToolCallArgs(0, '{"city": "Paris"}'),
        ToolCallStart(1, "call_x2", "get_time"),
        ToolCallArgs(1, '{"tz": "CET"}'),
        UsageReport(Usage(input_tokens=80, output_tokens=30)),
        Finish("tool_calls"),
    ]
    assert msgspec.json.decode(upstream.requests[0].body)["stream"] is False


async def test_stream_without_done_ends_at_eof(upstream: ReplayUpstream, client: Any) -> None:
    serve(upstream, "transformers_serve_stream.json", chunk_delay_s=0.01)
    events, error = await collect(provider(upstream, client).events(REQUEST, "m", stream=True))
    assert error is None
    assert events[-2:] == [UsageReport(Usage(input_tokens=7, output_tokens=2)), Finish("stop")]


async def test_truncated_stream_raises(upstream: ReplayUpstream, client: Any) -> None:
    serve(upstream, "truncated_stream.json")
    events, error = await collect(provider(upstream, client).events(REQUEST, "m", stream=True))
    assert events == [UpstreamMeta("chatcmpl-trunc"), TextDelta("Once"), TextDelta(" upon")]
    assert error is not None
    assert (error.kind, error.message) == (Failure.TRANSIENT, "upstream stream ended before a finish reason")


async def test_error_chunk_in_200_stream(upstream: ReplayUpstream, client: Any) -> None:
    serve(upstream, "error_in_200_stream.json")
    events, error = await collect(provider(upstream, client).events(REQUEST, "m", stream=True))
    assert events == [UpstreamMeta("chatcmpl-err"), TextDelta("Par")]
    assert error is not None
    assert (error.kind, error.status) == (Failure.TRANSIENT, 500)


async def test_reset_mid_stream_is_transient(upstream: ReplayUpstream, client: Any) -> None:
    serve(upstream, "vllm_text_stream.json", reset_after=3)
    events, error = await collect(provider(upstream, client).events(REQUEST, "m", stream=True))
    assert events == HELLO[:2]
    assert error is not None
    assert (error.kind, error.message) == (Failure.TRANSIENT, "upstream connection failed")


async def test_aclose_closes_the_upstream_connection(upstream: ReplayUpstream, client: Any) -> None:
    serve(upstream, "vllm_text_stream.json", stall_after=3)
    events = provider(upstream, client).events(REQUEST, "m", stream=True)
    assert [await anext(events), await anext(events)] == HELLO[:2]
    assert upstream.open_connections == 1
    await events.aclose()
    await closed(upstream)


async def test_idle_timeout(upstream: ReplayUpstream, client: Any) -> None:
    serve(upstream, "vllm_text_stream.json", stall_after=3)
    adapter = provider(upstream, client, timeouts=Timeouts(idle=0.2))
    events, error = await collect(adapter.events(REQUEST, "m", stream=True))
    assert events == HELLO[:2]
    assert error is not None
    assert (error.kind, error.message) == (Failure.TIMEOUT, "upstream timed out")


@pytest.mark.parametrize("stream", [True, False])
async def test_first_byte_timeout(upstream: ReplayUpstream, client: Any, stream: bool) -> None:
    upstream.set_default(Reply(stall_after=0))  # never answers; holds until the client hangs up
    adapter = provider(upstream, client, timeouts=Timeouts(first_byte=0.2))
    events, error = await collect(adapter.events(REQUEST, "m", stream=stream))
    assert events == []
    assert error is not None
    assert error.kind is Failure.TIMEOUT
    await closed(upstream)


@pytest.mark.parametrize(
    ("name", "kind", "retry_after"),
    [
        ("fastrun_429_retry_after.json", Failure.CAPACITY, 7.0),
        ("primalabs_429_no_body.json", Failure.CAPACITY, None),
        ("primalabs_422_budget_exceeded.json", Failure.QUOTA, None),
        ("unauthorized_401.json", Failure.AUTH, None),
        ("fastrun_400_int_code.json", Failure.CLIENT, None),
    ],
)
async def test_error_answers_are_classified(
    upstream: ReplayUpstream, client: Any, transcript: Any, name: str, kind: Failure, retry_after: float | None
) -> None:
    serve(upstream, name)
    for stream in (True, False):
        events, error = await collect(provider(upstream, client).events(REQUEST, "m", stream=stream))
        assert events == []
        assert error is not None
        assert (error.kind, error.status, error.retry_after) == (kind, transcript(name).status, retry_after)


async def test_the_providers_key_quoted_by_the_upstream_never_reaches_the_message(
    upstream: ReplayUpstream, client: Any
) -> None:
    """A refused request's message is the upstream's own (it goes to the client): a server that
    quotes the header it got put the provider's key there, in an error answer or an error chunk."""
    quoted = {"error": {"message": "bad request from Bearer fr_test, key fr_test", "type": "invalid_fr_test"}}
    upstream.enqueue(reply_json(400, quoted))
    chunk = b'data: {"error": {"message": "fr_test refused", "code": 400}}\n\n'
    upstream.enqueue(Reply(200, [("content-type", "text/event-stream")], [chunk]))
    messages = []
    for stream in (False, True):
        _events, error = await collect(provider(upstream, client).events(REQUEST, "m", stream=stream))
        assert error is not None
        assert error.kind is Failure.CLIENT
        messages.append((error.message, str(error), error.code))
    assert messages == [  # the code (logged by routing) too
        ("bad request from Bearer ***, key ***", "bad request from Bearer ***, key ***", "invalid_***"),
        ("*** refused", "*** refused", None),
    ]


async def test_a_quoted_key_the_message_limit_cuts_in_two_is_masked_too(upstream: ReplayUpstream, client: Any) -> None:
    """The upstream's message is kept to 2,000 characters before it is masked: a key the cut split
    would leave its first characters."""
    text = "x" * (2000 - 5) + "fr_test"  # the cut keeps `fr_te`
    upstream.enqueue(reply_json(400, {"error": {"message": text, "type": "invalid_request_error"}}))
    _events, error = await collect(provider(upstream, client).events(REQUEST, "m", stream=False))
    assert error is not None
    assert error.message == "x" * (2000 - 5) + "***"


async def test_connection_refused(client: Any) -> None:
    config = ProviderConfig(name="local", kind="local", base_url=f"http://127.0.0.1:{free_port()}/v1")
    events, error = await collect(Provider(config, client).events(REQUEST, "m", stream=True))
    assert events == []
    assert error is not None
    assert error.kind is Failure.TRANSIENT
    assert await Provider(config, client).probe() is False
    assert await Provider(config, client).probe_failure() == "ConnectionRefusedError"


@pytest.mark.parametrize(
    ("routes", "failure"),
    [
        ({"/health": 200}, None),
        ({"/health": 503, "/v1/models": 200}, "503"),  # llama.cpp loading its model: not up
        ({"/health": 500, "/v1/models": 200}, "500"),
        ({"/health": 404, "/v1/models": 200}, None),  # no such route (Ollama): `/v1/models` tells
        ({"/health": 405, "/v1/models": 200}, None),
        ({"/v1/models": 200}, None),
        ({"/health": 503, "/v1/models": 503}, "503"),
    ],
)
async def test_local_probe(upstream: ReplayUpstream, client: Any, routes: dict[str, int], failure: str | None) -> None:
    answer_probes(upstream, routes)
    config = ProviderConfig(name="local", kind="local", base_url=upstream.url, wire=KIND_DEFAULTS["local"])
    assert await Provider(config, client).probe_failure() == failure


@pytest.mark.parametrize(
    ("reply", "report"),
    [
        (reply_json(200, {"object": "list", "data": [{"id": "a"}, {"id": "b"}]}), (None, frozenset({"a", "b"}))),
        (reply_json(200, {"object": "list", "data": []}), (None, None)),  # an empty list says nothing
        (reply_json(200, {"data": [{"id": None}, {"id": "a"}, 5]}), (None, frozenset({"a"}))),  # odd entries skipped
        (reply_json(200, [{"id": "a"}]), (None, frozenset({"a"}))),  # a bare list
        (Reply(200, chunks=[b"<html>captive portal</html>"]), ("malformed response", None)),
        (reply_json(200, {"data": [{"name": "a"}]}), (None, None)),  # no id read: says nothing
        (reply_json(200, {"models": ["a"]}), ("malformed response", None)),
        (Reply(401), ("401", None)),
    ],
)
async def test_hosted_probe(upstream: ReplayUpstream, client: Any, reply: Reply, report: tuple[Any, Any]) -> None:
    """fastrun's `/models`, with the key: the models it can serve right now, or why it is not up
    (a 200 that is no model list, a captive portal or a wrong `base_url`, is not up either)."""
    upstream.enqueue(reply, path="/v1/models")
    assert await provider(upstream, client).probe_report() == report
    assert [r.path for r in upstream.requests] == ["/v1/models"]
    assert upstream.requests[0].headers["authorization"] == "Bearer fr_test"


async def test_a_local_health_route_that_resets_is_a_failed_probe(upstream: ReplayUpstream, client: Any) -> None:
    """Only a missing route (404, 405, 501) sends the probe on to `/v1/models`: a `/health` that
    resets or hangs (a wedged engine whose API server still lists models) is not up."""
    upstream.enqueue(Reply(200, chunks=[b"x"], reset_after=0), path="/health")
    upstream.enqueue(reply_json(200, {"object": "list", "data": [{"id": "m"}]}), path="/v1/models")
    config = ProviderConfig(name="local", kind="local", base_url=upstream.url, wire=KIND_DEFAULTS["local"])
    assert await Provider(config, client).probe_report() == ("ConnectionResetError", None)
    assert [r.path for r in upstream.requests] == ["/health"]


async def test_connections_are_reused(upstream: ReplayUpstream, client: Any) -> None:
    serve(upstream, "vllm_text_stream.json")
    adapter = provider(upstream, client)
    for _ in range(3):
        events, error = await collect(adapter.events(REQUEST, "m", stream=True))
        assert (events, error) == (HELLO, None)
    assert (len(upstream.requests), upstream.connections_made) == (3, 1)


@pytest.mark.parametrize(("name", "stream"), [("vllm_text_stream.json", True), ("nonstream_tool_calls.json", False)])
async def test_a_connection_the_upstream_closed_unannounced_is_not_reused(
    upstream: ReplayUpstream, client: Any, name: str, stream: bool
) -> None:
    """The upstream closes after each answer without `Connection: close`: its FIN comes just after
    the body, which the adapter has read and whose connection it has given back by then. The next
    request took that connection and failed ("upstream closed the connection"), every time."""
    serve(upstream, name, close_after=True)
    adapter = provider(upstream, client)
    for _ in range(3):
        events, error = await collect(adapter.events(REQUEST, "m", stream=stream))
        assert (error, type(events[-1])) == (None, Finish)
    assert (len(upstream.requests), upstream.connections_made) == (3, 3)


async def test_a_streams_connection_waits_for_its_terminator_and_is_reused(client: Any) -> None:
    """A stream's reader stops at `data: [DONE]`; uvicorn (vLLM's server) writes the chunked
    terminator after it, apart, and the connection was closed for want of it: most streams opened
    a new connection, a TLS handshake each to a hosted provider."""
    accepted = [0]
    event = b"data: " + msgspec.json.encode({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    stream = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (event + b"\n\n", b"data: [DONE]\n\n"))

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.startswith(b"content-length")
                )
                await reader.readexactly(length)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                writer.write(stream)
                await writer.drain()
                await asyncio.sleep(0.03)  # the terminator apart, as uvicorn's own write
                writer.write(b"0\r\n\r\n")
                await writer.drain()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    adapter = Provider(ProviderConfig(name="local", kind="local", base_url=url), client)
    for _ in range(3):
        events, error = await collect(adapter.events(REQUEST, "m", stream=True))
        assert (error, events[-1]) == (None, Finish("stop"))
        await asyncio.sleep(0.1)  # the terminator has come meanwhile
    server.close()
    assert accepted[0] == 1


async def raw_upstream(answer: Callable[[asyncio.StreamWriter], Any]) -> tuple[asyncio.Server, str]:
    """A loopback server that reads one request and lets `answer` write whatever it likes."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.startswith(b"content-length"))
        await reader.readexactly(length)
        try:
            await answer(writer)
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


async def test_first_byte_bounds_the_whole_head_not_each_read(client: Any) -> None:
    """An upstream that trickles its status line and headers a byte at a time, each byte well
    within `first_byte`, still times out once `first_byte` has passed since the request."""

    async def trickle(writer: asyncio.StreamWriter) -> None:
        for byte in b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}":
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)  # the behaviour under test: slow bytes, each within `first_byte`

    server, url = await raw_upstream(trickle)
    config = ProviderConfig(name="local", kind="local", base_url=url, timeouts=Timeouts(first_byte=0.3))
    elapsed = await timed_out_after(Provider(config, client))
    server.close()
    assert 0.25 < elapsed < 1.0


async def test_an_answer_many_times_the_pause_mark_is_read_whole(upstream: ReplayUpstream, client: Any) -> None:
    """Reading pauses past `PAUSE_AT` unread bytes and resumes when the reader wants more: a whole
    answer of 3 MiB (its reader takes it only once it is all in) passes the mark a dozen times and
    ends as it should; a pause that never resumed ended it as a timeout."""
    text = "y" * (3 << 20)
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
    upstream.enqueue(reply_json(200, answer))
    adapter = provider(upstream, client, timeouts=Timeouts(first_byte=2.0))
    events, error = await collect(adapter.events(REQUEST, "m", stream=False))
    assert error is None
    assert sum(len(event.text) for event in events if isinstance(event, TextDelta)) == 3 << 20
    assert events[-1] == Finish("stop")


async def test_a_reader_that_stopped_holds_the_upstream_back(client: Any) -> None:
    """The transport stops reading the socket past `PAUSE_AT` unread bytes until the answer's
    reader wants more: it read a fast upstream's whole answer into memory behind a reader that had
    stopped (the relay behind a client that stopped: 300 MB in a second)."""
    sent = [0]
    chunk = b"data: " + msgspec.json.encode({"choices": [{"index": 0, "delta": {"content": "x" * 1000}}]}) + b"\n\n"
    frame = b"%x\r\n%s\r\n" % (len(chunk) * 64, chunk * 64)

    async def flood(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            while sent[0] < 64 << 20:
                writer.write(frame)
                sent[0] += len(frame)
                await writer.drain()

    server, url = await raw_upstream(flood)
    adapter = Provider(ProviderConfig(name="local", kind="local", base_url=url), client)
    batches = adapter.batches(REQUEST, "m", stream=True)
    assert (await anext(batches))[0] is not None
    await asyncio.sleep(1.0)  # the reader stops
    held_back = sent[0]
    await batches.aclose()
    server.close()
    assert held_back < 16 << 20  # the kernel's buffers and 256 KiB here, not the whole 64 MiB


async def timed_out_after(adapter: Provider) -> float:
    """Seconds until a whole answer's attempt failed as a timeout, having yielded no event."""
    started = asyncio.get_running_loop().time()
    events, error = await collect(adapter.events(REQUEST, "m", stream=False))
    assert events == []
    assert error is not None
    assert error.kind is Failure.TIMEOUT
    return asyncio.get_running_loop().time() - started


async def test_total_bounds_a_whole_answer_whose_body_trickles(client: Any) -> None:
    """The head at once, then the body a byte at a time, each within `first_byte`: the attempt is a
    timeout once `total` has passed (it waited for the request's deadline, so never failed over)."""
    body = b'{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}'

    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
        for byte in body:
            await writer.drain()
            await asyncio.sleep(0.05)  # slow bytes, each well within `first_byte`
            writer.write(bytes([byte]))

    server, url = await raw_upstream(trickle)
    config = ProviderConfig(name="local", kind="local", base_url=url, timeouts=Timeouts(first_byte=1.0, total=0.5))
    elapsed = await timed_out_after(Provider(config, client))
    server.close()
    assert 0.45 < elapsed < 1.0


async def test_a_whole_body_shorter_than_its_length_is_transient(client: Any) -> None:
    async def short(writer: asyncio.StreamWriter) -> None:
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{"id": "x"')
        await writer.drain()

    server, url = await raw_upstream(short)
    config = ProviderConfig(name="local", kind="local", base_url=url)
    events, error = await collect(Provider(config, client).events(REQUEST, "m", stream=False))
    server.close()
    assert events == []
    assert error is not None
    assert (error.kind, error.message) == (Failure.TRANSIENT, "upstream connection failed")


def _sse(*payloads: str) -> bytes:
    """`payloads` as SSE `data` lines, in one HTTP/1.1 chunk."""
    body = b"".join(b"data: %s\n\n" % payload.encode() for payload in payloads)
    return b"%x\r\n%s\r\n" % (len(body), body)


def _chunk(content: str) -> str:
    return f'{{"id": "chatcmpl-b", "choices": [{{"index": 0, "delta": {{"content": "{content}"}}}}]}}'


async def test_batches_are_one_per_read_and_a_failure_keeps_the_events_before_it(client: Any) -> None:
    """`Provider.batches`: the events one body read completed come as one list; when a read ends
    in an error chunk, the events that read completed before it come first, then the error."""
    taken = asyncio.Event()  # set by the test once it holds the first batch: the second write is another read

    async def two_reads(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(_sse(_chunk("a"), _chunk("b")))
        await writer.drain()
        await taken.wait()
        error = '{"error": {"message": "overloaded", "type": "server_error", "code": 500}}'
        writer.write(_sse(_chunk("c"), error, _chunk("never")) + b"0\r\n\r\n")
        await writer.drain()

    server, url = await raw_upstream(two_reads)
    config = ProviderConfig(name="local", kind="local", base_url=url)
    batches: list[list[Event]] = []
    error: UpstreamError | None = None
    try:
        async for batch in Provider(config, client).batches(REQUEST, "m", stream=True):
            batches.append(batch)
            taken.set()
    except UpstreamError as exc:
        error = exc
    server.close()
    assert batches == [[UpstreamMeta("chatcmpl-b"), TextDelta("a"), TextDelta("b")], [TextDelta("c")]]
    assert error is not None
    assert (error.kind, error.status) == (Failure.TRANSIENT, 500)


@pytest.mark.parametrize("stream", [True, False])
async def test_total_bounds_a_stream_that_stalls_and_an_error_body_that_never_ends(client: Any, stream: bool) -> None:
    """`total` was checked when a read completed, so a stream that stalled after its first chunk
    (or a 503 whose body never ended) held the attempt for all of `idle` or `first_byte` (10 s
    here) before it failed over. Each read's wait is now cut to what is left of `total`."""
    sse = b"data: " + msgspec.json.encode({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}) + b"\n\n"

    async def stall(writer: asyncio.StreamWriter) -> None:
        if stream:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            writer.write(b"%x\r\n%s\r\n" % (len(sse), sse))
        else:
            writer.write(b'HTTP/1.1 503 Service Unavailable\r\ncontent-length: 100\r\n\r\n{"error": ')
        await writer.drain()
        await asyncio.sleep(30)

    server, url = await raw_upstream(stall)
    timeouts = Timeouts(first_byte=10.0, idle=10.0, total=0.5)
    config = ProviderConfig(name="local", kind="local", base_url=url, timeouts=timeouts)
    started = asyncio.get_running_loop().time()
    events, error = await collect(Provider(config, client).events(REQUEST, "m", stream=stream))
    elapsed = asyncio.get_running_loop().time() - started
    server.close()
    assert error is not None
    if stream:
        assert [type(event).__name__ for event in events] == ["TextDelta"]
        assert error.kind is Failure.TIMEOUT
    else:
        assert (error.kind, error.status) == (Failure.TRANSIENT, 503)  # classified by its status
    assert 0.45 < elapsed < 1.5
