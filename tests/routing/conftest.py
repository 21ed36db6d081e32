"""Fault injection for routing: loopback upstreams serving one model, and helpers that read the
gateway's routing state back through HTTP only (`/api/v1/models`, `/metrics`, the ledger).

Providers are `alpha`, `beta` and `gamma` (all `openai_compatible`, provider priority 0 unless a
test overrides it). The catalog:
- `chat-1`: alpha (deployment priority 100), beta (50), gamma (10): strict failover order;
- `even-1`: alpha and beta at the same priority (least loaded wins; ties go in catalog order,
  which is the provider name);
- `orphan-1`: deployed only on providers no test configures.

`Held` keeps a streaming request open on whichever backend takes it (the upstream sends one
content chunk and stalls), so a test can fill concurrency slots and free them by cancelling.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.mock_http import ReceivedRequest, Reply
from tests.conftest import GatewayHandle, StartGateway
from tests.frames import parse_sse
from tests.upstream import ReplayUpstream, reply_json, reply_sse

CATALOG = """
[models."chat-1"]
context_window = 32768
max_output = 4096
default = true

[[models."chat-1".deployments]]
provider = "alpha"
upstream_model = "alpha/chat-1"
priority = 100

[[models."chat-1".deployments]]
provider = "beta"
upstream_model = "beta/chat-1"
priority = 50

[[models."chat-1".deployments]]
provider = "gamma"
upstream_model = "gamma/chat-1"
priority = 10

[models."even-1"]
context_window = 8192
max_output = 1024

[[models."even-1".deployments]]
provider = "alpha"
upstream_model = "alpha/even-1"
priority = 100

[[models."even-1".deployments]]
provider = "beta"
upstream_model = "beta/even-1"
priority = 100

[models."orphan-1"]
context_window = 8192
max_output = 1024

[[models."orphan-1".deployments]]
provider = "nowhere"
upstream_model = "nowhere/orphan-1"
priority = 100

[[models."orphan-1".deployments]]
provider = "elsewhere"
upstream_model = "elsewhere/orphan-1"
priority = 50
"""

USER = {"role": "user", "content": [{"kind": "text", "data": "hi"}]}
PROBE_PATH = "/v1/models"  # what a hosted kind's health probe asks for (base_url is `…/v1`)


# -- upstreams and the gateway ---------------------------------------------------------------------


@pytest.fixture
async def alpha() -> AsyncIterator[ReplayUpstream]:
    async with ReplayUpstream() as upstream:
        yield upstream


@pytest.fixture
async def beta() -> AsyncIterator[ReplayUpstream]:
    async with ReplayUpstream() as upstream:
        yield upstream


@pytest.fixture
async def gamma() -> AsyncIterator[ReplayUpstream]:
    async with ReplayUpstream() as upstream:
        yield upstream


async def launch(
    start_gateway: StartGateway,
    upstreams: dict[str, ReplayUpstream],
    *,
    common: dict[str, Any] | None = None,
    routing: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    redis: dict[str, Any] | None = None,
    **overrides: dict[str, Any],
) -> GatewayHandle:
    """A gateway whose providers are `upstreams` (name → server); `common` applies to every
    provider, `overrides[name]` to one."""
    providers = {
        name: {"kind": "openai_compatible", "base_url": upstream.url, **(common or {}), **overrides.get(name, {})}
        for name, upstream in upstreams.items()
    }
    return await start_gateway(providers=providers, catalog=CATALOG, routing=routing, server=server, redis=redis)


# -- replies ---------------------------------------------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"id": "chatcmpl-r1", "object": "chat.completion.chunk"}
    body["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body.update(extra)
    return body


def answer(text: str = "ok", **play: Any) -> Reply:
    """A whole 200 answer."""
    body = {
        "id": "chatcmpl-r1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    return reply_json(200, body, **play)


def stream_answer(text: str = "ok", **play: Any) -> Reply:
    """A complete 200 event stream: one text delta, the finish reason, usage, `[DONE]`."""
    usage = chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4})
    return reply_sse([chunk({"role": "assistant", "content": text}), chunk({}, "stop"), usage], **play)


def stalled_stream(text: str = "held") -> Reply:
    """One content chunk, then nothing: the connection stays open until the gateway goes away."""
    return reply_sse([chunk({"content": text}), chunk({}, "stop")], stall_after=1)


def error(status: int, type_: str = "upstream_error", headers: dict[str, str] | None = None, **play: Any) -> Reply:
    """A fastrun-style error body: `{"error": {"message", "type", "code": <int>}}`."""
    return reply_json(
        status, {"error": {"message": f"upstream says {status}", "type": type_, "code": status}}, headers, **play
    )


def played(reply: Reply, **fields: Any) -> Reply:
    """`reply` with some of its timing/fault fields changed."""
    return msgspec.structs.replace(reply, **fields)


def models_reply(**play: Any) -> Reply:
    return reply_json(200, {"object": "list", "data": [{"id": "mock-model", "object": "model"}]}, **play)


def metrics_reply(waiting: float) -> Reply:
    text = f"vllm:num_requests_waiting {waiting}\nvllm:num_requests_running 1.0\n"
    return Reply(headers=[("content-type", "text/plain")], chunks=[text.encode()])


# -- requests --------------------------------------------------------------------------------------


def body(model: str = "chat-1", *, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [USER], "stream": stream, **extra}


async def complete(gw: GatewayHandle, model: str = "chat-1", **extra: Any) -> httpx.Response:
    return await gw.client.post("/api/v1/completions", json=body(model, **extra))


async def stream(gw: GatewayHandle, model: str = "chat-1") -> tuple[httpx.Response, list[tuple[str, Any]]]:
    """A whole streamed answer (status must be 200), parsed into frames."""
    response = await gw.client.post("/api/v1/completions", json=body(model, stream=True))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return response, parse_sse(response.text)


def datas(frames: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Frame data with the (separately checked) complete response cut from `finish`."""
    return [{k: v for k, v in data.items() if k != "response"} for _, data in frames]


