"""rev3 review: the lines a stalled output made the `LineWriter` drop are said once. The count
already said was the writer thread's own, so a thread started again after `stop` (a shutdown's
error line, say) said every earlier drop a second time."""

from __future__ import annotations

import io
import threading

import msgspec

from app.logging import LineWriter


class _Stalled(io.BytesIO):
    """An output whose reader is away until `back` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.back = threading.Event()

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.back.wait(5.0)
        return super().write(data)


def _said(sink: io.BytesIO) -> int:
    lines = [msgspec.json.decode(line) for line in sink.getvalue().splitlines() if line.startswith(b"{")]
    return sum(line["lines"] for line in lines if line["event"] == "log_lines_dropped")


def test_dropped_lines_are_said_once_across_a_restarted_writer_thread() -> None:
    sink = _Stalled()
    writer = LineWriter(sink)
    writer.BACKLOG = 64  # type: ignore[misc]
    for i in range(10):
        writer.err(b"line %d %s" % (i, b"x" * 20))
    assert writer.dropped > 0
    sink.back.set()
    thread = writer._thread
    writer.stop()
    assert thread is not None
    thread.join(5.0)  # the writer thread ends with the stop
    assert _said(sink) == writer.dropped
    writer.err(b"after the stop")  # a new writer thread
    writer.flush()
    assert b"\nafter the stop\n" in sink.getvalue()
    assert _said(sink) == writer.dropped
