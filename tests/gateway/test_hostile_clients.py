"""Slow and hostile clients on raw sockets: no connection outlives its deadline, and every one that
had started a request gets a clean 4xx before the close (408 for time, 431 for header size).

The gateway runs with half-second head and body deadlines and small header limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import time

import msgspec
import pytest

import app.edge.connection
from tests.gateway.conftest import CATALOG, providers_for
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.logs import Logs
from tests.support.upstream import ReplayUpstream, reply_json

TIMEOUT = 0.5
SLACK = 2.0  # a loaded test machine
LIMITS = {"header_timeout_s": TIMEOUT, "body_timeout_s": TIMEOUT, "max_header_bytes": 4096, "max_headers": 20}
BODY = msgspec.json.encode({"messages": [{"role": "user", "content": [{"kind": "text", "data": "hi"}]}]})
HEAD = b"POST /api/v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"


@pytest.fixture
async def guarded(start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream) -> GatewayHandle:
    return await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG, server=LIMITS)


class Answer(msgspec.Struct):
    status: int | None  # None: closed without a response
    headers: dict[str, str]
    body: bytes
    closed_after: float  # seconds from the start of the exchange to EOF


async def exchange(gw: GatewayHandle, *parts: bytes, pause: float = 0.0) -> Answer:
    """Send `parts` (pausing between them), then read until the server closes."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    started = time.monotonic()
    try:
        for part in parts:
            if reader.at_eof() or writer.is_closing():
                break  # the server has answered and closed: a hostile client would go on writing
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(pause)
        data = await asyncio.wait_for(reader.read(), TIMEOUT + SLACK + 2)  # until EOF
    except ConnectionResetError:  # written to after the server's close: the answer may be lost
        data = b""
    finally:
        writer.close()
    return parse(data, time.monotonic() - started)


def parse(data: bytes, closed_after: float) -> Answer:
    if not data:
        return Answer(None, {}, b"", closed_after)
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return Answer(int(status_line.split()[1]), headers, body, closed_after)


def assert_refused(answer: Answer, status: int) -> None:
    assert answer.status == status, answer
    assert answer.headers["connection"] == "close"
    assert answer.headers["content-type"] == "application/json"
    error = msgspec.json.decode(answer.body)["error"]
    assert (error["code"], error["request_id"]) == (status, answer.headers["x-request-id"])
    assert answer.closed_after < TIMEOUT + SLACK


async def test_a_silent_connection_is_closed_at_the_head_deadline(guarded: GatewayHandle) -> None:
    answer = await exchange(guarded)
    assert answer.status is None
    assert TIMEOUT * 0.9 <= answer.closed_after < TIMEOUT + SLACK


async def test_half_a_head_gets_408(guarded: GatewayHandle) -> None:
    answer = await exchange(guarded, HEAD[:40])
    assert_refused(answer, 408)
    assert answer.closed_after >= TIMEOUT * 0.9


async def test_a_trickled_head_is_closed_at_the_deadline_not_per_byte(guarded: GatewayHandle) -> None:
    answer = await exchange(guarded, *[bytes([byte]) for byte in HEAD[:60]], pause=0.05)  # 3 s of trickle
    assert answer.status in (408, None)  # None: the trickle reached the closed socket, which reset
    assert answer.closed_after < TIMEOUT + SLACK


async def test_half_a_body_gets_408(guarded: GatewayHandle, primary: ReplayUpstream) -> None:
    head = HEAD + b"content-length: %d\r\n\r\n" % len(BODY)
    for partial in (head, head + BODY[:10]):  # no body byte at all; part of it
        answer = await exchange(guarded, partial)
        assert_refused(answer, 408)
        assert answer.closed_after >= TIMEOUT * 0.9
    assert primary.requests == []


async def test_a_second_request_on_a_kept_alive_connection_has_its_own_head_deadline(guarded: GatewayHandle) -> None:
    health = b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n"
    answer = await exchange(guarded, health, b"GET /heal", pause=0.1)
    assert answer.status == 200  # the first response; the 408 for the second follows it
    assert answer.body.count(b"HTTP/1.1 408 Request Timeout\r\n") == 1
    assert answer.closed_after < TIMEOUT + SLACK


