"""A client that goes away cancels its upstream request — JSON or streamed, before the first token
or after — and the ledger records what was used (api.md, cost.md)."""

from __future__ import annotations

import asyncio
import json
import socket
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import pytest

from app.edge import relay
from tests.gateway.conftest import primary_cost
from tests.support.gateway import GatewayHandle
from tests.support.observe import metric, rows_when, scrape
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse
from tests.support.waiting import wait_until

PROMPT = "x" * 400  # 400 characters: 100 tokens at four per token, plus 4 for the message
PROMPT_ESTIMATE = 104


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-c1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def body(*, stream: bool) -> dict[str, Any]:
    message = {"role": "user", "content": [{"kind": "text", "data": PROMPT}]}
    return {"model": "chat-1", "stream": stream, "messages": [message]}


async def post_raw(
    gw: GatewayHandle, payload: dict[str, Any], *, window: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client that sends its request and can then simply drop the connection; `window`: its
    socket's receive buffer (small: the client's pace is felt)."""
    url = urlsplit(gw.url)
    sock = socket.create_connection((url.hostname or "127.0.0.1", url.port or 80))
    if window is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)
    data = json.dumps(payload).encode()
    head = f"POST /api/v1/completions HTTP/1.1\r\nhost: {url.netloc}\r\ncontent-type: application/json\r\n"
    writer.write(head.encode() + b"content-length: %d\r\n\r\n" % len(data) + data)
    await writer.drain()
    return reader, writer


def estimated_usage(row: dict[str, Any]) -> tuple[Any, ...]:
    return (
        row["status"],
        row["usage_estimated"],
        row["input_tokens"],
        row["output_tokens"],
        row["reasoning_tokens"],
        row["cache_read_tokens"],
        row["cache_write_tokens"],
        row["cost_source"],
    )


async def test_a_json_client_that_disconnects_cancels_the_upstream_request(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "late"}, "finish_reason": "stop"}]}
    primary.enqueue(reply_json(200, answer, first_byte_delay_s=5.0))
    _, writer = await post_raw(gw, body(stream=False))
    await wait_until(lambda: len(primary.requests) == 1 and primary.open_connections == 1)
    writer.close()
    await wait_until(lambda: primary.open_connections == 0, within=1.0, what="the upstream request cancelled")
    (row,) = await rows_when(gw, 1)
    assert (row["streamed"], row["provider"], row["attempts"]) == (False, "primary", 1)
    # Nothing came back, so the gateway counts what it can: the prompt went upstream.
    assert estimated_usage(row) == ("cancelled", True, PROMPT_ESTIMATE, 0, 0, 0, 0, "estimated")
    assert Decimal(row["cost_usd"]) == primary_cost(PROMPT_ESTIMATE, 0) == Decimal("0.0000104")
    assert metric(await scrape(gw), "switchyard_attempts_total", provider="primary", outcome="cancelled") == 1


async def test_a_stream_cancelled_before_any_output_cancels_the_upstream_within_a_second(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """No ping has started the response yet (the keep-alive is 15 s): the client still sees
    nothing when it leaves, and the upstream is told at once."""
    primary.enqueue(reply_sse([chunk({"content": "late"}), chunk({}, "stop")], first_byte_delay_s=10.0))
    _, writer = await post_raw(gw, body(stream=True))
    await wait_until(lambda: len(primary.requests) == 1 and primary.open_connections == 1)
    writer.close()
    await wait_until(lambda: primary.open_connections == 0, within=1.0, what="the upstream request cancelled")
    (row,) = await rows_when(gw, 1)
    assert row["streamed"] == 1
    assert estimated_usage(row) == ("cancelled", True, PROMPT_ESTIMATE, 0, 0, 0, 0, "estimated")


async def test_a_cancelled_stream_without_upstream_usage_records_what_was_relayed(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    deltas = [
        chunk({"reasoning_content": "Think"}),
        chunk({"reasoning_content": "ing."}),
        chunk({"content": "One"}),
        chunk({"content": " two"}),
        chunk({"content": " three"}),
    ]
    primary.enqueue(reply_sse([*deltas, chunk({"content": " four"}), chunk({}, "stop")], stall_after=5))
    seen = 0
    async with gw.client.stream("POST", "/api/v1/completions", json=body(stream=True)) as response:
        async for line in response.aiter_lines():
            seen += '"type":"text_delta"' in line
            if seen == 3:
                break
    await wait_until(lambda: primary.open_connections == 0, within=1.0, what="the upstream request cancelled")
    (row,) = await rows_when(gw, 1)
    # One token per delta relayed (three text, two reasoning) and the prompt's estimate, priced
    # from the catalog and marked as the gateway's own count.
    assert estimated_usage(row) == ("cancelled", True, PROMPT_ESTIMATE, 3, 2, 0, 0, "estimated")
    expected = primary_cost(PROMPT_ESTIMATE, 3, reasoning=2)
    assert Decimal(row["cost_usd"]) == Decimal(row["estimated_cost_usd"]) == expected
    assert row["stop_reason"] is None
    samples = await scrape(gw)  # the attempt the client cut short is counted as such, once
    assert metric(samples, "switchyard_attempts_total", provider="primary", outcome="cancelled") == 1
    assert metric(samples, "switchyard_attempts_total", provider="primary", outcome="ok") is None


async def test_usage_the_upstream_reported_is_never_marked_estimated(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    usage = {"prompt_tokens": 7, "completion_tokens": 2}
    primary.enqueue(reply_sse([chunk({"content": "Hi"}), {**chunk({}, "stop"), "usage": usage}]))
    response = await gw.client.post("/api/v1/completions", json=body(stream=True))
    assert response.status_code == 200
    (row,) = await rows_when(gw, 1)
    assert estimated_usage(row) == ("ok", False, 7, 2, 0, 0, 0, "estimated")
    assert row["api"] == "unified"


async def _stalled_reader(gw: GatewayHandle) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A streaming request from a client with a small receive window, its head read; then it reads
    nothing."""
    reader, writer = await post_raw(gw, body(stream=True), window=4096)
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    return reader, writer


