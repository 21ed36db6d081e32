"""What a JSON request's headers must say before its body is read: a 415 otherwise.

- `Content-Type` must be JSON: `application/json` or a `+json` type (`application/vnd.x+json`), with
  an optional `charset=utf-8` (JSON is UTF-8, RFC 8259; another charset is refused). A request
  without `Content-Type` is taken as JSON, so `curl --data-binary @body.json` works as is; but curl's
  `-d` default, `application/x-www-form-urlencoded`, like every other type, is a 415 that says
  which header to send — a form body silently parsed as JSON would hide the client's mistake.
- `Content-Encoding` must be absent or `identity`, and `Transfer-Encoding` name no coding but
  `chunked`: the gateway decodes no compressed bodies (a gzip body would otherwise be a confusing
  "not valid JSON", and inflating one is a way to turn a small request into a large allocation).

`check_json_headers(scope["headers"])` is called by each JSON door before it reads the body, so
the rejection costs no body read; the error closes the connection (the unread body goes with it).
It scans the ASGI header list once: a few comparisons per request.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.errors import UnsupportedMediaType, clip

_PLAIN_JSON = frozenset({b"application/json", b"application/json; charset=utf-8", b"application/json;charset=utf-8"})
_SEND_JSON = "send `content-type: application/json`"


def check_json_headers(headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Raise `UnsupportedMediaType` unless the body is declared (or left undeclared as) plain JSON."""
    for name, value in headers:
        if name == b"content-type":
            if value not in _PLAIN_JSON and not _is_json(value):
                shown = clip(value.decode("latin-1"))
                raise UnsupportedMediaType(f"content-type '{shown}' is not supported: {_SEND_JSON}")
        elif name == b"content-encoding" and value.strip().lower() not in (b"identity", b""):
            shown = clip(value.decode("latin-1"))
            raise UnsupportedMediaType(f"content-encoding '{shown}' is not supported: send the body uncompressed")
        elif name == b"transfer-encoding" and any(
            coding.strip() not in (b"chunked", b"identity", b"") for coding in value.lower().split(b",")
        ):
            shown = clip(value.decode("latin-1"))
            raise UnsupportedMediaType(f"transfer-encoding '{shown}' is not supported: send the body uncompressed")


def _is_json(value: bytes) -> bool:
    media_type, *params = value.lower().split(b";")
    kind, _, subtype = media_type.strip().partition(b"/")
    if kind != b"application" or not (subtype == b"json" or subtype.endswith(b"+json")):
        return False
    for param in params:
        key, _, val = param.strip().partition(b"=")
        if key == b"charset" and val.strip(b'" ') not in (b"utf-8", b"utf8"):
            return False
    return True
