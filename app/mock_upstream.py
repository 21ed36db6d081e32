"""A scripted OpenAI-compatible upstream (`switchyard mock-upstream`) and the HTTP server under it.

Two layers in one module, because the second is the only reason the first exists:

- `MockUpstreamServer`: a minimal HTTP/1.1 server on a bare `asyncio.Protocol` (keep-alive,
  Content-Length and chunked request bodies, pipelined requests answered in order). It asks a
  `Responder` for a `Reply` per request and plays it back, including faults: a delay before the
  first byte, slow chunks, a TCP reset after N chunks (`SO_LINGER` 0, then `abort()`), or a stall
  after N chunks that holds the connection until the client goes away. The tests' replay server
  (`tests/upstream.py`) is this same server with a queue-driven responder.
- `ScriptedResponder`: chat/text completions, `/models`, `/health` and vLLM-style `/metrics`, with
  fixed latency, chunking, reasoning, a tool call and injected failures. For one model and endpoint
  every byte of the reply is built once; per request only the usage (prompt tokens are estimated
  from the request body's size) is encoded and spliced in.

No framework: it has to answer many times faster than the gateway it stands behind, so the hot
path (a reply with no delays) is written synchronously from `data_received`, without a task.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import http
import importlib
import re
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, cast

import msgspec
from msgspec import UNSET, Struct, UnsetType

_MAX_HEAD = 64 * 1024
_SERVER_OWNED = frozenset({"content-length", "transfer-encoding", "connection"})


class ReceivedRequest(Struct):
    method: str
    path: str  # the request target as sent, query string included
    headers: dict[str, str]  # names lowercased
    body: bytes

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


class Reply(Struct):
    """What to send for one request. Head and first chunk leave together, so a reset or stall
    after 0 chunks happens before the status line; an empty chunk sends just the head."""

    status: int = 200
    headers: list[tuple[str, str]] = []
    chunks: list[bytes] = []
    chunk_delay_s: float = 0.0
    first_byte_delay_s: float = 0.0
    reset_after: int | None = None
    stall_after: int | None = None
    chunked: bool = False  # Transfer-Encoding: chunked, else Content-Length


class Responder(Protocol):
    def respond(self, request: ReceivedRequest) -> Reply: ...


class _BadRequest(Exception):
    pass


# --- HTTP/1.1 framing ---------------------------------------------------------------------------


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    body = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
        pos = eol + 2
        if size == 0:
            end = buf.find(b"\r\n\r\n", pos - 2)
            return None if end < 0 else (bytes(body), end + 4)
        if len(buf) < pos + size + 2:
            return None
        body += buf[pos : pos + size]
        pos += size + 2


def _take_request(buf: bytearray) -> tuple[ReceivedRequest, bool] | None:
    """Cut one complete request off the front of `buf`: (request, keep_alive), or None if partial."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > _MAX_HEAD:
            raise _BadRequest("request head too large")
        return None
    request_line, *lines = buf[:end].decode("latin-1").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3:
        raise _BadRequest("malformed request line")
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest("malformed header line")
        headers[name.strip().lower()] = value.strip()
    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parsed = _dechunk(buf, end + 4)
            if parsed is None:
                return None
            body, stop = parsed
        else:
            stop = end + 4 + int(headers.get("content-length", "0"))
            if len(buf) < stop:
                return None
            body = bytes(buf[end + 4 : stop])
    except ValueError as exc:
        raise _BadRequest("malformed body framing") from exc
    del buf[:stop]
    connection = headers.get("connection", "").lower()
    keep_alive = "keep-alive" in connection if parts[2] == "HTTP/1.0" else "close" not in connection
    return ReceivedRequest(parts[0], parts[1], headers, body), keep_alive


@functools.lru_cache(maxsize=128)
def _status_line(status: int) -> str:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n"


def _encode_head(reply: Reply) -> bytes:
    lines = [_status_line(reply.status)]
    lines += [f"{k}: {v}\r\n" for k, v in reply.headers if k.lower() not in _SERVER_OWNED]
    if reply.chunked:
        lines.append("transfer-encoding: chunked\r\n\r\n")
    else:
        lines.append(f"content-length: {sum(map(len, reply.chunks))}\r\n\r\n")
    return "".join(lines).encode("latin-1")


def _frame(chunk: bytes, chunked: bool) -> bytes:
    return b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked and chunk else chunk


