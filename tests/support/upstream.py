"""The tests' upstream: a loopback HTTP server that answers from a queue of recorded or inline replies.

It is `devtools.mock_http.MockUpstreamServer` (the same HTTP code the benchmarks use) with a
responder that pops `Reply`s in order, so a test scripts exactly what each upstream call gets —
a transcript name (`tests/transcripts/<name>.json`), or a reply built inline with `reply_json` /
`reply_sse` / the builders in `tests.support.replies` — and afterwards asserts on `.requests`,
what the gateway actually sent.

Routing of the queue:
- `enqueue(reply, path="/v1/models")` queues for that path only (query string ignored);
- `enqueue(reply)` queues for any request that has no reply waiting for its own path;
- when both are empty, the default reply answers (a 500 that names the request, until
  `set_default` says otherwise).
Health and queue-depth probes (`GET …/health`, `…/models`, `…/metrics`) are answered by built-in
replies unless a reply is queued for their path, and are recorded in `.probes` instead of
`.requests`, so background probing never steals a queued completion reply or shifts indexes.

`upstream_fixture(name)` makes a fixture that serves one for the duration of a test.
"""

from __future__ import annotations

import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from devtools.mock_http import MockUpstreamServer, ReceivedRequest, Reply
from tests.support.transcripts import load_transcript

_PROBES = ("/health", "/models", "/metrics")


def reply_json(status: int, obj: Any, headers: dict[str, str] | None = None, **play: Any) -> Reply:
    """A whole JSON body; `play` takes Reply's timing/fault fields (first_byte_delay_s, reset_after …)."""
    pairs = [("content-type", "application/json"), *(headers or {}).items()]
    return Reply(status=status, headers=pairs, chunks=[msgspec.json.encode(obj)], **play)


def reply_sse(
    payloads: list[dict[str, Any] | str],
    done: bool = True,
    status: int = 200,
    headers: dict[str, str] | None = None,
    **play: Any,
) -> Reply:
    """An event stream, one HTTP chunk per payload: a dict becomes `data: <json>\\n\\n`, a str is
    sent verbatim (comments, CRLF, split lines, non-JSON data), and `done` appends `data: [DONE]`."""
    chunks = [b"data: " + msgspec.json.encode(p) + b"\n\n" if isinstance(p, dict) else p.encode() for p in payloads]
    if done:
        chunks.append(b"data: [DONE]\n\n")
    pairs = [("content-type", "text/event-stream"), *(headers or {}).items()]
    return Reply(status=status, headers=pairs, chunks=chunks, chunked=True, **play)


def played(reply: Reply | str, **fields: Any) -> Reply:
    """`reply` (or a transcript, by name) with some of its timing/fault fields changed."""
    return msgspec.structs.replace(_as_reply(reply), **fields)


def _as_reply(reply: Reply | str) -> Reply:
    return load_transcript(reply) if isinstance(reply, str) else reply


class _Server(MockUpstreamServer):
    """Counts the connections it accepted, so a test can tell a reused connection from new ones."""

    connections_made = 0

    def _opened(self, connection: Any) -> None:
        self.connections_made += 1
        super()._opened(connection)


class ReplayUpstream:
    """`async with ReplayUpstream() as upstream:` then point a provider's base_url at `upstream.url`
    (`https://…` when built with an `ssl` server context)."""

    def __init__(self, models: list[str] | None = None, ssl: ssl.SSLContext | None = None) -> None:
        self.models = models or []  # its `/models` list; an empty one says nothing (`Provider.probe_report`)
        self.requests: list[ReceivedRequest] = []
        self.probes: list[ReceivedRequest] = []
        self._any: deque[Reply] = deque()
        self._by_path: dict[str, deque[Reply]] = {}
        self._default: Reply | None = None
        self.server = _Server(self, ssl=ssl)

    def enqueue(self, reply: Reply | str, repeat: int = 1, path: str | None = None) -> None:
        queue = self._any if path is None else self._by_path.setdefault(path, deque())
        queue.extend([_as_reply(reply)] * repeat)

    def set_default(self, reply: Reply | str) -> None:
        self._default = _as_reply(reply)

    @property
    def pending(self) -> int:
        return len(self._any) + sum(map(len, self._by_path.values()))

    def respond(self, request: ReceivedRequest) -> Reply:
        path = request.path.partition("?")[0]
        own = self._by_path.get(path)
        if own:
            self.requests.append(request)
            return own.popleft()
        if request.method == "GET" and path.endswith(_PROBES):
            self.probes.append(request)
            return self._probe_reply(path)
        self.requests.append(request)
        if self._any:
            return self._any.popleft()
        if self._default is not None:
            return self._default
        message = f"ReplayUpstream: no reply queued for {request.method} {request.path}"
        return reply_json(500, {"error": {"message": message, "type": "test_error", "code": 500}})

    def _probe_reply(self, path: str) -> Reply:
        if path.endswith("/models"):
            data = [{"id": name, "object": "model", "owned_by": "replay"} for name in self.models]
            return reply_json(200, {"object": "list", "data": data})
        if path.endswith("/metrics"):
            text = "vllm:num_requests_waiting 0.0\nvllm:num_requests_running 0.0\n"
            return Reply(headers=[("content-type", "text/plain")], chunks=[text.encode()])
        return Reply()

    @property
    def url(self) -> str:
        """The OpenAI-style base URL, ending at `/v1`."""
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def open_connections(self) -> int:
        return self.server.open_connections

    @property
    def connections_made(self) -> int:
        return self.server.connections_made

    @property
    def active_streams(self) -> int:
        return self.server.active_streams

    async def start(self) -> None:
        await self.server.start()

    async def close(self) -> None:
        await self.server.close()

    async def wait_idle(self) -> None:
        await self.server.wait_idle()

    async def __aenter__(self) -> ReplayUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def _serve() -> AsyncIterator[ReplayUpstream]:
    async with ReplayUpstream() as upstream:
        yield upstream


def upstream_fixture(name: str) -> Any:
    """A fixture named `name`: a started `ReplayUpstream`, closed after the test."""
    return pytest.fixture(_serve, name=name)
