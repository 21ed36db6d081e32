"""Incremental Server-Sent Events parsing: network reads in, complete `data` payloads out.

Upstreams frame their streams as SSE, and a gateway sees them in arbitrary network reads: an event
may span reads, a `\\r\\n` may be split between two, a UTF-8 character may be cut in half. The
parser owns that framing and nothing else: it knows no JSON and no `[DONE]`.

What it implements of the WHATWG event-stream grammar:
- lines end in `\\n`, `\\r\\n` or a bare `\\r`; a blank line dispatches the event;
- `data:` lines (one optional space after the colon) are joined with `\\n`;
- comment lines (`: ping`) and the `event:`, `id:` and `retry:` fields are skipped;
- an event without a `data` line dispatches nothing, except one with an `error:` field: llama.cpp's
  `llama-server` (late 2024 to October 2025) streamed its errors as `error: {json}` lines, then
  `data: [DONE]`, so such an event is dispatched as `{"error": <its value>}`, the payload of the
  in-stream error chunk every other server sends (`data: {"error": …}`); read as a field it would
  be skipped, and a cut-off answer would look finished;
- a leading UTF-8 byte-order mark is dropped, also one cut between reads;
- an event still without its blank line past `MAX_EVENT_BYTES` raises `EventTooLarge` (the adapter:
  a malformed answer): an upstream that never ended one held its reads until the attempt's total
  timeout.

Speed matters: this runs for every read of every stream. It works on bytes, splits the buffer at
`\\n\\n` with one C-level call, and takes a single-line `data: ...` event (what every OpenAI-style
server sends) without looking at lines at all. Line endings are normalised only when a `\\r` is
present; a read that ends in `\\r` ends its line at once, and a `\\n` opening the next read is
then dropped as the second half of that `\\r\\n`. Only each new read is scanned: the event still
open grows in place, in one `bytearray` (copied and scanned again at every read, an event of a few
megabytes in 16 kB reads cost seconds; kept as a list of its reads, one held in one-byte reads took
forty times its size).
"""

from __future__ import annotations

import json

_BOM = b"\xef\xbb\xbf"
MAX_EVENT_BYTES = 8 << 20  # one event (its data lines) may not grow past this without its blank line


class EventTooLarge(ValueError):
    """An event that went on past `MAX_EVENT_BYTES` without ending (the adapter: a malformed answer)."""


class SSEParser:
    """Feed it raw reads; it returns the `data` of each event completed by those reads."""

    __slots__ = ("_head", "_pending", "_skip_lf", "_started")

    def __init__(self) -> None:
        self._pending = bytearray()  # the event still open, normalised: grown in place, never scanned again
        self._skip_lf = False
        self._started = False
        self._head = b""  # the stream's first bytes while they may still be a cut byte-order mark

    def feed(self, data: bytes) -> list[str]:
        """The payloads of the events that `data` completes, in order."""
        if (
            not self._pending
            and data.startswith(b"data: ")
            and data.find(b"\n") == len(data) - 2
            and data.endswith(b"\n\n")
            and self._started
            and not self._skip_lf
            and b"\r" not in data
        ):
            return [data[6:-2].decode("utf-8", "replace")]  # one whole single-line event: the usual read
        if not self._started:
            data, self._head = self._head + data, b""
            if _BOM.startswith(data):  # nothing yet, or a mark cut between reads: wait for the rest
                self._head = data
                return []
            self._started = True
            if data.startswith(_BOM):
                data = data[3:]
        if self._skip_lf and data:
            self._skip_lf = False
            if data.startswith(b"\n"):
                data = data[1:]
        if b"\r" in data:  # what is pending is normalised already: only the new read is
            self._skip_lf = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        pending = self._pending
        if b"\n\n" not in data and not (pending and data.startswith(b"\n") and pending.endswith(b"\n")):
            if len(pending) + len(data) > MAX_EVENT_BYTES:
                raise EventTooLarge("upstream event too large")
            pending += data  # amortised: no copy of what is pending
            return []
        blocks: list[bytes] | list[bytearray]
        if pending:
            pending += data
            blocks = pending.split(b"\n\n")
            self._pending = blocks.pop()
        else:
            blocks = data.split(b"\n\n")
            self._pending = bytearray(blocks.pop())
        payloads: list[str] = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:
                payloads.append(block[6:].decode("utf-8", "replace"))
            elif block:
                payload = _event_data(block)
                if payload is not None:
                    payloads.append(payload)
        return payloads

    def finish(self) -> list[str]:
        """The payload of a last event the stream ended without a blank line after (at EOF)."""
        buffer, self._pending = self._pending, bytearray()
        self._skip_lf = False
        if not buffer:
            return []
        payload = _event_data(buffer.rstrip(b"\n"))
        return [] if payload is None else [payload]


def _event_data(block: bytes | bytearray) -> str | None:
    """The joined `data` of one event block (lines separated by `\\n`), or None if it has none
    (an `error:` field alone is an error chunk: the module docstring)."""
    data: list[bytes | bytearray] = []
    error: bytes | bytearray | None = None
    for line in block.split(b"\n"):
        if line.startswith(b"data"):
            if line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            elif line == b"data":
                data.append(b"")
        elif line.startswith(b"error:"):
            error = line[6:].strip()
    if not data:
        return None if not error else _error_payload(error.decode("utf-8", "replace"))
    return b"\n".join(data).decode("utf-8", "replace")


def _error_payload(value: str) -> str:
    """`{"error": value}` as JSON text: a JSON object as it came, anything else (a cut-off object
    too, which would read as a malformed answer) as a string."""
    if value.startswith("{"):
        try:
            json.loads(value)
        except ValueError:
            pass
        else:
            return '{"error":' + value + "}"
    return '{"error":' + json.dumps(value) + "}"