async def test_too_many_headers_get_431(guarded: GatewayHandle) -> None:
    headers = b"".join(b"x-h%d: v\r\n" % i for i in range(21))
    assert_refused(await exchange(guarded, HEAD + headers + b"\r\n"), 431)


async def test_a_header_line_that_never_ends_gets_431(guarded: GatewayHandle) -> None:
    answer = await exchange(guarded, HEAD + b"x-big: ", *[b"v" * 1000] * 6, pause=0.01)
    assert_refused(answer, 431)
    assert answer.closed_after < TIMEOUT  # refused for its size, not its time


async def test_a_head_sent_in_pieces_is_measured_whole(guarded: GatewayHandle) -> None:
    pieces = (HEAD + b"x-a: " + b"v" * 2100 + b"\r\n", b"x-b: " + b"v" * 2100 + b"\r\n", b"\r\n")
    assert_refused(await exchange(guarded, *pieces, pause=0.05), 431)


async def test_a_request_line_too_long_gets_431(guarded: GatewayHandle) -> None:
    assert_refused(await exchange(guarded, b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n"), 431)


async def test_hundreds_of_stalled_bodies_are_all_closed(guarded: GatewayHandle) -> None:
    head = HEAD + b"content-length: %d\r\n\r\n" % len(BODY)
    answers = await asyncio.gather(*[exchange(guarded, head + BODY[:5]) for _ in range(200)])
    assert {answer.status for answer in answers} == {408}
    assert max(answer.closed_after for answer in answers) < TIMEOUT + SLACK + 2


async def test_a_body_in_pieces_within_the_deadline_is_served(guarded: GatewayHandle, primary: ReplayUpstream) -> None:
    reply = {"id": "x", "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}]}
    primary.enqueue(reply_json(200, reply))
    head = HEAD + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(BODY)
    answer = await exchange(guarded, head, BODY[:10], BODY[10:], pause=0.1)
    assert answer.status == 200, answer
    assert msgspec.json.decode(answer.body)["message"]["content"] == [{"kind": "text", "data": "ok"}]


@pytest.mark.parametrize("keep_alive", [None, 1.5])
async def test_an_idle_kept_alive_connection_is_closed_at_the_keep_alive_timeout(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream, keep_alive: float | None
) -> None:
    """`[server] keep_alive_s` (5 s by default, uvicorn's), armed after each response on a coarse
    timer. Behind a load balancer it must exceed the balancer's idle timeout (config.example.toml):
    there was no setting for it."""
    server = LIMITS if keep_alive is None else {**LIMITS, "keep_alive_s": keep_alive}
    guarded = await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG, server=server)
    keep_alive = 5.0 if keep_alive is None else keep_alive
    host, port = guarded.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for _ in range(2):  # the timer is re-armed after every response and cancelled by the next request
            writer.write(b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            length = int(parse(head, 0.0).headers["content-length"])
            await reader.readexactly(length)
            answered = time.monotonic()
            await asyncio.sleep(keep_alive / 2)
        rest = await asyncio.wait_for(reader.read(), keep_alive + SLACK)
        closed_after = time.monotonic() - answered
    finally:
        writer.close()
    assert rest == b""
    assert keep_alive * 0.99 <= closed_after < keep_alive + SLACK


async def test_expect_100_continue_is_answered_before_the_body(guarded: GatewayHandle, primary: ReplayUpstream) -> None:
    """curl sends `Expect: 100-continue` for bodies over 1 MiB and waits a second for the answer;
    the `100 Continue` uvicorn writes was held in front of the response's head, so it never came."""
    reply = {"id": "x", "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}]}
    primary.enqueue(reply_json(200, reply))
    host, port = guarded.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(HEAD + b"expect: 100-continue\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(BODY))
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(BODY)
        answer = parse(await asyncio.wait_for(reader.read(), TIMEOUT + SLACK), 0.0)
    finally:
        writer.close()
    assert answer.status == 200, answer


async def test_expect_100_continue_for_a_body_over_the_limit_gets_413_at_once(guarded: GatewayHandle) -> None:
    limit = guarded.service.settings.server.max_body_bytes
    head = HEAD + b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % (limit + 1)
    answer = await exchange(guarded, head)
    assert_refused(answer, 413)
    assert (
        msgspec.json.decode(answer.body)["error"]["message"] == f"request body too large (the limit is {limit} bytes)"
    )
    assert answer.closed_after < TIMEOUT  # not the body deadline: nothing was waited for


async def test_a_declared_body_over_the_limit_gets_413_once_a_piece_of_it_is_in(guarded: GatewayHandle) -> None:
    """Without `Expect`: a client that announces more than the limit and sends a few bytes gets its
    413 at once, not a 408 at the body deadline."""
    limit = guarded.service.settings.server.max_body_bytes
    answer = await exchange(guarded, HEAD + b"content-length: %d\r\n\r\n" % (limit + 1) + BODY[:10])
    assert (answer.status, answer.body.count(b"HTTP/1.1")) == (413, 0), answer  # one answer, no 408 after it
    assert (
        msgspec.json.decode(answer.body)["error"]["message"] == f"request body too large (the limit is {limit} bytes)"
    )


async def test_a_body_over_the_limit_still_being_sent_gets_its_413(guarded: GatewayHandle) -> None:
    """The early 413 keeps reading (and dropping) the body: a client that writes it all before
    reading gets the answer, not a connection reset, and the connection serves on."""
    limit = guarded.service.settings.server.max_body_bytes
    response = await guarded.client.post(
        "/api/v1/completions", content=b"x" * (limit + 4 * 1024 * 1024), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert "connection" not in response.headers
    again = await guarded.client.get("/api/v1/models")
    assert again.status_code == 200


async def test_the_rest_of_a_body_already_refused_is_dropped_for_a_short_while_only(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The early 413 keeps reading the body it refused; a client that declared 100 GB and keeps
    writing is cut at `DRAIN_S`, not at the body deadline (60 s by default)."""
    monkeypatch.setattr(app.edge.connection, "DRAIN_S", 0.5)
    gw = await start_gateway(
        providers=providers_for(primary, secondary), catalog=CATALOG, server={**LIMITS, "body_timeout_s": 30.0}
    )
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    started = time.monotonic()
    try:
        writer.write(HEAD + b"content-length: %d\r\n\r\n" % 10**11 + b"x" * 65536)
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), SLACK)
        assert answer.startswith(b"HTTP/1.1 413 "), answer
        with contextlib.suppress(ConnectionError):
            while time.monotonic() - started < 10:
                writer.write(b"x" * 65536)
                await writer.drain()
                await asyncio.sleep(0.01)
        closed_after = time.monotonic() - started
    finally:
        writer.close()
    assert closed_after < 0.5 + SLACK


async def test_the_anthropic_door_refuses_a_head_in_its_own_shape(guarded: GatewayHandle) -> None:
    """Errors under `/v1/messages` are Anthropic's (ingress.md), those written before the app too."""
    head = b"POST /v1/messages?beta=true HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
    for parts, status, kind in (
        ([head + b"".join(b"x-h%d: v\r\n" % i for i in range(21)) + b"\r\n"], 431, "invalid_request_error"),
        ([head + b"content-length: %d\r\n\r\n" % len(BODY)], 408, "invalid_request_error"),
    ):
        answer = await exchange(guarded, *parts)
        assert (answer.status, answer.headers["connection"]) == (status, "close")
        body = msgspec.json.decode(answer.body)
        assert body == {
            "type": "error",
            "error": {"type": kind, "message": body["error"]["message"]},
            "request_id": answer.headers["x-request-id"],
        }
        assert answer.headers["request-id"] == answer.headers["x-request-id"]


async def test_a_head_httptools_cannot_parse_gets_the_json_error(guarded: GatewayHandle) -> None:
    """A key read from a file with a Windows line ending (`Bearer $(cat key)`) puts a CR in the
    header: uvicorn answered `Invalid HTTP request received.` in plain text."""
    for head in (HEAD, b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\n"):
        answer = await exchange(guarded, head + b"authorization: Bearer sy-abc\r\r\n\r\n")
        assert (answer.status, answer.headers["content-type"]) == (400, "application/json"), answer
        body = msgspec.json.decode(answer.body)
        assert body["error"]["message"].startswith("malformed HTTP request")
        assert ("type" in body) == head.startswith(b"POST /v1/messages")  # Anthropic's shape on its door


@pytest.mark.parametrize("size", [b"zz", b"-5", b"ffffffffffffffffff"])
async def test_a_chunked_body_whose_framing_breaks_gets_the_json_error(
    guarded: GatewayHandle, primary: ReplayUpstream, size: bytes
) -> None:
    """The head was read (the application waits for the body), then a chunk size is not one: the
    client got no answer at all, only the close."""
    chunked = HEAD + b"transfer-encoding: chunked\r\n\r\n"
    answer = await exchange(guarded, chunked + size + b"\r\n{}\r\n0\r\n\r\n")
    assert_refused(answer, 400)
    assert msgspec.json.decode(answer.body)["error"]["message"] == (
        "malformed HTTP request: its chunked body breaks HTTP's rules"
    )
    assert primary.requests == []
    primary.enqueue(reply_json(200, {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}))
    framed = HEAD + b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n%x\r\n" % len(BODY)
    served = await exchange(guarded, framed + BODY + b"\r\n0\r\n\r\n")
    assert served.status == 200, served  # a well-framed chunked body is read as before


def responses(data: bytes) -> list[Answer]:
    """Each response in `data`, in order (each framed by its `content-length`)."""
    answers = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(parse(head + b"\r\n\r\n", 0.0).headers["content-length"])
        answers.append(parse(head + b"\r\n\r\n" + rest[:length], 0.0))
        data = rest[length:]
    return answers


async def pipelined(gw: GatewayHandle, *parts: bytes, pause: float = 0.0) -> list[Answer]:
    """Send `parts` on one connection and read every response until the server closes."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(pause)
        return responses(await asyncio.wait_for(reader.read(), TIMEOUT + SLACK + 2))
    finally:
        writer.close()


OK_REPLY = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
FIRST = HEAD + b"content-length: %d\r\n\r\n" % len(BODY) + BODY


def assert_answered_ok(answer: Answer) -> None:
    assert answer.status == 200, answer
    assert msgspec.json.decode(answer.body)["message"]["content"] == [{"kind": "text", "data": "ok"}]


@pytest.mark.parametrize(
    "broken",
    [
        HEAD + b"transfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",  # its chunks break
        b"POST /api/v1/completions HTTP/1.1\r\nhost: gw\r\nx-bad: a\x00b\r\n\r\n",  # its head breaks
    ],
)
async def test_a_pipelined_request_that_breaks_is_answered_after_the_earlier_one(
    guarded: GatewayHandle, primary: ReplayUpstream, broken: bytes
) -> None:
    """The earlier request's answer (its upstream call was made and billed) comes first, then the
    400 for the broken one, then the close. The 400 used to be withheld and the connection closed
    at once, which lost the earlier answer too: written first, the client would have paired the 400
    with its first request."""
    primary.enqueue(reply_json(200, OK_REPLY, first_byte_delay_s=0.3))
    first, refused = await pipelined(guarded, FIRST + broken)
    assert_answered_ok(first)
    assert (refused.status, refused.headers["connection"]) == (400, "close"), refused
    assert msgspec.json.decode(refused.body)["error"]["message"].startswith("malformed HTTP request")
    assert len(primary.requests) == 1


async def test_a_pipelined_body_is_timed_from_when_its_request_is_read(
    guarded: GatewayHandle, primary: ReplayUpstream
) -> None:
    """The connection reads nothing more while an earlier response is being sent (uvicorn pauses
    it), so the body of a request queued behind a slow one arrives after that one's answer. Its body
    deadline (0.5 s here) used to run from its head, while nothing was read: a 408, which closed the
    connection and lost the first answer as well."""
    primary.enqueue(reply_json(200, OK_REPLY, first_byte_delay_s=3 * TIMEOUT))
    primary.enqueue(reply_json(200, OK_REPLY))
    second = HEAD + b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(BODY)
    # The second head comes once the first request's body was read: uvicorn then pauses reading.
    answers = await pipelined(guarded, FIRST, second + BODY[:10], BODY[10:], pause=0.2)
    assert [answer.status for answer in answers] == [200, 200], answers
    for answer in answers:
        assert_answered_ok(answer)


async def test_a_pipelined_body_gets_its_whole_deadline_once_the_earlier_answer_is_sent(
    guarded: GatewayHandle, primary: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the first answer completed, the queued request's unread body got the drain meant for
    an answered request's own body (`DRAIN_S`, 5 s against a default deadline of 60 s): a 408."""
    monkeypatch.setattr(app.edge.connection, "DRAIN_S", 0.1)
    primary.enqueue(reply_json(200, OK_REPLY, first_byte_delay_s=0.7))
    primary.enqueue(reply_json(200, OK_REPLY))
    second = HEAD + b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(BODY)
    # at 0, 0.5 and 1.0 s: the rest of the second body 0.3 s after the first answer (0.7 s)
    answers = await pipelined(guarded, FIRST, second + BODY[:10], BODY[10:], pause=0.5)
    assert [answer.status for answer in answers] == [200, 200], answers


@pytest.mark.parametrize("codings", [b"gzip, chunked", b"deflate,chunked", b"br, chunked"])
async def test_a_compressed_transfer_coding_is_a_415_naming_it(guarded: GatewayHandle, codings: bytes) -> None:
    """As `content-encoding: gzip` is: the body was read as JSON, "not valid JSON" at byte 0."""
    packed = gzip.compress(BODY)
    head = HEAD + b"transfer-encoding: %s\r\nconnection: close\r\n\r\n%x\r\n" % (codings, len(packed))
    answer = await exchange(guarded, head + packed + b"\r\n0\r\n\r\n")
    assert_refused(answer, 415)
    message = msgspec.json.decode(answer.body)["error"]["message"]
    assert message == f"transfer-encoding '{codings.decode()}' is not supported: send the body uncompressed"


async def test_what_the_connection_refuses_is_logged_with_the_id_the_client_got(
    logs: Logs, start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    """A 431, a 413 at `Expect` and a 408 are written by the connection, not the app: the client
    got an `x-request-id` that no log line had."""
    guarded = await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG, server=LIMITS)
    limit = guarded.service.settings.server.max_body_bytes
    too_many = HEAD + b"".join(b"x-h%d: v\r\n" % i for i in range(21)) + b"\r\n"
    expect = HEAD + b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % (limit + 1)
    secret_path = b"POST /api/v1/keys/sy-secret/x HTTP/1.1\r\nhost: gw\r\n"  # half a head: 408
    admin_path = b"POST /v1/the-admin-secret HTTP/1.1\r\nhost: gw\r\n"  # a secret of any shape
    answers = [await exchange(guarded, head) for head in (too_many, expect, secret_path, admin_path)]
    assert [answer.status for answer in answers] == [431, 413, 408, 408]
    assert guarded.service.log_writer is not None
    guarded.service.log_writer.flush()
    refused = {line["request_id"]: line for line in logs.lines("request", guarded)}
    seen = [refused[answer.headers["x-request-id"]] for answer in answers]
    assert [(line["path"], line["status"], line["error_status"], line["error_type"]) for line in seen] == [
        ("/api/v1/completions", "rejected", 431, "invalid_request_error"),
        ("/api/v1/completions", "rejected", 413, "invalid_request_error"),
        ("/api/v1/keys/…", "rejected", 408, "invalid_request_error"),  # a secret in a path is not written
        ("/v1/…", "rejected", 408, "invalid_request_error"),  # only the words of the gateway's routes
    ]