class Held:
    """A streaming request kept open: `started()` waits for its first frames; `release()` closes
    the client side (the gateway must then cancel the upstream request and free the slot)."""

    def __init__(self, gw: GatewayHandle, model: str = "chat-1") -> None:
        self._first: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(self._run(gw, model))

    async def _run(self, gw: GatewayHandle, model: str) -> None:
        try:
            async with gw.client.stream("POST", "/api/v1/completions", json=body(model, stream=True)) as response:
                seen = ""
                async for text in response.aiter_text():
                    seen += text
                    if not self._first.done() and "text_delta" in seen:
                        self._first.set_result(seen)
                if not self._first.done():
                    self._first.set_exception(AssertionError(f"{response.status_code}: {seen}"))
        except Exception as exc:
            if not self._first.done():
                self._first.set_exception(exc)

    async def started(self) -> str:
        """The provider whose stream this is (from `stream_start`)."""
        text = await asyncio.wait_for(asyncio.shield(self._first), 5)
        frames = parse_sse(text[: text.rindex("\n\n") + 2])
        start = frames[0][1]
        assert start["type"] == "stream_start", frames
        provider: str = start["provider"]
        return provider

    async def release(self) -> None:
        if not self.task.done():
            self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def holding() -> AsyncIterator[list[Held]]:
    """Collects `Held` requests and releases whatever is still held when the block ends."""
    held: list[Held] = []
    try:
        yield held
    finally:
        for item in held:
            await item.release()


# -- reading state back ----------------------------------------------------------------------------


def completions(upstream: ReplayUpstream) -> list[ReceivedRequest]:
    """Completion requests the upstream received (probes answered from a queue are in `.requests` too)."""
    return [r for r in upstream.requests if r.path.partition("?")[0].endswith("/chat/completions")]


def probes_at(upstream: ReplayUpstream, path: str) -> list[ReceivedRequest]:
    """Requests to `path` answered from replies queued for that path."""
    return [r for r in upstream.requests if r.path.partition("?")[0] == path]


async def deployments(gw: GatewayHandle, model: str = "chat-1") -> dict[str, dict[str, Any]]:
    """`GET /api/v1/models`: the model's deployments (live backend state) by provider."""
    response = await gw.client.get("/api/v1/models")
    assert response.status_code == 200, response.text
    (entry,) = [m for m in response.json()["data"] if m["id"] == model]
    return {d["provider"]: d for d in entry["deployments"]}


async def model_ready(gw: GatewayHandle, model: str) -> bool:
    response = await gw.client.get("/api/v1/models")
    (entry,) = [m for m in response.json()["data"] if m["id"] == model]
    ready: bool = entry["ready"]
    return ready


def seconds_until(iso: str) -> float:
    return (datetime.fromisoformat(iso) - datetime.now(UTC)).total_seconds()


Sample = tuple[str, frozenset[tuple[str, str]]]


async def scrape(gw: GatewayHandle) -> dict[Sample, float]:
    """`GET /metrics` as {(name, labels): value}."""
    response = await gw.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    samples: dict[Sample, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            series = (sample.name, frozenset(sample.labels.items()))
            assert series not in samples, series
            samples[series] = sample.value
    return samples


def metric(samples: dict[Sample, float], name: str, **labels: str) -> float | None:
    """The sample with exactly these labels; for backend gauges `provider` (and `model`) suffice."""
    matches = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    if not matches:
        return None
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


async def eventually(check: Callable[[], Awaitable[bool]] | Callable[[], bool], within: float = 2.0) -> None:
    """Poll `check` (sync or async) every 10 ms until it is true; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within} s")
        await asyncio.sleep(0.01)


async def rows_when(gw: GatewayHandle, count: int) -> list[dict[str, Any]]:
    """The ledger rows, once there are `count` of them (a cancelled request's row comes late)."""
    rows: list[dict[str, Any]] = []

    async def enough() -> bool:
        nonlocal rows
        rows = await gw.ledger_rows()
        return len(rows) >= count

    await eventually(enough)
    assert len(rows) == count, rows
    return rows


def row_view(row: dict[str, Any]) -> tuple[Any, ...]:
    """(status, error_type, error_status, attempts, provider): what routing decided for a request."""
    return row["status"], row["error_type"], row["error_status"], row["attempts"], row["provider"]