def _ending(reply: Reply) -> tuple[int, Literal["reset", "stall", "end"]]:
    """How many chunks go out, and what happens then (a reset or stall wins a tie with the end)."""
    ends: list[tuple[int, Literal["reset", "stall", "end"]]] = []
    if reply.reset_after is not None:
        ends.append((reply.reset_after, "reset"))
    if reply.stall_after is not None:
        ends.append((reply.stall_after, "stall"))
    ends.append((len(reply.chunks), "end"))
    return min(ends, key=lambda item: item[0])


def _is_immediate(reply: Reply) -> bool:
    return (
        not reply.first_byte_delay_s
        and (not reply.chunk_delay_s or len(reply.chunks) < 2)
        and reply.reset_after is None
        and reply.stall_after is None
    )


def _encode_whole(reply: Reply) -> bytes:
    frames = [_frame(chunk, reply.chunked) for chunk in reply.chunks]
    tail = b"0\r\n\r\n" if reply.chunked else b""
    return b"".join([_encode_head(reply), *frames, tail])


def _error_reply(status: int, message: str, headers: Sequence[tuple[str, str]] = ()) -> Reply:
    kind = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error"}
    error = {"message": message, "type": kind.get(status, "upstream_error"), "code": status}
    body = msgspec.json.encode({"error": error})
    return Reply(status, [("content-type", "application/json"), *headers], [body])


# --- the server ---------------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    def __init__(self, server: MockUpstreamServer) -> None:
        self._server = server
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._server._opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._lost(self)
        self._writable.set()
        if self._task is not None:
            self._task.cancel()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._task is None:
            self._serve_buffered()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _serve_buffered(self) -> None:
        transport = self._transport
        assert transport is not None
        while self._task is None and not transport.is_closing():
            try:
                parsed = _take_request(self._buffer)
            except _BadRequest as exc:
                transport.write(_encode_whole(_error_reply(400, str(exc))))
                transport.close()
                return
            if parsed is None:
                return
            request, keep_alive = parsed
            reply = self._server.reply_for(request)
            if not _is_immediate(reply):
                self._task = asyncio.get_running_loop().create_task(self._play(reply, keep_alive))
                return
            transport.write(_encode_whole(reply))
            if not keep_alive:
                transport.close()

    async def _play(self, reply: Reply, keep_alive: bool) -> None:
        transport = self._transport
        assert transport is not None
        self._server._count_streams(1)
        try:
            if reply.first_byte_delay_s:
                await asyncio.sleep(reply.first_byte_delay_s)
            count, then = _ending(reply)
            pending = _encode_head(reply)
            for index in range(count):
                if index and reply.chunk_delay_s:
                    await asyncio.sleep(reply.chunk_delay_s)
                transport.write(pending + _frame(reply.chunks[index], reply.chunked))
                pending = b""
                await self._writable.wait()
            if then == "reset":
                await self._reset(transport)
                return
            if then == "stall":
                await asyncio.get_running_loop().create_future()
            transport.write(pending + (b"0\r\n\r\n" if reply.chunked else b""))
        finally:
            self._server._count_streams(-1)
        self._task = None
        if not keep_alive:
            transport.close()
        elif self._buffer:
            self._serve_buffered()

    async def _reset(self, transport: asyncio.Transport) -> None:
        """Flush what was written (the client should see those chunks), then close with RST."""
        transport.set_write_buffer_limits(high=0, low=0)  # paused until the buffer is empty
        await self._writable.wait()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()


class MockUpstreamServer:
    """Serves `responder`'s replies on loopback; `port=0` picks a free port."""

    def __init__(self, responder: Responder, host: str = "127.0.0.1", port: int = 0) -> None:
        self.responder = responder
        self.host = host
        self.port = port
        self.active_streams = 0  # replies still being written by a task (delayed, slow, stalled)
        self._connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), self.host, self.port, backlog=1024, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for connection in list(self._connections):
            connection.abort()
        await self._server.wait_closed()
        async with asyncio.timeout(5):
            await self.wait_idle()
        self._server = None

    async def wait_idle(self) -> None:
        """Wait until no connection is open and no reply is being written (wrap it in a timeout)."""
        await self._idle.wait()

    def _opened(self, connection: _Connection) -> None:
        self._connections.add(connection)
        self._idle.clear()

    def _lost(self, connection: _Connection) -> None:
        self._connections.discard(connection)
        self._count_streams(0)

    def _count_streams(self, change: int) -> None:
        self.active_streams += change
        if self._connections or self.active_streams:
            self._idle.clear()
        else:
            self._idle.set()

    async def __aenter__(self) -> MockUpstreamServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def reply_for(self, request: ReceivedRequest) -> Reply:
        try:
            return self.responder.respond(request)
        except Exception as exc:  # a broken responder answers 500 instead of hanging the client
            return _error_reply(500, f"mock responder failed: {exc!r}")


