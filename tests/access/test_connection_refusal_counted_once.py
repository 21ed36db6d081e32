"""rev2 review: a body the connection refuses on a route Litestar reads (not a completion door)."""

from __future__ import annotations

import asyncio

import pytest

from tests.access.conftest import ADMIN, keyed_gateway
from tests.support.gateway import StartGateway
from tests.support.logs import Logs
from tests.support.observe import scrape
from tests.support.upstream import ReplayUpstream


async def test_a_body_the_connection_refuses_on_an_admin_route_is_counted_once(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, logs: Logs
) -> None:
    gw = await keyed_gateway(start_gateway, up, monkeypatch, server={"body_timeout_s": 0.5})
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = b"POST /api/v1/keys HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
    head += b"authorization: Bearer %s\r\ntransfer-encoding: chunked\r\n\r\n" % ADMIN.encode()
    writer.write(head + b"1\r\n{\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert data.startswith(b"HTTP/1.1 408"), data
    await asyncio.sleep(0.3)
    samples = await scrape(gw)
    codes = {dict(labels)["code"]: v for (name, labels), v in samples.items() if name == "switchyard_responses_total"}
    assert gw.service.log_writer is not None
    gw.service.log_writer.flush()
    assert codes == {"408": 1}  # was {"408": 1, "500": 1}: the app's "client disconnected" counted too
    assert [(line["status"], line["error_status"]) for line in logs.lines("request", gw)] == [("rejected", 408)]
    assert logs.lines("unhandled_exception", gw) == []  # nor a traceback for a client the connection answered
