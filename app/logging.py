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
import atexit
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import MutableMapping
from typing import Any, BinaryIO

import msgspec
import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_encoder = msgspec.json.Encoder()
_REQUEST_LINE = b'{"event":"request","level":"info","timestamp":"%b",%b'
_DROPPED = b'{"event":"log_lines_dropped","level":"warning","timestamp":"%b","lines":%d}\n'
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
    64 KiB of lines, is flushed at once.

    The write itself is the writer thread's, never the event loop's: stdout is usually a pipe (a
    container runtime's, journald's, a `| tee`), and a reader that falls behind fills it (64 KiB);
    a blocking write from the loop then froze the whole process, every stream mid-token, health
    checks too (`switchyard serve` with its stdout unread stopped at its 72nd request). Lines wait
    for a stalled reader up to `BACKLOG` bytes; past that they are dropped and counted (`dropped`),
    and a line saying how many goes out once the reader is back."""

    _LIMIT = 64 * 1024
    BACKLOG = 16 << 20  # bytes waiting for a stalled output; more are dropped

    def __init__(self, file: BinaryIO, *, level: str = "info") -> None:
        self._file = file
        self._pending: list[bytes] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None
        self.stamp = _Timestamp()
        self.info_enabled = _LEVELS[level] <= logging.INFO
        self.dropped = 0  # lines dropped for a stalled output (class doc)
        self._reported = 0  # of `dropped`, those a line has said: the writer's, whichever thread it is
        self._queue: deque[bytes] = deque()  # handed to the writer thread, not yet written
        self._queued = 0
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False  # `stop`: the thread ends once the queue is empty
        self._exit_hook = False

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
            self.hand_off()

    def err(self, message: bytes) -> None:
        self._pending.append(message)
        self.hand_off()

    debug = info = warning = msg
    error = critical = exception = fatal = err

    def flush(self, within: float = 5.0) -> None:
        """Write the lines so far, waiting up to `within` seconds for them to be out: a command's
        or a test's flush, not the event loop's (`hand_off`)."""
        self.hand_off()
        self.drain(within)

    def hand_off(self) -> None:
        """Hand the lines to the writer thread (class doc); never waits for the output."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []  # a line another thread adds meanwhile is in one or the other
        self._size = 0
        count = len(pending)
        data = b"\n".join(pending) + b"\n"
        with self._ready:
            if self._queued + len(data) > self.BACKLOG:
                self.dropped += count
                return
            self._queue.append(data)
            self._queued += len(data)
            self._ready.notify()
            if self._thread is None:
                self._stopping = False
                self._thread = threading.Thread(target=self._write, name="log-lines", daemon=True)
                self._thread.start()
                if not self._exit_hook:
                    self._exit_hook = True
                    atexit.register(self.drain, 1.0)

    def _write(self) -> None:
        """The writer thread: the queue's lines out, in order, until `stop` with nothing left."""
        stamp = _Timestamp()
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._queue or self._stopping)
                if not self._queue:
                    self._thread = None
                    return
                data, dropped = self._queue[0], self.dropped
            out = data
            if dropped != self._reported:
                out += _DROPPED % (stamp.text().encode(), dropped - self._reported)
                self._reported = dropped
            try:
                self._file.write(out)
                self._file.flush()
            except (OSError, ValueError):  # the output is gone: nothing more can be written
                pass
            with self._ready:
                self._queue.popleft()
                self._queued -= len(data)
                self._ready.notify_all()

    def drain(self, within: float) -> None:
        """Wait up to `within` seconds for the lines handed over to be written (at shutdown)."""
        with self._ready:
            self._ready.wait_for(lambda: not self._queue, within)

    def flush_every(self, interval: float) -> None:
        """Flush every `interval` seconds on the running loop until `stop`."""
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.hand_off()
            self._timer = loop.call_later(interval, tick)

        self._timer = loop.call_later(interval, tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush(1.0)
        with self._ready:
            self._stopping = True
            self._ready.notify_all()


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


def route_stdlib_logging(level: str) -> None:
    """The standard `logging` module's records (`warning` and above: httpx, say, logs every request
    at `info`) and `warnings.warn` as the service's JSON lines: for the process `switchyard serve`
    owns (`app.cli`, and its workers' `create_app_from_env`), not in `create_app`, which an
    application of its own may call: its root logger's level and handlers, and its warnings, stay
    its own. The level is the handler's, so the root logger's is left as it is."""
    _FROM_STDLIB.setLevel(max(_LEVELS[level], logging.WARNING))
    root = logging.getLogger()
    if _FROM_STDLIB not in root.handlers:
        root.addHandler(_FROM_STDLIB)
    logging.captureWarnings(True)
    threading.excepthook = _thread_died  # Python's own tracebacks, printed on stderr over many lines
    sys.unraisablehook = _unraisable


def _thread_died(args: threading.ExceptHookArgs) -> None:
    """An exception that ended a thread (the ledger's writer, say), as a JSON line."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
    logging.getLogger("py.threading").error("Exception in thread %s", name, exc_info=exc_info)  # type: ignore[arg-type]


def _unraisable(args: Any) -> None:
    """An exception Python could not raise (in a `__del__`, a finalizer), as a JSON line."""
    exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
    message = f"{args.err_msg or 'Exception ignored in'}: {args.object!r}"
    logging.getLogger("py.unraisable").error(message, exc_info=exc_info)


def configure_logging(level: str) -> LineWriter:
    """The service's JSON lines on stdout, from structlog (`route_stdlib_logging`: the standard
    `logging` module's too)."""
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
