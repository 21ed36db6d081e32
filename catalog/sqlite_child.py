"""The SQLite ledger writer's own process (`main`), started and fed by
`catalog.ledger_store.SQLiteProcessStore`.

Why a process: SQLite does its work (binding, the INSERT, the roll-up upserts, the commit) in the
process that calls it, and the stdlib driver holds the GIL while it binds. On a thread of the
gateway that work shared the serving core and its interpreter: ≈ 75,000 instructions per row, the
ledger's whole cost on SQLite (bench/RESULTS.md). Here it runs beside the gateway, the way
PostgreSQL's server does for a PostgreSQL ledger; the gateway only joins the rows' journal lines
(JSON it has already made) into one document per batch and writes it to a pipe.

The conversation, on the child's stdin and stdout (`frame`: a 4-byte big-endian length, then the
bytes):
- the parent sends a `Setup` frame (the file and the rows' shape, `RowPlan`), then one frame per
  batch: the JSON array of its `LedgerRecord`s;
- the child answers each batch with one byte and a frame: `k` (written, one transaction with its
  roll-ups), `o` (an outage — SQLite locked past its busy timeout, I/O, no table yet — the same
  batch may succeed later) or `r` (the rows' own fault: a value the database refuses), then the
  error's type and message.

The child ignores SIGINT and SIGTERM (a Ctrl-C or a stop reaches the whole process group; the
batch in hand is finished, not torn) and exits at the end of its input: when the gateway closes
the pipe, or dies (`kill -9`), the child stops after the batch in hand. A batch it committed just
before the gateway died is still in the gateway's journal, and its replay skips the request ids
already present.
"""

from __future__ import annotations

import os
import signal
import struct
import sys
from typing import BinaryIO

import msgspec

from catalog.records import LedgerRecord
from catalog.sqlite_rows import RowPlan, SQLiteBatches, is_sqlite_outage

HEAD = struct.Struct(">I")
WRITTEN, OUTAGE, REFUSED = b"k", b"o", b"r"


class Setup(msgspec.Struct, frozen=True):
    path: str
    plan: RowPlan


def frame(data: bytes) -> bytes:
    return HEAD.pack(len(data)) + data


def _read_frame(source: BinaryIO) -> bytes | None:
    head = source.read(HEAD.size)
    if len(head) < HEAD.size:
        return None
    (size,) = HEAD.unpack(head)
    data = source.read(size)
    return data if len(data) == size else None


def serve(source: BinaryIO, sink: BinaryIO) -> None:
    """Write the batches read from `source` until its end, answering each on `sink`."""
    setup_frame = _read_frame(source)
    if setup_frame is None:
        return
    setup = msgspec.json.decode(setup_frame, type=Setup)
    batches = SQLiteBatches(setup.plan, setup.path)
    decode = msgspec.json.Decoder(list[LedgerRecord]).decode
    try:
        while (document := _read_frame(source)) is not None:
            try:
                batches.write(decode(document))
            except Exception as exc:  # every failure is answered; the parent sorts nothing by text
                kind = OUTAGE if is_sqlite_outage(exc) else REFUSED
                sink.write(kind + frame(f"{type(exc).__name__}: {exc}".encode()))
            else:
                sink.write(WRITTEN + frame(b""))
            sink.flush()
    finally:
        batches.disconnect()


def main() -> None:
    # What the server left inheritable is not the writer's: its listening socket, inherited through
    # uvloop's spawn, kept the port open after the server closed it (a drain's new connections hung
    # instead of being refused, and a new server could not bind the port until this process ended).
    open_fds = [int(name) for name in os.listdir("/proc/self/fd")] if os.path.isdir("/proc/self/fd") else [255]
    os.closerange(3, max(open_fds) + 1)  # not SC_OPEN_MAX: without close_range(2) each is a close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
