"""rev2 review: the standard `logging` module's records reach the `LineWriter` from any thread (the
ledger's writer thread, a migration's): a flush on the event loop meanwhile must lose none."""

from __future__ import annotations

import io
import sys
import threading

from app.logging import LineWriter


def test_lines_from_another_thread_survive_a_concurrent_flush() -> None:
    sink = io.BytesIO()
    writer = LineWriter(sink)
    lines = 100_000
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as a loaded machine might
    try:
        other = threading.Thread(target=lambda: [writer.msg(b"t%d" % i) for i in range(lines)])
        other.start()
        for i in range(lines):
            writer.msg(b"m%d" % i)
            if i % 5 == 0:
                writer.flush()
        other.join()
    finally:
        sys.setswitchinterval(interval)
    writer.flush()
    assert sink.getvalue().count(b"\n") == 2 * lines
