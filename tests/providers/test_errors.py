"""Classification of upstream failures: recorded error answers, reset hints, client exceptions."""

from __future__ import annotations

import asyncio
import email.utils
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from devtools.mock_http import Reply
from providers.adapter import make_client
from providers.errors import (
    MAX_RETRY_AFTER,
    ErrorBody,
    Failure,
    UpstreamError,
    classify_error_chunk,
    classify_response,
    classify_transport,
    retry_after_from,
    upstream_errors,
)
from tests.support.ports import free_port
from tests.support.upstream import ReplayUpstream

NOW = email.utils.parsedate_to_datetime("Wed, 21 Oct 2026 07:27:30 GMT").timestamp()

RECORDED = {
    # transcript: (kind, status, code, message, retry_after)
    "fastrun_429_retry_after.json": (Failure.CAPACITY, 429, "rate_limit_error", "upstream returned 429", 7.0),
    "fastrun_400_int_code.json": (
        Failure.CLIENT,
        400,
        "invalid_request_error",
        "max_tokens must be between 1 and 16384",
        None,
    ),
    "primalabs_403_model_not_allowed.json": (Failure.AUTH, 403, "model_not_allowed", "upstream returned 403", None),
    "primalabs_422_budget_exceeded.json": (Failure.QUOTA, 422, "budget_exceeded", "upstream returned 422", None),
    "primalabs_429_no_body.json": (Failure.CAPACITY, 429, None, "upstream returned 429", None),
    "fastapi_detail_400.json": (Failure.CLIENT, 400, None, "Model Qwen/Qwen3-9B is not loaded", None),
    "vllm_flat_error_400.json": (
        Failure.CLIENT,
        400,
        "BadRequestError",
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.",
        None,
    ),
    "unauthorized_401.json": (Failure.AUTH, 401, "authentication_error", "upstream returned 401", None),
    "unavailable_503_http_date.json": (Failure.TRANSIENT, 503, "unavailable", "upstream returned 503", 30.0),
    "openai_429_insufficient_quota.json": (
        Failure.QUOTA,
        429,
        "insufficient_quota",
        "upstream returned 429",
        360.0,
    ),
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_error_answers(name: str, transcript: Callable[[str], Any]) -> None:
    recorded = transcript(name)
    body = "".join(recorded.chunks).encode()
    error = classify_response(recorded.status, recorded.headers, body, now=NOW)
    assert (error.kind, error.status, error.code, error.message, error.retry_after) == RECORDED[name]


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (402, b'{"error":{"message":"pay"}}', Failure.QUOTA),
        (404, b'{"error":{"message":"no such model","code":404}}', Failure.CLIENT),
        (404, b'{"object":"error","message":"The model `x` does not exist.","type":"NotFoundError"}', Failure.CLIENT),
        (404, b'{"error":"model \\"x\\" not found, try pulling it first"}', Failure.CLIENT),  # Ollama
        # A route the upstream does not have (a `base_url` without `/v1`): not the request's fault.
        (404, b"404 page not found", Failure.TRANSIENT),  # Ollama, Go
        (404, b'{"detail":"Not Found"}', Failure.TRANSIENT),  # FastAPI: SGLang, transformers serve
        (404, b"", Failure.TRANSIENT),
        (413, b"", Failure.CLIENT),
        (422, b'{"detail":[{"loc":["body","max_tokens"],"msg":"bad","type":"x"}]}', Failure.CLIENT),
        (408, b"", Failure.TRANSIENT),
        (500, b"<html>oops</html>", Failure.TRANSIENT),
        (502, b'{"error":{"message":"upstream failed","type":"upstream_error","code":502}}', Failure.TRANSIENT),
        (504, b"", Failure.TRANSIENT),
        (529, b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}', Failure.TRANSIENT),
        (403, b"<html>Forbidden</html>", Failure.AUTH),
        (403, b'{"error":{"code":"budget_exceeded"}}', Failure.QUOTA),
        (429, b'{"error":{"type":"insufficient_quota"}}', Failure.QUOTA),
        (409, b"", Failure.TRANSIENT),
    ],
)
def test_status_table(status: int, body: bytes, kind: Failure) -> None:
    assert classify_response(status, {}, body).kind is kind


