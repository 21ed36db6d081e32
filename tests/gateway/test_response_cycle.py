"""The held head (`app.edge.cycle.HeldHead`, as `hold_head` wires it) against uvicorn's own `RequestResponseCycle` as
the oracle: for every head — statuses with and without a body, HEAD requests, keep-alive or not,
with and without a content length, eleven `x-ratelimit-*` headers, heads uvicorn lowercases,
refuses or handles specially (`connection`, `transfer-encoding`) — and every body sequence (one
body, an empty one, a chunked stream), both put the same bytes on the wire, end in the same state
and refuse the same heads with the same error; the held cycle in one write fewer whenever a body
message follows the head. And the server really uses it: its connections' cycles write to
a `HeldHead`."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from app.edge.connection import GuardedHttpToolsProtocol
from app.edge.cycle import HeldHead, hold_head
from tests.support.gateway import GatewayHandle

DEFAULTS = [(b"date", b"Tue, 01 Dec 2026 19:00:00 GMT"), (b"server", b"uvicorn")]
LIMITS = [
    (b"x-ratelimit-limit-requests", b"600"),
    (b"x-ratelimit-remaining-requests", b"599"),
    (b"x-ratelimit-reset-requests", b"100ms"),
    (b"x-ratelimit-limit-tokens", b"200000"),
    (b"x-ratelimit-remaining-tokens", b"199000"),
    (b"x-ratelimit-reset-tokens", b"6m0s"),
]
HEADS: list[list[tuple[bytes, bytes]]] = [
    [],
    [(b"content-type", b"application/json"), (b"content-length", b"17"), (b"x-request-id", b"0190-abc")],
    [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), *LIMITS],
    [(b"content-length", b"0"), *LIMITS, (b"retry-after", b"7")],
    [(b"x-tab", b"a\tb"), (b"x-empty", b"")],  # a tab is allowed in a value
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


async def _run(held: bool, method: str, keep_alive: bool, status: int, headers: Any, bodies: Any) -> Any:
    transport = _Transport()
    completed: list[bool] = []
    cycle = RequestResponseCycle(
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
        on_response=lambda: completed.append(True),
    )
    if held:
        hold_head(cycle)
    try:
        await cycle.send({"type": "http.response.start", "status": status, "headers": headers})
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
