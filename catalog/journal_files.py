"""The journal's files: a segment (one open, locked file of rows), and what is done to its bytes
on disk — adopting a dead process's segment, reading rows back, fsync, free space, and putting a
segment back under its path when its file was deleted or replaced (`restored`). `catalog.journal`
keeps the order of rows across segments; these work on one file at a time."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from datetime import datetime
from pathlib import Path

import msgspec

from catalog.records import LedgerRecord

READ_CHUNK = 1 << 20
_decoder = msgspec.json.Decoder(LedgerRecord)
ROOM_DEFAULT = 16 << 20  # free bytes a broken journal waits for, or a quarter of a smaller volume


class Segment:
    """One segment file, open and locked by this process until it is deleted."""

    __slots__ = ("data_start", "fd", "first", "oldest", "path", "rows", "sealed", "size")

    def __init__(self, path: Path, fd: int, first: int, *, rows: int = 0, size: int = 0, data_start: int = 0) -> None:
        self.path = path
        self.fd = fd
        self.first = first  # seq of its first row
        self.rows = rows
        self.size = size  # bytes of whole lines: a torn tail (a crash mid-write) is never read
        self.data_start = data_start  # past the header line
        self.sealed = False
        self.oldest: datetime | None = None  # an adopted segment's first row's `finished_at`


def segment_path(directory: Path) -> Path:
    """A new segment's name: its creation time (adoption replays segments in name order) and pid."""
    return directory / f"ledger-{time.time_ns():019d}-{os.getpid()}.jsonl"


def room_to_write(directory: Path, min_free_bytes: int | None) -> bool:
    """Whether `min_free_bytes` are free to an unprivileged writer on the file system of
    `directory` (or its nearest existing parent). None: `ROOM_DEFAULT`, or a quarter of a volume
    smaller than four times that (a 2 MiB journal volume can never have 16 MiB free: once full, it
    stayed 503 until a restart). One that cannot say is taken as having room."""
    try:
        stats = os.statvfs(next(path for path in (directory, *directory.parents) if path.exists()))
    except (OSError, StopIteration):
        return True
    if min_free_bytes is None:
        min_free_bytes = min(ROOM_DEFAULT, stats.f_blocks * stats.f_frsize // 4)
    return stats.f_bavail * stats.f_frsize >= min_free_bytes


def moved(segment: Segment) -> bool:
    """Whether the segment's file is no longer at its path: deleted (the directory too), moved
    away, or another file put there. One that cannot be looked at (permissions) is left be."""
    try:
        return os.stat(segment.path).st_ino != os.fstat(segment.fd).st_ino
    except FileNotFoundError:
        return True
    except OSError:
        return False


def restored(source: int, size: int, path: Path, directory: Path) -> tuple[int, Path]:
    """A new file, opened and locked as a segment, holding the first `size` bytes of `source` (a
    segment whose file left its path): the same bytes, so its rows' seqs and offsets hold. At
    `path`, or under a fresh name when another file holds that one now (left as it is). Copied a
    chunk at a time (on the journal's thread); OSError when it cannot be made, nothing left then."""
    directory.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o640)
    except FileExistsError:
        path = segment_path(directory)
        fd = os.open(path, flags, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        copy_range(source, fd, 0, size)
    except OSError:
        discard(fd, path)
        raise
    return fd, path


def copy_range(source: int, target: int, start: int, end: int) -> None:
    """Bytes `start` to `end` of `source` appended to `target`; OSError when they do not all fit."""
    while start < end:
        chunk = os.pread(source, min(READ_CHUNK, end - start), start)
        if not chunk or os.write(target, chunk) != len(chunk):
            raise OSError(errno.ENOSPC, "short write copying a journal segment back")
        start += len(chunk)


def discard(fd: int, path: Path) -> None:
    os.close(fd)
    with contextlib.suppress(OSError):
        path.unlink()


def adopt(path: Path, first: int) -> Segment | None:
    """Open and lock a segment no live process holds; None when one does (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO by that name would block
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    found = os.fstat(fd)
    if found.st_nlink == 0 or not stat.S_ISREG(found.st_mode):  # replayed and deleted meanwhile; not a file
        os.close(fd)
        return None
    data = whole(fd)
    header_end = data.find(b"\n") + 1
    size = data.rfind(b"\n") + 1
    rows = data.count(b"\n", header_end, size) if header_end else 0
    segment = Segment(path, fd, first, rows=rows, size=size, data_start=header_end)
    segment.sealed = True
    if rows:
        with contextlib.suppress(msgspec.DecodeError):  # an unreadable line is set aside when read back
            oldest = _decoder.decode(data[header_end : data.find(b"\n", header_end)]).finished_at
            segment.oldest = oldest if oldest.tzinfo is not None else None  # a naive one: set aside when read
    return segment


def whole(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, READ_CHUNK, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def read_rows(fd: int, offset: int, end: int, skip: int, count: int) -> tuple[list[LedgerRecord], list[bytes], int]:
    """On the journal's thread: skip `skip` lines from `offset`, then decode `count` lines."""
    records: list[LedgerRecord] = []
    bad: list[bytes] = []
    buffer = b""
    while (skip or len(records) + len(bad) < count) and offset < end:
        chunk = os.pread(fd, min(READ_CHUNK, end - offset), offset)
        if not chunk:
            break
        buffer += chunk
        offset += len(chunk)
        start = 0
        while (newline := buffer.find(b"\n", start)) >= 0:
            line = buffer[start:newline]
            start = newline + 1
            if skip:
                skip -= 1
                continue
            try:
                records.append(_decoder.decode(line))
            except msgspec.DecodeError:
                bad.append(line)
            if len(records) + len(bad) == count:
                return records, bad, offset - (len(buffer) - start)
        buffer = buffer[start:]
    return records, bad, offset - len(buffer)


def fsync_all(fds: list[int], directory: Path) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