def test_client_message_shapes() -> None:
    detail = b'{"detail":[{"loc":["body","a"],"msg":"field required"},{"msg":"too long"}]}'
    assert classify_response(422, {}, detail).message == "field required; too long"
    assert classify_response(400, {}, b'{"detail":{"reason":"x"}}').message == '{"reason":"x"}'
    assert classify_response(400, {}, b'{"error":"bad thing"}').message == "bad thing"
    assert classify_response(400, {}, b"not json").message == "upstream returned 400"
    long_message = b'{"error":{"message":"' + b"x" * 5000 + b'"}}'
    assert len(classify_response(400, {}, long_message).message) == 2000


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"Retry-After": "1.5"}, 1.5),
        ({"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}, 30.0),
        ({"retry-after": "Wed, 21 Oct 2026 07:00:00 GMT"}, 0.0),
        ({"retry-after": "99999"}, MAX_RETRY_AFTER),
        ({"retry-after": "-3"}, None),  # no delay-seconds (RFC 9110): the default cool-down, not none
        ({"retry-after": "900"}, 900.0),  # past 5 minutes: `max_cooldown_s` caps it, not the reading
        ({"retry-after": "soon"}, None),
        ({"retry-after": "nan"}, None),  # not a hint: the default cool-down, not none at all
        ({"retry-after": "inf"}, MAX_RETRY_AFTER),
        ({"x-ratelimit-reset": "NaN"}, None),
        ({"retry-after": "nan", "x-ratelimit-reset-requests": "4s"}, 4.0),
        ({"x-ratelimit-reset-requests": "1s"}, 1.0),
        ({"x-ratelimit-reset-requests": "6m0s"}, 360.0),
        ({"x-ratelimit-reset-requests": "1m30s"}, 90.0),
        ({"x-ratelimit-reset-tokens": "20ms"}, 0.02),
        ({"x-ratelimit-reset-tokens": "1.5s"}, 1.5),
        ({"x-ratelimit-reset": "12"}, 12.0),
        ({"x-ratelimit-reset": str(int(NOW) + 42)}, 42.0),
        ({"x-ratelimit-reset": str(int(NOW * 1000) + 2500)}, 2.5),
        ({"x-ratelimit-reset": "tomorrow"}, None),
        ({"x-ratelimit-reset": "-4"}, None),  # as a negative Retry-After: no hint, not 0 (no cool-down)
        ({"x-ratelimit-reset-requests": "2s", "x-ratelimit-reset-tokens": "9s"}, 9.0),
        (
            {
                "x-ratelimit-reset-requests": "2s",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-tokens": "9s",
                "x-ratelimit-remaining-tokens": "5000",
            },
            2.0,
        ),
        ({"retry-after": "3", "x-ratelimit-reset-requests": "9s"}, 3.0),
        ({}, None),
    ],
)
def test_retry_after_forms(headers: dict[str, str], seconds: float | None) -> None:
    error = classify_response(429, headers, b"", now=NOW)
    assert error.retry_after == (pytest.approx(seconds) if seconds is not None else None)
    assert retry_after_from({k.lower(): v for k, v in headers.items()}, now=NOW) == error.retry_after


def test_error_chunk_code_as_status() -> None:
    assert classify_error_chunk(ErrorBody(message="m", code=429)).kind is Failure.CAPACITY
    assert classify_error_chunk(ErrorBody(message="m", code=42)).status == 502
    client = classify_error_chunk(ErrorBody(message="context too long", code=400))
    assert (client.kind, client.message) == (Failure.CLIENT, "context too long")


async def test_connection_refused_is_transient() -> None:
    client = make_client()
    try:
        with pytest.raises(httpx.HTTPError) as raised:
            await client.get(f"http://127.0.0.1:{free_port()}/v1/models")
    finally:
        await client.aclose()
    error = classify_transport(raised.value)
    assert (error.kind, error.message) == (Failure.TRANSIENT, "upstream connection failed")


async def test_read_timeout_is_timeout() -> None:
    client = make_client()
    try:
        async with ReplayUpstream() as upstream:
            upstream.set_default(Reply(stall_after=0))  # never answer; hold until the client hangs up
            with pytest.raises(httpx.HTTPError) as raised:
                await client.get(f"http://127.0.0.1:{upstream.port}/", timeout=httpx.Timeout(0.2))
    finally:
        await client.aclose()
    assert classify_transport(raised.value).kind is Failure.TIMEOUT


def test_plain_exceptions() -> None:
    assert classify_transport(TimeoutError()).kind is Failure.TIMEOUT
    assert classify_transport(httpx.ReadTimeout("slow")).kind is Failure.TIMEOUT
    assert classify_transport(httpx.RemoteProtocolError("bad")).kind is Failure.TRANSIENT
    assert classify_transport(ConnectionResetError()).kind is Failure.TRANSIENT
    already = UpstreamError(Failure.AUTH, "x")
    assert classify_transport(already) is already


@pytest.mark.parametrize(
    ("raised", "kind", "message"),
    [
        (httpx.RemoteProtocolError("bad head"), Failure.TRANSIENT, "upstream sent a malformed response"),
        (httpx.ReadError("reset"), Failure.TRANSIENT, "upstream connection failed"),
        (httpx.ConnectError("certificate verify failed"), Failure.TRANSIENT, "upstream connection failed"),
        (httpx.UnsupportedProtocol("ftp"), Failure.TRANSIENT, "upstream connection failed"),
        (ConnectionResetError(), Failure.TRANSIENT, "upstream connection failed"),
        (httpx.ReadTimeout("slow"), Failure.TIMEOUT, "upstream timed out"),
        (TimeoutError(), Failure.TIMEOUT, "upstream timed out"),
    ],
)
def test_upstream_errors_maps_foreign_exceptions(raised: Exception, kind: Failure, message: str) -> None:
    with pytest.raises(UpstreamError) as caught, upstream_errors():
        raise raised
    assert (caught.value.kind, caught.value.message) == (kind, message)
    assert caught.value.__cause__ is raised


@pytest.mark.parametrize(
    "raised",
    [UpstreamError(Failure.AUTH, "refused"), ValueError("a bug of ours"), asyncio.CancelledError()],
    ids=["upstream-error", "value-error", "cancelled"],
)
def test_upstream_errors_lets_everything_else_through(raised: BaseException) -> None:
    with pytest.raises(type(raised)) as caught, upstream_errors():
        raise raised
    assert caught.value is raised
