"""The upstream JSON that msgspec refuses but that says what it means: read by the stdlib instead.

Three things an upstream sends that are no strict JSON text of UTF-8, and what each becomes:
- a lone UTF-16 surrogate escape (`"\\ud83d"`): a server that slices text by UTF-16 code units
  splits an emoji's pair between two chunks, or echoes such a half in an error message;
- bytes that are no UTF-8 (a token cut mid-character, a Latin-1 error page): U+FFFD each, as the
  event-stream parser reads the same bytes in a stream (`providers.sse`), so an answer never
  depends on whether it was streamed;
- a leading byte-order mark, which RFC 8259 lets a parser ignore (the event-stream parser drops
  one too).

`lenient_json(data)` is the error path only (of an answer, an error body, a model list: a body
msgspec decoded never comes here): the Python value, or None when the body has none of the three or
is not JSON all the same (NaN and Infinity included, which msgspec refuses too). Its strings may
still hold lone surrogates: `scrubbed` makes each pair the character it encodes and any other
surrogate U+FFFD (a JSON encoder refuses them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

BOM = b"\xef\xbb\xbf"
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE = re.compile("[\ud800-\udfff]")


def lenient_json(data: str | bytes, parse_float: Callable[[str], Any] = float) -> Any:
    """`data` decoded by the stdlib (module doc); None when it is no JSON for that reading either.
    `parse_float`: as `json.loads` takes it (`Decimal`, where msgspec's `float_hook` is)."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    if not (raw.startswith(BOM) or SURROGATE_ESCAPE.search(raw) is not None or not _is_utf8(raw)):
        return None
    try:
        return json.loads(
            raw.removeprefix(BOM).decode("utf-8", "replace"), parse_float=parse_float, parse_constant=_no_constant
        )
    except (ValueError, RecursionError):
        return None


def paired(text: str) -> str:
    """`text` with each surrogate pair made the character it encodes and any other surrogate U+FFFD."""
    if _LONE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def scrubbed(value: Any) -> Any:
    """`value` (decoded JSON) with every string `paired`."""
    if isinstance(value, str):
        return paired(value)
    if isinstance(value, list):
        return [scrubbed(item) for item in value]
    if isinstance(value, dict):
        return {paired(name): scrubbed(item) for name, item in value.items()}
    return value


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _no_constant(name: str) -> Any:
    raise ValueError(name)