# --- the scripted OpenAI-compatible responder ---------------------------------------------------

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog."
REASONING_TEXT = "Let me think about this step by step."
TOOL_ARGUMENTS = '{"city": "Ljubljana", "unit": "celsius"}'


class ScriptedOptions(Struct, frozen=True):
    model: str = "mock-model"
    latency_ms: float = 0.0
    chunk_delay_ms: float = 0.0
    chunks: int = 64
    tokens_per_chunk: int = 1
    text: str = DEFAULT_TEXT
    reasoning_chunks: int = 0
    tool_call: str | None = None  # a function name: the reply ends with one call to it
    fail_status: int | None = None
    fail_every: int = 1
    retry_after: int | None = None
    reset_after: int | None = None
    metrics_waiting: int = 0


class _Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: _CompletionDetails | UnsetType = UNSET


class _CompletionDetails(Struct):
    reasoning_tokens: int


class _Function(Struct, kw_only=True):
    name: str | UnsetType = UNSET
    arguments: str


class _ToolCall(Struct, kw_only=True):
    index: int | UnsetType = UNSET
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET
    function: _Function


class _Delta(Struct):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[_ToolCall] | UnsetType = UNSET


class _Message(Struct):
    role: str
    content: str | None
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[_ToolCall] | UnsetType = UNSET


class _StreamChoice(Struct):
    index: int
    delta: _Delta
    finish_reason: str | None


class _Choice(Struct):
    index: int
    message: _Message
    finish_reason: str


class _TextChoice(Struct):
    index: int
    text: str
    finish_reason: str | None


class _Body(Struct):
    id: str
    object: str
    created: int
    model: str
    choices: Sequence[Struct]
    usage: _Usage | UnsetType = UNSET


class _StreamOptions(Struct):
    include_usage: bool = False


class _CompletionRequest(Struct):
    model: str = ""
    stream: bool = False
    stream_options: _StreamOptions | None = None


class _Plan(Struct):
    """Everything about one (endpoint, model) reply that does not depend on the request."""

    frames: list[bytes]  # SSE events up to and including the finish chunk
    joined: bytes  # the same, as one chunk
    json_head: bytes  # the JSON body before and after its usage object
    json_tail: bytes
    completion_tokens: int
    reasoning_tokens: int


_SSE_HEADERS = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
_JSON_HEADERS = [("content-type", "application/json")]
_DONE = b"data: [DONE]\n\n"
_SENTINEL = _Usage(-987654321, -1, -1)
_CHAT = "/v1/chat/completions"
_TEXT = "/v1/completions"


