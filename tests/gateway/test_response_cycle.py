"""The held head (`app.edge.cycle.HeldHead`, as `hold_head` wires it) and the head written in bulk
(`app.edge.cycle.write_head`, as the completion doors call it) against uvicorn's own
`RequestResponseCycle` as the oracle: for every head — statuses with and without a body, HEAD
requests, keep-alive or not, with and without a content length (one or two), eleven `x-ratelimit-*`
headers, heads uvicorn lowercases, refuses or handles specially (`connection`, `transfer-encoding`)
— and every body sequence (one body, an empty one, a chunked stream), all put the same bytes on the
wire, end in the same state and refuse the same heads with the same error; the held cycle in one
write fewer whenever a body message follows the head. And the server really uses them: its
connections' cycles write to a `HeldHead`, and the completion doors' heads (JSON and SSE) are
written by `write_head`."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from app.edge import asgi
from app.edge.connection import GuardedHttpToolsProtocol
from app.edge.cycle import HeldHead, hold_head, write_head
from app.pipeline.events import header_pairs
from tests.support.client import USER, post
from tests.support.gateway import GatewayHandle
from tests.support.replies import chunk
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse

DEFAULTS = [(b"date", b"Tue, 01 Dec 2026 19:00:00 GMT"), (b"server", b"uvicorn")]
LIMITS = [
    (b"x-ratelimit-limit-requests", b"600"),
    (b"x-ratelimit-remaining-requests", b"599"),
    (b"x-ratelimit-reset-requests", b"100ms"),
    (b"x-ratelimit-limit-tokens", b"200000"),
    (b"x-ratelimit-remaining-tokens", b"199000"),
    (b"x-ratelimit-reset-tokens", b"6m0s"),
]
LIMITS_MADE = b"\r\n".join(map(b": ".join, LIMITS))  # as `app.access.gate` makes them
HEADS: list[list[tuple[bytes, bytes]]] = [
    [],
    [(b"content-type", b"application/json"), (b"content-length", b"17"), (b"x-request-id", b"0190-abc")],
    [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), *LIMITS],
    [(b"content-length", b"0"), *LIMITS, (b"retry-after", b"7")],
    [(b"x-tab", b"a\tb"), (b"x-empty", b"")],  # a tab is allowed in a value
    [(b"x-case", b"Mixed Case \x80"), (b"content-length", b"3"), (b"content-length", b"17")],  # the first length counts
    [(b"x-bad", b"a\x7fb")],  # refused: DEL in a value
    [(b"x-at@", b"1")],  # refused: a separator in a name
    [(b"Content-Length", b"17")],  # a capital: uvicorn lowercases it
    [(b"set-cookie", b"a=1"), (b"set-cookie", b"b=2")],  # a repeated name
    [(b"connection", b"close"), (b"content-length", b"17")],
    [(b"connection", b"keep-alive, Upgrade")],
    [(b"transfer-encoding", b"chunked")],
    [(b"x-evil", b"a\r\nset-cookie: b=2")],  # refused: a line break in a value
    [(b"x evil", b"1")],  # refused: a space in a name
]


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


BODIES: list[list[tuple[bytes, bool]]] = [
    [(b"x" * 17, False)],
    [(b"", False)],
    [(b"data: 1\n\n", True), (b"data: 2\n\n", True), (b"", False)],
    [(b"", True), (b"x" * 17, False)],
]


def _cycle(
    transport: _Transport, method: str = "POST", keep_alive: bool = True, completed: list[bool] | None = None
) -> Any:
    return RequestResponseCycle(
        scope={"type": "http", "method": method},  # type: ignore[typeddict-item]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=None,  # type: ignore[arg-type]
        access_logger=None,  # type: ignore[arg-type]
        access_log=False,
        default_headers=DEFAULTS,
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: (completed if completed is not None else []).append(True),
    )


async def _run(
    held: bool,
    method: str,
    keep_alive: bool,
    status: int,
    headers: Any,
    bodies: Any,
    bulk: bool = False,
    made: bytes = b"",
) -> Any:
    transport = _Transport()
    completed: list[bool] = []
    cycle = _cycle(transport, method, keep_alive, completed)
    if held:
        hold_head(cycle)
    try:
        if not (bulk and write_head(cycle.send, status, headers, made)):
            head = [*headers, *header_pairs(made)]
            await cycle.send({"type": "http.response.start", "status": status, "headers": head})
        for body, more in bodies:
            await cycle.send({"type": "http.response.body", "body": body, "more_body": more})
    except RuntimeError as exc:
        cycle.transport.close()  # as uvicorn's run_asgi does when the application fails after its start
        return ("refused", str(exc), b"".join(transport.written), transport.closed), len(transport.written)
    state = (cycle.response_started, cycle.chunked_encoding, cycle.expected_content_length, cycle.keep_alive)
    written = (state, b"".join(transport.written), transport.closed, cycle.response_complete, completed)
    return written, len(transport.written)


CASES = list(itertools.product(("POST", "HEAD"), (True, False), (200, 204, 304, 429)))


@pytest.mark.parametrize(("method", "keep_alive", "status"), CASES)
async def test_every_answer_is_the_same_bytes_in_one_write_fewer(method: str, keep_alive: bool, status: int) -> None:
    for headers, bodies in itertools.product(HEADS, BODIES):
        for shape in (headers, [list(header) for header in headers]):  # ASGI allows lists for pairs
            expected, writes = await _run(False, method, keep_alive, status, shape, bodies)
            held, held_writes = await _run(True, method, keep_alive, status, shape, bodies)
            assert held == expected, (headers, bodies)
            assert held_writes == max(1, writes - 1) if writes else held_writes == 0, (headers, bodies, writes)
            for hold in (False, True):
                assert await _run(hold, method, keep_alive, status, shape, bodies, bulk=True) == (
                    (held, held_writes) if hold else (expected, writes)
                ), (headers, bodies, hold)


@pytest.mark.parametrize(("method", "keep_alive", "status"), CASES)
async def test_the_gateways_own_headers_are_written_after_the_head_as_uvicorn_would(
    method: str, keep_alive: bool, status: int
) -> None:
    # `made` (an API key's x-ratelimit-* headers) skips the byte checks, never the bytes: the same
    # wire and state as uvicorn's send of the head with them at its end, refused heads included
    for headers, bodies in itertools.product(HEADS, BODIES):
        for hold in (False, True):
            expected = await _run(hold, method, keep_alive, status, [*headers, *LIMITS], bodies)
            bulk = await _run(hold, method, keep_alive, status, headers, bodies, bulk=True, made=LIMITS_MADE)
            assert bulk == expected, (
                headers,
                bodies,
                hold,
            )


async def test_write_head_leaves_other_servers_and_second_heads_to_send() -> None:
    async def send(message: Any) -> None:
        raise AssertionError("not called")

    assert not write_head(send, 200, [(b"content-length", b"0")])  # not a uvicorn cycle's send
    cycle = _cycle(_Transport())
    assert write_head(cycle.send, 200, [(b"content-length", b"0")])
    assert not write_head(cycle.send, 200, [(b"content-length", b"0")])  # started already: uvicorn's to refuse


async def test_the_server_holds_each_head_for_its_body(gw: GatewayHandle) -> None:
    seen: list[type] = []
    original = GuardedHttpToolsProtocol.on_headers_complete

    def spy(self: GuardedHttpToolsProtocol) -> None:
        original(self)
        seen.append(type(self.cycle.transport))

    GuardedHttpToolsProtocol.on_headers_complete = spy  # type: ignore[method-assign]
    try:
        assert (await gw.client.get("/healthz")).status_code == 200
    finally:
        GuardedHttpToolsProtocol.on_headers_complete = original  # type: ignore[method-assign]
    assert seen == [HeldHead]


async def test_the_completion_doors_write_their_heads_in_bulk(
    gw: GatewayHandle, primary: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[bool] = []

    def spy(send: Any, status: int, headers: Any, made: bytes = b"") -> bool:
        done = write_head(send, status, headers, made)
        written.append(done)
        return done

    monkeypatch.setattr(asgi, "write_head", spy)
    # As `switchyard serve` runs (`access_log=False`): no handler on uvicorn's access logger. pytest
    # puts its capture handlers there, and uvicorn logs each response (its own `send`) when it has one.
    monkeypatch.setattr(logging.getLogger("uvicorn.access"), "handlers", [])
    message = {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}
    primary.enqueue(reply_json(200, {"id": "c1", "object": "chat.completion", "model": "m", "choices": [message]}))
    primary.enqueue(reply_sse([chunk({"content": "Hi"}), chunk({}, "stop")]))
    assert (await post(gw, {"model": "chat", "messages": [USER]})).status_code == 200
    streamed = await post(gw, {"model": "chat", "messages": [USER], "stream": True})
    assert streamed.status_code == 200
    assert streamed.headers["transfer-encoding"] == "chunked"
    assert written == [True, True]


def test_a_write_after_uvloops_transport_closed_is_dropped() -> None:
    """uvicorn closes a connection at the client's end of input (a half-close); until the loop runs
    `connection_lost`, which marks the cycle disconnected, the response may still write. uvloop's
    closed transport raises RuntimeError there (asyncio's ignores the write): it came out of a
    streamed response as "Exception in ASGI application" where a disconnect is a quiet cancel."""
    import uvloop

    async def main() -> None:
        server = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await asyncio.get_running_loop().create_connection(asyncio.Protocol, "127.0.0.1", port)
        held = HeldHead(transport, lambda: None)  # type: ignore[arg-type]
        held.write(b"HTTP/1.1 200 OK\r\n\r\n")  # the head, held
        held.write(b"data: 1\n\n")
        transport.close()
        await asyncio.sleep(0)  # the handle closes; the cycle would hear of it later
        held.write(b"data: 2\n\n")
        held.release()
        server.close()
        await server.wait_closed()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
