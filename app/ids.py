"""Request ids: UUID version 7 (RFC 9562), so ids sort by creation time and index well.

Python 3.11's `uuid` has no `uuid7`; this is the RFC layout: 48 bits of Unix milliseconds, the
version nibble, 12 random bits, the variant bits, 62 random bits. Made as text directly (no
`uuid.UUID` object, no integer formatting): this runs once per request, and five `:0Nx` formats
were 1.6 µs of it (bench/RESULTS.md, 2026-12-04); the timestamp's six bytes and the random pool
are hex'd by `bytes.hex`, and the id is slices of the two.

The random bits come from the operating system's CSPRNG (`os.urandom`), read 4 KiB at a time: a
`getrandom` system call per id was a twentieth of a proxied request's CPU (py-spy). The pool is
per process (a forked child starts a new one), and every id consumes its own 10 bytes of it (20
hex digits, 74 bits used: 12 after the version nibble, two in the variant's digit, then 60).
"""

from __future__ import annotations

import os
import time

_POOL_BYTES = 4096
_POOL_DIGITS = 2 * _POOL_BYTES
_ID_DIGITS = 20  # 10 bytes


class _Random:
    __slots__ = ("offset", "pool")

    def __init__(self) -> None:
        self.pool = ""  # hex digits, two a byte
        self.offset = _POOL_DIGITS

    def reset(self) -> None:
        """A forked child must not hand out the bytes its parent already used."""
        self.offset = _POOL_DIGITS

    def take(self) -> str:
        """The next 10 random bytes, as 20 hex digits."""
        offset = self.offset
        if offset + _ID_DIGITS > _POOL_DIGITS:
            self.pool = os.urandom(_POOL_BYTES).hex()
            offset = 0
        self.offset = offset + _ID_DIGITS
        return self.pool[offset : offset + _ID_DIGITS]


_random = _Random()
os.register_at_fork(after_in_child=_random.reset)
_VARIANT = {digit: "89ab"[value & 3] for value, digit in enumerate("0123456789abcdef")}  # 10xx: two random bits
_time_ns = time.time_ns


def uuid7() -> str:
    millis = (_time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF).to_bytes(6, "big").hex()
    rand = _random.take()
    return f"{millis[:8]}-{millis[8:]}-7{rand[:3]}-{_VARIANT[rand[3]]}{rand[4:7]}-{rand[7:19]}"
