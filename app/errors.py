"""The gateway's error tree and its one renderer.

    GatewayError                 status_code / type set at class level, like Litestar's HTTPException
      InvalidRequest       400   invalid_request_error   (param: the failing field's path)
      AuthenticationFailed 401   authentication_error
      PermissionDenied     403   permission_error
      NotFound             404   not_found_error
      MethodNotAllowed     405   invalid_request_error   (Allow)
      RequestTimeout       408   invalid_request_error   (closes the connection)
      PayloadTooLarge      413   invalid_request_error   (closes the connection)
        DeclaredTooLarge   413   invalid_request_error   a declared length over the limit (keeps the connection)
      UnsupportedMediaType 415   invalid_request_error   (closes the connection)
      HeadersTooLarge      431   invalid_request_error   (closes the connection)
      AtCapacity           429   rate_limit_error        (Retry-After)
      KeyRateLimited       429   rate_limit_error        an API key's rpm/tpm/max_concurrency (Retry-After)
      BudgetExceeded       429   insufficient_quota      an API key's budget (Retry-After unless `total`)
      AllBackendsFailed    502   upstream_error
      NoBackendAvailable   503   unavailable             (Retry-After)
      UsageNotRecordable   503   unavailable             (the ledger's journal cannot be written)
      LimitsUnavailable    503   unavailable             Redis unreachable for a key with limits
      DatabaseUnavailable  503   unavailable             a read the answer needs (a report, the keys)
      UpstreamTimeout      504   upstream_error
      InternalError        500   internal_error          (never carries internal detail)

Every error body carries the OpenAI view (`error`) and the fabro view (`errors[0]`) of the same
error, plus `request_id` (api.md). Rendering is pure: `error_body(exc, request_id) -> bytes`, so the
SSE `error` event and the JSON response say the same thing.

An error raised before the request body was read to its end (`closes_connection`) answers with
`connection: close`: the rest of that body would otherwise keep the connection busy for as long as
the client cares to trickle it (`DeclaredTooLarge` keeps it for a while). A client-supplied value
quoted in a message goes through `clip`, so a 5 MB model name makes a short error, not a 10 MB one.

`extra_headers` carries headers that belong to the request rather than the error (an API key's
`x-ratelimit-*`, access.md): whoever knows them sets them before the error is rendered.
"""

from __future__ import annotations

import math
import re
from http import HTTPStatus

import msgspec
from msgspec import Struct

ECHO_CHARS = 64
_SECRET = re.compile(r"sy-[A-Za-z0-9_-]{32,}")  # an API key's secret (access.md: 32+ random bytes), quoted by mistake


_OTHER_SECRETS: set[str] = set()  # secrets without the `sy-` prefix: the admin key's (`register_secret`)


def register_secret(secret: str) -> None:
    """A secret `unsecret` cuts although it has no `sy-` prefix (the admin key: any text the
    operator chose). The key ring registers it at start-up."""
    if secret and not _SECRET.fullmatch(secret):  # an `sy-` one is cut to its prefix below
        _OTHER_SECRETS.add(secret)


def unsecret(text: str) -> str:
    """`text` with any API key's secret in it cut to its prefix (access.md: no secret in an error):
    one pasted where a model, a provider or a parameter's name goes was quoted back whole."""
    for secret in _OTHER_SECRETS:  # whole, or its start as `clip` left it (at least 16 characters of it)
        head = secret[:16]
        while head in text:
            start = text.index(head)
            end = start + len(head)
            while end - start < len(secret) and end < len(text) and text[end] == secret[end - start]:
                end += 1
            text = text[:start] + "…" + text[end:]
    return _SECRET.sub(lambda found: found[0][:7] + "…", text) if "sy-" in text else text


def clip(value: str) -> str:
    """A client-supplied value as an error message quotes it: at most `ECHO_CHARS` characters."""
    return value if len(value) <= ECHO_CHARS else value[:ECHO_CHARS] + "…"


class GatewayError(Exception):
    status_code: int = 500
    type: str = "internal_error"
    closes_connection: bool = False

    def __init__(self, message: str, *, param: str | None = None, retry_after: float | None = None) -> None:
        message = unsecret(message)
        super().__init__(message)
        self.message = message
        self.param = unsecret(param) if param is not None else None
        self.retry_after = retry_after
        self.extra_headers: dict[str, str] | None = None

    def headers(self) -> dict[str, str]:
        headers = {"connection": "close"} if self.closes_connection else {}
        if self.extra_headers:
            headers.update(self.extra_headers)
        if self.retry_after is not None:
            headers["retry-after"] = str(max(1, math.ceil(self.retry_after)))
        return headers


