"""Request ids: UUID version 7 (RFC 9562), so ids sort by creation time and index well.

Python 3.11's `uuid` has no `uuid7`; this is the RFC layout: 48 bits of Unix milliseconds, the
version nibble, 12 random bits, the variant bits, 62 random bits. Formatted directly from the
integers (no `uuid.UUID` object): this runs once per request.

The random bits come from the operating system's CSPRNG (`os.urandom`), read 4 KiB at a time: a
`getrandom` system call per id was a twentieth of a proxied request's CPU (py-spy). The pool is
per process (a forked child starts a new one), and every id consumes its own 10 bytes of it.
"""

from __future__ import annotations

import os
import time

_POOL_BYTES = 4096
_ID_BYTES = 10


class _Random:
    __slots__ = ("offset", "pool")

    def __init__(self) -> None:
        self.pool = b""
        self.offset = _POOL_BYTES

    def reset(self) -> None:
        """A forked child must not hand out the bytes its parent already used."""
        self.offset = _POOL_BYTES

    def take(self) -> int:
        offset = self.offset
        if offset + _ID_BYTES > _POOL_BYTES:
            self.pool = os.urandom(_POOL_BYTES)
            offset = 0
        self.offset = offset + _ID_BYTES
        return int.from_bytes(self.pool[offset : offset + _ID_BYTES], "big")


_random = _Random()
os.register_at_fork(after_in_child=_random.reset)


def uuid7() -> str:
    millis = time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF
    rand = _random.take()
    rand_a = rand >> 68 & 0xFFF
    rand_b = rand & 0x3FFF_FFFF_FFFF_FFFF
    return (
        f"{millis >> 16:08x}-{millis & 0xFFFF:04x}-{0x7000 | rand_a:04x}-"
        f"{0x8000 | rand_b >> 48:04x}-{rand_b & 0xFFFF_FFFF_FFFF:012x}"
    )
