"""rev2 review: README says nothing reaches stderr once `serve` runs and no line spans several; a
thread that died and an exception Python could not raise (a `__del__`) printed tracebacks there."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import script_lines

ESCAPED = """
import sys, threading
from app.cli import _uvicorn_config
from app.settings import load_settings

_uvicorn_config(load_settings(sys.argv[1]), "127.0.0.1", 0)  # what `serve` runs before uvicorn starts

def fail():
    raise RuntimeError("in a thread")

thread = threading.Thread(target=fail, name="ledger")
thread.start()
thread.join()

class Leaky:
    def __del__(self):
        raise ValueError("in a finalizer")

Leaky()
import structlog
structlog.get_logger().error("flushed")  # an error line flushes the writer
"""


def test_a_dead_thread_and_an_unraisable_exception_are_json_lines(tmp_path: Path) -> None:
    lines = script_lines(tmp_path, ESCAPED)
    assert [(line.get("logger"), line["exception"].splitlines()[-1]) for line in lines[:2]] == [
        ("py.threading", "RuntimeError: in a thread"),
        ("py.unraisable", "ValueError: in a finalizer"),
    ]
