"""Upstream failures: one exception for routing, and the one place foreign exceptions become it.

Every failure of an upstream call reaches the app as an `UpstreamError`; its `kind` says what
routing does:

    UpstreamError                     raised by `Provider.batches` (and `events`) (probes answer False/None instead)
      kind = Failure.TRANSIENT        connection refused/reset, a malformed answer, 408/500/502/503/
                                      504/529, an `{"error"}` chunk, a stream cut before its finish:
                                      try the next backend, cool this one down
      kind = Failure.CAPACITY         429 (with or without a reset hint): out of rotation for
                                      `retry_after` seconds, try the next backend
      kind = Failure.QUOTA            402, 429 insufficient_quota, primalabs 422 budget_exceeded:
                                      the operator's money is gone; disable the provider
      kind = Failure.AUTH             401 (bad key): disable the provider; 403 (key not
                                      allowed for this model): that backend only (failover.py)
      kind = Failure.CLIENT           400/404/413/422 caused by the request: no retry, 400 to client
                                      (a 404 only with an error document: without one it is a
                                      missing route, a wrong `base_url`: TRANSIENT)
      kind = Failure.TIMEOUT          connect, first byte, idle gap or total deadline passed:
                                      try the next, else 504
      kind = Failure.LOCAL            the gateway itself out of descriptors or buffers (EMFILE,
                                      ENFILE, ENOBUFS, ENOMEM) making the connection: no backend's
                                      fault, none cooled down; 503 with Retry-After (a connection
                                      flood cooled every backend down, for every replica)

Three classifiers build it. `classify_response` reads a non-2xx answer (status, body,
`Retry-After`/`x-ratelimit-reset*`) and `classify_error_chunk` an `{"error": ...}` chunk inside a
200 stream; both read the status code and the structured error body (`error.type`, `error.code`
as int or string), never the prose of a message. `classify_transport` reads an exception from
below the adapter; its one caller is `upstream_errors()`, the context manager the adapter runs
every upstream exchange in (send, body reads, close), as httpx runs httpcore's calls in
`map_httpcore_exceptions`. Whatever transport is underneath, this is what can come out of it:

    httpx.TransportError                   H1Transport's errors (`providers.transport`)
    ├── TimeoutException                   → TIMEOUT (ConnectTimeout, ReadTimeout)
    ├── NetworkError                       → TRANSIENT "upstream connection failed" (ConnectError: refused,
    │                                        TLS verification; ReadError: reset, closed)
    ├── UnsupportedProtocol                → TRANSIENT (a scheme other than http/https)
    └── ProtocolError
        └── RemoteProtocolError            → TRANSIENT "upstream sent a malformed response"
    httpx.DecodingError                    → TRANSIENT (a probe's compressed body that does not decode)
    OSError                                → TRANSIENT (sockets; ssl.SSLError)
    TimeoutError                           → TIMEOUT (an asyncio deadline)

`UpstreamError` passes through `upstream_errors()` unchanged, and so does everything else: a
`ValueError` is a bug of ours, not an upstream failure.

`message` is safe to show a client: it is the upstream's own message for CLIENT failures and a
generic description otherwise (it never holds a key, a URL with credentials, or a stack trace).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import enum
import errno
import math
import re
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import httpx
import msgspec
from msgspec import Struct

from providers.lenient_json import lenient_json, paired, scrubbed


class Failure(enum.Enum):
    TRANSIENT = "transient"
    CAPACITY = "capacity"
    QUOTA = "quota"
    AUTH = "auth"
    CLIENT = "client"
    TIMEOUT = "timeout"
    LOCAL = "local"


class UpstreamError(Exception):
    """A classified upstream failure. `answered`: the upstream answered with an error (its status,
    or an error inside a 200), classified here; not an answer the adapter could not read."""

    def __init__(
        self,
        kind: Failure,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        code: str | None = None,
        answered: bool = False,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after = retry_after
        self.code = code
        self.answered = answered

    def __repr__(self) -> str:
        return f"UpstreamError({self.kind.value}, status={self.status}, code={self.code!r})"


MAX_RETRY_AFTER = 86_400.0  # seconds: a hint past a day is read as a day (`inf`); `max_cooldown_s` caps the rest
_MESSAGE_LIMIT = 2000
_QUOTA_CODES = frozenset({"insufficient_quota", "budget_exceeded", "billing_hard_limit_reached"})
_CLIENT_STATUSES = frozenset({400, 404, 413, 422})
_TRANSIENT_STATUSES = frozenset({408, 500, 502, 503, 504, 529})
_RESET_HEADERS = (
    ("x-ratelimit-reset-requests", "x-ratelimit-remaining-requests"),
    ("x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens"),
    ("x-ratelimit-reset", "x-ratelimit-remaining"),
)
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
_CODE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # an error code as upstreams write one (`model_not_allowed`)


class ErrorBody(Struct):
    """The `error` object of an OpenAI-style error (`code` is an int at fastrun, a string at primalabs)."""

    message: str | None = None
    type: str | None = None
    code: int | str | None = None


class _ErrorEnvelope(Struct):
    """Every error body shape seen: `{"error": {...}}`, `{"error": "text"}`, flat
    `{"object": "error", "message", "type", "code"}` (vLLM) and FastAPI's `{"detail": ...}`."""

    error: ErrorBody | str | None = None
    message: str | None = None
    type: str | None = None
    code: int | str | None = None
    detail: Any = None