def estimate_prompt_tokens(body: bytes) -> int:
    """The mock's prompt token count: one token per four bytes of request body, at least one."""
    return max(1, len(body) // 4)


def _pieces(text: str, count: int, per_chunk: int) -> list[str]:
    """`count` chunks of `per_chunk` words each, cycling through `text` (one word, one token)."""
    words = re.findall(r"\s*\S+", text) or ["x"]
    again = [" " + words[0].lstrip(), *words[1:]]  # after the first pass, every word follows a space
    tokens = [(words if k < len(words) else again)[k % len(words)] for k in range(count * per_chunk)]
    return ["".join(tokens[i * per_chunk : (i + 1) * per_chunk]) for i in range(count)]


def _sse(obj: Struct) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


class ScriptedResponder:
    """Answers like a vLLM-style server would, from `ScriptedOptions`; deterministic bytes."""

    def __init__(self, options: ScriptedOptions) -> None:
        self.options = options
        self.running: Callable[[], int] = lambda: 0  # wired to the server's active_streams
        self.created = int(time.time())
        self._completions = 0
        self._plans: dict[tuple[str, str], _Plan] = {}
        self._decoder = msgspec.json.Decoder(_CompletionRequest)
        models = {"object": "list", "data": [{"id": options.model, "object": "model", "owned_by": "mock"}]}
        self._models_reply = Reply(200, _JSON_HEADERS, [msgspec.json.encode(models)])

    def respond(self, request: ReceivedRequest) -> Reply:
        path = request.path.partition("?")[0]
        if request.method == "POST" and path in (_CHAT, _TEXT):
            return self._complete(path, request)
        if request.method == "GET" and path == "/v1/models":
            return self._models_reply
        if request.method == "GET" and path == "/health":
            return Reply(200)
        if request.method == "GET" and path == "/metrics":
            return self._metrics()
        return _error_reply(404, f"no route for {request.method} {path}")

    def _complete(self, path: str, request: ReceivedRequest) -> Reply:
        try:
            parsed = self._decoder.decode(request.body)
        except msgspec.DecodeError as exc:
            return _error_reply(400, f"invalid request body: {exc}")
        opts = self.options
        self._completions += 1
        faulty = self._completions % max(1, opts.fail_every) == 0
        delay = opts.latency_ms / 1000
        if faulty and opts.fail_status is not None:
            retry = [] if opts.retry_after is None else [("retry-after", str(opts.retry_after))]
            reply = _error_reply(opts.fail_status, "injected failure", retry)
            reply.first_byte_delay_s = delay
            return reply
        model = parsed.model or opts.model
        plan = self._plan(path, model)
        prompt = estimate_prompt_tokens(request.body)
        usage = _Usage(prompt, plan.completion_tokens, prompt + plan.completion_tokens)
        if plan.reasoning_tokens:
            usage.completion_tokens_details = _CompletionDetails(plan.reasoning_tokens)
        reset = opts.reset_after if faulty else None
        if not parsed.stream:
            body = plan.json_head + msgspec.json.encode(usage) + plan.json_tail
            if reset is None:
                return Reply(200, _JSON_HEADERS, [body], 0.0, delay)
            half = len(body) // 2  # a reset lands mid-body: the client sees a truncated JSON reply
            return Reply(200, _JSON_HEADERS, [body[:half], body[half:]], 0.0, delay, min(reset, 1))
        tail = [_DONE]
        if parsed.stream_options is not None and parsed.stream_options.include_usage:
            obj = "chat.completion.chunk" if path == _CHAT else "text_completion"
            tail.insert(0, _sse(_Body(self._id(path), obj, self.created, model, [], usage)))
        paced = opts.chunk_delay_ms / 1000
        if not paced and reset is None:  # nothing observes the event boundaries: one HTTP chunk
            return Reply(200, _SSE_HEADERS, [plan.joined, *tail], 0.0, delay, chunked=True)
        return Reply(200, _SSE_HEADERS, [*plan.frames, *tail], paced, delay, reset, chunked=True)

    def _metrics(self) -> Reply:
        name = self.options.model
        gauges = [
            ("vllm:num_requests_running", self.running()),
            ("vllm:num_requests_waiting", self.options.metrics_waiting),
            ("vllm:kv_cache_usage_perc", 0),
        ]
        text = "".join(f'# TYPE {g} gauge\n{g}{{model_name="{name}"}} {float(v)}\n' for g, v in gauges)
        return Reply(200, [("content-type", "text/plain; version=0.0.4")], [text.encode()])

    @staticmethod
    def _id(path: str) -> str:
        return "chatcmpl-mock" if path == _CHAT else "cmpl-mock"

    def _plan(self, path: str, model: str) -> _Plan:
        plan = self._plans.get((path, model))
        if plan is None:
            if len(self._plans) >= 256:
                self._plans.clear()
            plan = self._plans[path, model] = self._build_plan(path, model)
        return plan

    def _build_plan(self, path: str, model: str) -> _Plan:
        opts = self.options
        content = _pieces(opts.text, opts.chunks, opts.tokens_per_chunk)
        if path == _TEXT:
            head = _Body("cmpl-mock", "text_completion", self.created, model, [])
            frames = [_sse(msgspec.structs.replace(head, choices=[_TextChoice(0, p, None)])) for p in content]
            frames.append(_sse(msgspec.structs.replace(head, choices=[_TextChoice(0, "", "stop")])))
            whole = msgspec.structs.replace(head, choices=[_TextChoice(0, "".join(content), "stop")])
            return _plan_of(frames, whole, len(content) * opts.tokens_per_chunk, 0)
        reasoning = _pieces(REASONING_TEXT, opts.reasoning_chunks, opts.tokens_per_chunk)
        deltas = [_Delta(reasoning_content=p) for p in reasoning] + [_Delta(content=p) for p in content]
        if opts.tool_call is not None:
            named = _Function(name=opts.tool_call, arguments="")
            opening = _ToolCall(index=0, id="call_mock_0", type="function", function=named)
            rest = _ToolCall(index=0, function=_Function(arguments=TOOL_ARGUMENTS))
            deltas += [_Delta(tool_calls=[opening]), _Delta(tool_calls=[rest])]
        finish = "stop" if opts.tool_call is None else "tool_calls"
        deltas.append(_Delta())
        deltas[0].role = "assistant"
        head = _Body("chatcmpl-mock", "chat.completion.chunk", self.created, model, [])
        frames = [
            _sse(msgspec.structs.replace(head, choices=[_StreamChoice(0, d, None)])) for d in deltas[:-1]
        ]
        frames.append(_sse(msgspec.structs.replace(head, choices=[_StreamChoice(0, deltas[-1], finish)])))
        message = _Message("assistant", "".join(content) if content or opts.tool_call is None else None)
        if reasoning:
            message.reasoning_content = "".join(reasoning)
        if opts.tool_call is not None:
            call = _Function(name=opts.tool_call, arguments=TOOL_ARGUMENTS)
            message.tool_calls = [_ToolCall(id="call_mock_0", type="function", function=call)]
        whole = _Body("chatcmpl-mock", "chat.completion", self.created, model, [_Choice(0, message, finish)])
        tool_tokens = opts.tokens_per_chunk if opts.tool_call is not None else 0
        reasoning_tokens = len(reasoning) * opts.tokens_per_chunk
        completion = len(content) * opts.tokens_per_chunk + reasoning_tokens + tool_tokens
        return _plan_of(frames, whole, completion, reasoning_tokens)


def _plan_of(frames: list[bytes], whole: _Body, completion: int, reasoning: int) -> _Plan:
    encoded = msgspec.json.encode(msgspec.structs.replace(whole, usage=_SENTINEL))
    head, tail = encoded.split(msgspec.json.encode(_SENTINEL))
    return _Plan(frames, b"".join(frames), head, tail, completion, reasoning)


# --- command line -------------------------------------------------------------------------------


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchyard mock-upstream",
        description="A scripted OpenAI-compatible upstream for trying Switchyard and benchmarks.",
    )
    add = parser.add_argument
    add("--host", default="127.0.0.1")
    add("--port", type=_count, default=9100, help="0 picks a free port (printed on start)")
    add("--model", default="mock-model", help="the name /v1/models reports; requests may name any")
    add("--latency-ms", type=float, default=0.0, help="delay before the first byte of a completion")
    add("--chunk-delay-ms", type=float, default=0.0, help="delay between streamed chunks")
    add("--chunks", type=_count, default=64, help="content chunks per completion")
    add("--tokens-per-chunk", type=_count, default=1)
    add("--text", default=DEFAULT_TEXT, help="reply text, repeated word by word as needed")
    add("--reasoning-chunks", type=_count, default=0, help="reasoning_content chunks before the text")
    add("--tool-call", metavar="NAME", help="end the reply with one call to this function")
    add("--fail-status", type=int, help="answer faulty requests with this status (429, 500, 503 ...)")
    add("--fail-every", type=_count, default=1, help="every N-th completion request is faulty")
    add("--retry-after", type=_count, help="Retry-After seconds on injected failures")
    add("--reset-after", type=_count, help="reset faulty connections after N chunks")
    add("--metrics-waiting", type=_count, default=0, help="vllm:num_requests_waiting in /metrics")
    return parser


