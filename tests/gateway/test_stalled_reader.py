"""A client that stops reading is disconnected after `relay.CLIENT_STALL_S`, for a stream and for
a whole answer alike (`app.edge.connection`'s write stall bound). Before, the relay ended a
stalled stream's request but its handler waited in uvicorn's `drain` for as long as the client
kept the socket open, and a whole answer had no stall bound at all: on `switchyard serve`, 20
stalled streams held +178 MB and their descriptors, 3 unread 50 MB answers +310 MB."""

from __future__ import annotations

import asyncio
import socket

import msgspec
import pytest

import app.edge.relay
from tests.gateway.conftest import CATALOG, providers_for
from tests.support.gateway import StartGateway
from tests.support.replies import chunk, usage_chunk
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse
from tests.support.waiting import wait_until

PIECE = "a" * 4096


def _whole_answer() -> dict[str, object]:
    return {
        "id": "chatcmpl-big",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": PIECE * 1024}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1024, "total_tokens": 1027},
    }


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_that_stopped_reading_is_disconnected(
    start_gateway: StartGateway,
    primary: ReplayUpstream,
    secondary: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> None:
    monkeypatch.setattr(app.edge.relay, "CLIENT_STALL_S", 0.5)
    gw = await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG)
    if stream:
        chunks = [chunk({"content": PIECE}) for _ in range(5000)]
        primary.enqueue(reply_sse([*chunks, chunk(finish="stop"), usage_chunk(3, 5000)]))
    else:
        primary.enqueue(reply_json(200, _whole_answer()))  # 4 MiB
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    payload = b'{"model":"chat-1","stream":%s,"messages":[{"role":"user","content":[{"kind":"text","data":"hi"}]}]}' % (
        b"true" if stream else b"false"
    )
    writer.write(
        b"POST /api/v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    await writer.drain()
    assert (await reader.read(12)).startswith(b"HTTP/1.1 200")
    writer.transport.pause_reading()  # the client stops reading and keeps the socket open
    try:
        await wait_until(lambda: not gw.server.server_state.connections, within=8.0, what="the connection closed")
        rows = await gw.ledger_rows()
        assert [row["status"] for row in rows] == (["cancelled"] if stream else ["ok"])
    finally:
        writer.transport.abort()


async def test_a_slow_client_that_keeps_reading_is_served_whole(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slower than the answer is not stopped: a client taking 32 KiB every 0.1 s keeps its
    connection for four stall bounds, and gets the whole answer; the bound is for a client that
    takes nothing. (What it took shows in the socket's send queue, `app.edge.unsent`, in steps of
    the window it reopens: on loopback about 64 KiB.)"""
    monkeypatch.setattr(app.edge.relay, "CLIENT_STALL_S", 1.0)
    gw = await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG)
    primary.enqueue(reply_json(200, _whole_answer()))  # 4 MiB: more than the kernel's buffers hold
    host, port = gw.url.removeprefix("http://").split(":")
    loop = asyncio.get_running_loop()
    client = socket.create_connection((host, int(port)))
    client.setblocking(False)
    payload = b'{"model":"chat-1","messages":[{"role":"user","content":[{"kind":"text","data":"hi"}]}]}'
    await loop.sock_sendall(
        client,
        b"POST /api/v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(payload), payload),
    )
    try:
        received = bytearray()
        for _ in range(40):  # 4 s: four stall bounds
            received += await loop.sock_recv(client, 32768)
            await asyncio.sleep(0.1)
        assert gw.server.server_state.connections, "a client still reading was disconnected"
        head, _, rest = bytes(received).partition(b"\r\n\r\n")
        length = next(int(line[15:]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
        body = bytearray(rest)
        while len(body) < length:
            body += await loop.sock_recv(client, 1 << 20)
        assert msgspec.json.decode(body)["message"]["content"] == [{"kind": "text", "data": PIECE * 1024}]
    finally:
        client.close()