_envelope_decoder = msgspec.json.Decoder(_ErrorEnvelope, strict=False)


def classify_response(
    status: int, headers: Mapping[str, str], body: bytes, *, now: float | None = None
) -> UpstreamError:
    """Classify a non-2xx upstream answer by its status and structured body (never its prose)."""
    error, structured = _error_body(body)
    lowered = {key.lower(): value for key, value in headers.items()}
    return _classified(status, error, retry_after_from(lowered, now=now), structured=structured)


def classify_error_chunk(error: ErrorBody) -> UpstreamError:
    """An `{"error": ...}` payload inside a 200 stream: its int `code` is read as a status when it
    looks like one; anything else is a transient upstream failure."""
    code = error.code
    status = code if isinstance(code, int) and 400 <= code <= 599 else 502
    return _classified(status, error, None)


def _classified(status: int, error: ErrorBody, retry_after: float | None, *, structured: bool = True) -> UpstreamError:
    kind = _failure_for(status, error, structured)
    code = error.code if isinstance(error.code, str) else error.type
    if code is not None and not _CODE.fullmatch(code):
        code = None  # it is logged (`backend_forbidden`): never prose, nor the upstream's echo of the request
    if kind is Failure.CLIENT and error.message:
        message = paired(error.message[:_MESSAGE_LIMIT])  # a lone surrogate: no JSON encoder takes it
    else:
        message = f"upstream returned {status}"
    return UpstreamError(kind, message, status=status, retry_after=retry_after, code=code, answered=True)


def _failure_for(status: int, error: ErrorBody, structured: bool) -> Failure:
    if status == 402 or error.code in _QUOTA_CODES or error.type in _QUOTA_CODES:
        return Failure.QUOTA
    if status == 429:
        return Failure.CAPACITY
    if status in (401, 403):
        return Failure.AUTH
    if status == 404 and not structured:
        # "404 unknown model" is an error document (OpenAI's `error`, vLLM's flat one, Ollama's
        # `{"error": "text"}`); a 404 without one (empty, text, HTML, FastAPI's bare `detail`) is
        # a route the upstream does not have: its `base_url` is wrong, not the request.
        return Failure.TRANSIENT
    if status in _CLIENT_STATUSES:
        return Failure.CLIENT
    return Failure.TRANSIENT  # 408, 5xx, 529, and anything unexpected: try another backend


def _error_body(body: bytes) -> tuple[ErrorBody, bool]:
    """The error, and whether the body was an error document (an `error`, or a flat `message`,
    `type` or `code`), not text or FastAPI's bare `detail`."""
    try:
        envelope = _envelope_decoder.decode(body)
    except msgspec.DecodeError:  # a lone surrogate, a byte that is no UTF-8, a BOM: the message kept
        value = lenient_json(body)
        try:
            envelope = msgspec.convert(scrubbed(value), _ErrorEnvelope, strict=False)
        except (msgspec.ValidationError, RecursionError):
            return ErrorBody(), False
    except (msgspec.ValidationError, RecursionError):  # nested too deep: no document
        return ErrorBody(), False
    if isinstance(envelope.error, ErrorBody):
        return envelope.error, True
    if isinstance(envelope.error, str):
        return ErrorBody(message=envelope.error, type=envelope.type, code=envelope.code), True
    structured = (envelope.message, envelope.type, envelope.code) != (None, None, None)
    if envelope.detail is not None:
        return ErrorBody(message=_detail_message(envelope.detail), type=envelope.type, code=envelope.code), structured
    return ErrorBody(message=envelope.message, type=envelope.type, code=envelope.code), structured