FLOOD = [chunk({"content": "x" * 1000}) for _ in range(20_000)] + [chunk({}, "stop")]  # 20 MB, at once


async def test_a_client_that_stops_reading_a_stream_holds_a_bounded_queue_then_ends_it(
    gw: GatewayHandle, primary: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client reads the head, then nothing, behind a fast upstream of 20 MB: the relay queued
    every frame (5 GB seen) and the request went on as `ok`. Now the pump waits once a
    megabyte is queued, so the upstream is read at the client's pace, and a client that takes
    nothing for `CLIENT_STALL_S` ends the request as `cancelled`, its upstream connection closed."""
    monkeypatch.setattr(relay, "CLIENT_STALL_S", 1.0)
    primary.enqueue(reply_sse(FLOOD))
    _reader, writer = await _stalled_reader(gw)
    try:
        (row,) = await rows_when(gw, 1)  # within wait_until's 2 s: the stall, then the row
        assert row["status"] == "cancelled"
        await wait_until(lambda: primary.open_connections == 0, what="the upstream connection closed")
    finally:
        writer.close()


async def test_a_client_gone_while_its_stream_waits_for_it_ends_the_request_at_once(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """The queue is full and the pump waits for the client; the client closes. The cancellation
    lands in that wait, not in the pipeline, which the relay then closes: the row says `cancelled`
    and the upstream connection is closed."""
    primary.enqueue(reply_sse(FLOOD))
    _reader, writer = await _stalled_reader(gw)
    await wait_until(lambda: len(primary.requests) == 1, what="the request upstream")
    await asyncio.sleep(0.5)  # the queue fills
    writer.close()
    (row,) = await rows_when(gw, 1)
    assert row["status"] == "cancelled"
    await wait_until(lambda: primary.open_connections == 0, what="the upstream connection closed")