def _options(ns: argparse.Namespace) -> ScriptedOptions:
    return ScriptedOptions(
        model=ns.model,
        latency_ms=ns.latency_ms,
        chunk_delay_ms=ns.chunk_delay_ms,
        chunks=ns.chunks,
        tokens_per_chunk=ns.tokens_per_chunk,
        text=ns.text,
        reasoning_chunks=ns.reasoning_chunks,
        tool_call=ns.tool_call,
        fail_status=ns.fail_status,
        fail_every=ns.fail_every,
        retry_after=ns.retry_after,
        reset_after=ns.reset_after,
        metrics_waiting=ns.metrics_waiting,
    )


def scripted_server(options: ScriptedOptions, host: str = "127.0.0.1", port: int = 0) -> MockUpstreamServer:
    """A server around a `ScriptedResponder` whose /metrics reports the server's in-flight replies."""
    responder = ScriptedResponder(options)
    server = MockUpstreamServer(responder, host, port)
    responder.running = lambda: server.active_streams
    return server


async def serve_forever(options: ScriptedOptions, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM (or cancellation), then close every connection."""
    server = scripted_server(options, host, port)
    await server.start()
    print(f"mock-upstream listening on {server.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await server.close()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(args: list[str]) -> int:
    ns = _parser().parse_args(args)
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve_forever(_options(ns), ns.host, ns.port))
    except OSError as exc:
        print(f"mock-upstream: cannot serve on {ns.host}:{ns.port}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