def _detail_message(detail: Any) -> str:
    """FastAPI: a string, or a validation list of `{"loc", "msg", "type"}`."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        messages = [item["msg"] for item in detail if isinstance(item, dict) and "msg" in item]
        if messages:
            return "; ".join(str(message) for message in messages)
    return msgspec.json.encode(detail).decode()


def retry_after_from(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait, from `Retry-After` (seconds or HTTP-date) or the `x-ratelimit-reset*`
    family (`1s`, `6m0s`, `20ms`, plain seconds, or epoch seconds), capped at MAX_RETRY_AFTER (the
    provider's `max_cooldown_s` caps the cool-down it makes: `app.routing.failover`). A negative
    number is no hint (RFC 9110's delay is digits); a date already past is 0.
    Header names must be lower-case. Of several reset headers, those whose `remaining` is 0 win;
    the longest of them is taken."""
    current = time.time() if now is None else now
    value = headers.get("retry-after")
    seconds = _retry_after_value(value, current) if value is not None else None
    if seconds is None:
        seconds = _reset_hint(headers, current)
    if seconds is None:
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def _retry_after_value(value: str, now: float) -> float | None:
    value = value.strip()
    try:
        number = float(value)
    except ValueError:
        pass
    else:  # `nan` passed the cap (no comparison holds) and cooled nothing; `inf` is capped as any
        return None if math.isnan(number) or number < 0 else number
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp() - now


def _reset_hint(headers: Mapping[str, str], now: float) -> float | None:
    present = [(headers[reset], headers.get(left)) for reset, left in _RESET_HEADERS if reset in headers]
    exhausted = [value for value, remaining in present if remaining is not None and remaining.strip() == "0"]
    candidates = [_reset_value(value, now) for value in (exhausted or [value for value, _ in present])]
    known = [seconds for seconds in candidates if seconds is not None]
    return max(known) if known else None


def _reset_value(value: str, now: float) -> float | None:
    value = value.strip()
    try:
        number = float(value)
    except ValueError:
        parts = _DURATION.findall(value)
        if not parts or "".join(amount + unit for amount, unit in parts) != value:
            return None
        return sum(float(amount) * _DURATION_UNITS[unit] for amount, unit in parts)
    if math.isnan(number) or number < 0:  # a negative wait is no hint, as for Retry-After
        return None
    if number > 1e12:  # epoch milliseconds
        return number / 1000 - now
    if number > 1e9:  # epoch seconds
        return number - now
    return number


_FOREIGN = (httpx.RequestError, OSError, TimeoutError)
MALFORMED = httpx.RemoteProtocolError  # an answer that is not HTTP as it should be


class _UpstreamErrors:
    """The context manager behind `upstream_errors()`: stateless, so one instance serves every
    call and entering it allocates nothing (it wraps each request on the hot path)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if exc is not None and isinstance(exc, _FOREIGN):
            raise classify_transport(exc) from exc


_UPSTREAM_ERRORS = _UpstreamErrors()


def upstream_errors() -> _UpstreamErrors:
    """`with upstream_errors():` turns what an HTTP library or socket raises inside the block into
    an `UpstreamError` (module docstring); everything else passes through."""
    return _UPSTREAM_ERRORS


def classify_transport(exc: BaseException) -> UpstreamError:
    """A failure to talk to the upstream at all (no HTTP answer, a malformed one, or the body broke off)."""
    if isinstance(exc, UpstreamError):
        return exc
    if _timed_out(exc):
        return UpstreamError(Failure.TIMEOUT, "upstream timed out")
    if _short_here(exc):
        return UpstreamError(Failure.LOCAL, "the gateway is short of file descriptors or memory", retry_after=1.0)
    if isinstance(exc, MALFORMED):
        return UpstreamError(Failure.TRANSIENT, "upstream sent a malformed response")
    return UpstreamError(Failure.TRANSIENT, "upstream connection failed")


_SHORT_HERE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def _short_here(exc: BaseException) -> bool:
    """An `OSError` of the gateway's own resources under `exc` (a connect's `socket()` failing)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno in _SHORT_HERE:
            return True
        cause = cause.__cause__
    return False


def _timed_out(exc: BaseException) -> bool:
    return isinstance(exc, (TimeoutError, httpx.TimeoutException))


def wrapped(exc: UpstreamError) -> list[BaseException]:
    """The exceptions the adapter wrapped (`raise classify_transport(e) from e`), outermost first."""
    chain: list[BaseException] = []
    cause = exc.__cause__
    while cause is not None:
        chain.append(cause)
        cause = cause.__cause__
    return chain


def transport_error(exc: UpstreamError) -> str | None:
    """The class of the innermost wrapped exception (`ConnectionRefusedError`, `ReadError`, ...);
    None for an HTTP answer or an unreadable body. A timer's `CancelledError`, and its plain
    `TimeoutError` under a named one, say how the wait was cut, not what timed out: a connect
    timeout is `ConnectTimeout` (it read `CancelledError`); a bare timer's is `TimeoutError`."""
    chain = [error for error in wrapped(exc) if not isinstance(error, asyncio.CancelledError)]
    named = [error for error in chain if type(error) is not TimeoutError] or chain
    return type(named[-1]).__name__ if named else None
