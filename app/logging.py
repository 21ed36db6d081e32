"""Structured logging: JSON lines through structlog, one canonical line per request.

Configured once by `create_app` from `Settings` (nothing at import time). The canonical line
(`event="request"`) of a routed request is its ledger row (`LineWriter.request_line`: request id,
start and finish, key id and owner, ingress, model, provider, upstream model and request id,
status and error, the five token buckets, cost, its source and price row, latency, time to first
token, attempts); one rejected before routing gets a shorter line from the error renderer. Never
prompts, request bodies or secrets. Hot paths (per streamed chunk) do not log.

The processor chain is kept short because it runs on every request: msgspec encodes the line
(stdlib `json` plus structlog's ISO timestamper cost about a sixth of a proxied request's CPU,
measured under load), and the timestamp's seconds part is formatted once per second.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import MutableMapping
from typing import Any, BinaryIO

import msgspec
import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_encoder = msgspec.json.Encoder()
_REQUEST_LINE = b'{"event":"request","level":"info","timestamp":"%b",%b'
_MILLIS = tuple(f".{millis:03d}Z" for millis in range(1000))  # a timestamp's ending, made once, not per line


class _Timestamp:
    """`2026-11-30T01:02:03.456Z`, UTC, with the formatted second cached."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def text(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return self._prefix + _MILLIS[int((now - second) * 1000)]

    def __call__(self, _logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event_dict["timestamp"] = self.text()
        return event_dict


def _render(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> bytes:
    return _encoder.encode(event_dict)


class LineWriter:
    """structlog's logger: lines collect in memory and leave in one write per flush. A write system
    call per request was a tenth of a proxied request's CPU, and `PYTHONUNBUFFERED=1` (common in
    containers) makes stdout's own buffer a pass-through, so the buffering is done here. The app's
    lifespan runs `flush_every`, so lines leave within a fraction of a second; an error line, or
    64 KiB of lines, is flushed at once."""

    _LIMIT = 64 * 1024

    def __init__(self, file: BinaryIO, *, level: str = "info") -> None:
        self._file = file
        self._pending: list[bytes] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None
        self.stamp = _Timestamp()
        self.info_enabled = _LEVELS[level] <= logging.INFO

    def request_line(self, record_json: bytes) -> None:
        """The canonical `request` line of a routed request: the ledger row's own JSON (the bytes
        the journal writes, encoded once per request) behind the `event`, `level` and `timestamp`
        every line carries. Through structlog's chain (a bound method, the processors, a dict per
        line) the same line cost about 6 µs a request, a fortieth of a proxied request's CPU; this
        costs a concatenation. Nothing when the level is above `info`."""
        if self.info_enabled:
            self.msg(_REQUEST_LINE % (self.stamp.text().encode(), record_json[1:]))

    def msg(self, message: bytes) -> None:
        self._pending.append(message)
        self._size += len(message) + 1
        if self._size >= self._LIMIT:
            self.flush()

    def err(self, message: bytes) -> None:
        self._pending.append(message)
        self.flush()

    debug = info = warning = msg
    error = critical = exception = fatal = err

    def flush(self) -> None:
        if not self._pending:
            return
        data = b"\n".join(self._pending) + b"\n"
        self._pending.clear()
        self._size = 0
        self._file.write(data)
        self._file.flush()

    def flush_every(self, interval: float) -> None:
        """Flush every `interval` seconds on the running loop until `stop`."""
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.flush()
            self._timer = loop.call_later(interval, tick)

        self._timer = loop.call_later(interval, tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()


class _FromStdlib(logging.Handler):
    """What reaches the standard `logging` module — uvicorn's own lines (an exception that escaped
    the app, with its traceback), the libraries' warnings, `warnings.warn` — as the service's JSON
    lines, `logger` naming where it came from: they went to stderr as plain text (a traceback over
    many lines), which a line-oriented shipper cut into pieces."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            extra: dict[str, Any] = {"logger": record.name}
            if record.exc_info:
                extra["exc_info"] = record.exc_info
            level = min(max(record.levelno, logging.DEBUG), logging.CRITICAL) // 10 * 10
            structlog.get_logger(record.name).log(level, record.getMessage().strip(), **extra)
        except Exception:
            self.handleError(record)


_FROM_STDLIB = _FromStdlib()


def configure_logging(level: str) -> LineWriter:
    """The service's JSON lines on stdout, for structlog and the standard `logging` module alike
    (which passes on `warning` and above: httpx, say, logs every request at `info`)."""
    root = logging.getLogger()
    if _FROM_STDLIB not in root.handlers:
        root.addHandler(_FROM_STDLIB)
    root.setLevel(max(_LEVELS[level], logging.WARNING))
    logging.captureWarnings(True)
    writer = LineWriter(sys.stdout.buffer, level=level)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            writer.stamp,
            structlog.processors.format_exc_info,
            _render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=lambda *_args: writer,
        cache_logger_on_first_use=True,
    )
    return writer


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