class InvalidRequest(GatewayError):
    status_code = 400
    type = "invalid_request_error"

    def renamed(self, param: str) -> InvalidRequest:
        """The same refusal naming its field `param` (its message starts with the field's name)."""
        old = self.param or ""
        message = param + self.message[len(old) :] if self.message.startswith(old) else self.message
        error = InvalidRequest(message, param=param, retry_after=self.retry_after)
        error.extra_headers = self.extra_headers
        return error


class AuthenticationFailed(GatewayError):
    status_code = 401
    type = "authentication_error"


class PermissionDenied(GatewayError):
    status_code = 403
    type = "permission_error"


class NotFound(GatewayError):
    status_code = 404
    type = "not_found_error"


class MethodNotAllowed(GatewayError):
    status_code = 405
    type = "invalid_request_error"

    def __init__(self, message: str, *, allow: str) -> None:
        super().__init__(message)
        self.allow = allow

    def headers(self) -> dict[str, str]:
        return {**super().headers(), "allow": self.allow}


class RequestTimeout(GatewayError):
    status_code = 408
    type = "invalid_request_error"
    closes_connection = True


class PayloadTooLarge(GatewayError):
    status_code = 413
    type = "invalid_request_error"
    closes_connection = True


def too_large(limit: int) -> str:
    """The 413's message: the limit it broke, so a client knows how far to shrink (a 20 MB image
    was told only "too large"; `[server] max_body_bytes`)."""
    return f"request body too large (the limit is {limit} bytes)"


class DeclaredTooLarge(PayloadTooLarge):
    """The 413 for a body declared over the limit, answered once its first piece is in
    (`app.edge.asgi.read_body`): the connection reads the rest and drops it for a while
    (`app.edge.connection.DRAIN_S`), so that a client still writing gets it instead of a reset."""

    closes_connection = False


class UnsupportedMediaType(GatewayError):
    status_code = 415
    type = "invalid_request_error"
    closes_connection = True


class HeadersTooLarge(GatewayError):
    status_code = 431
    type = "invalid_request_error"
    closes_connection = True


class AtCapacity(GatewayError):
    status_code = 429
    type = "rate_limit_error"


class KeyRateLimited(GatewayError):
    status_code = 429
    type = "rate_limit_error"


class BudgetExceeded(GatewayError):
    status_code = 429
    type = "insufficient_quota"


class LimitsUnavailable(GatewayError):
    status_code = 503
    type = "unavailable"


class DatabaseUnavailable(GatewayError):
    """A read the answer needs (a report, the keys) found the database unreachable."""

    status_code = 503
    type = "unavailable"
    MESSAGE = "the database cannot be reached; try again shortly"


class AllBackendsFailed(GatewayError):
    status_code = 502
    type = "upstream_error"


class NoBackendAvailable(GatewayError):
    status_code = 503
    type = "unavailable"


class GatewayShort(GatewayError):
    """Every attempt failed on the gateway's own resources (descriptors, buffers: `Failure.LOCAL`),
    not on an upstream's: no backend was cooled down; the client may retry in a second."""

    status_code = 503
    type = "unavailable"


class UsageNotRecordable(GatewayError):
    """cost.md: a request whose ledger row cannot be journaled is not served (`[ledger] required`)."""

    status_code = 503
    type = "unavailable"


class UpstreamTimeout(GatewayError):
    status_code = 504
    type = "upstream_error"


class InternalError(GatewayError):
    status_code = 500
    type = "internal_error"


class OpenAIErrorView(Struct, omit_defaults=True):
    message: str
    type: str
    code: int
    request_id: str
    param: str | None = None


class FabroErrorEntry(Struct):
    status: str
    title: str
    detail: str
    code: str
    request_id: str


class ErrorBody(Struct):
    error: OpenAIErrorView
    errors: list[FabroErrorEntry]
    request_id: str


class StreamErrorView(Struct):
    message: str
    type: str
    code: int


_encoder = msgspec.json.Encoder()


def error_body(exc: GatewayError, request_id: str) -> bytes:
    title = HTTPStatus(exc.status_code).phrase
    body = ErrorBody(
        error=OpenAIErrorView(
            message=exc.message, type=exc.type, code=exc.status_code, request_id=request_id, param=exc.param
        ),
        errors=[
            FabroErrorEntry(
                status=str(exc.status_code), title=title, detail=exc.message, code=exc.type, request_id=request_id
            )
        ],
        request_id=request_id,
    )
    return _encoder.encode(body)


def stream_error_view(exc: GatewayError) -> StreamErrorView:
    return StreamErrorView(message=exc.message, type=exc.type, code=exc.status_code)
