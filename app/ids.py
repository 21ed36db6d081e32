"""Request ids: UUID version 7 (RFC 9562), so ids sort by creation time and index well.

Python 3.11's `uuid` has no `uuid7`; this is the RFC layout: 48 bits of Unix milliseconds, the
version nibble, 12 random bits, the variant bits, 62 random bits. Formatted directly from the
integers (no `uuid.UUID` object): this runs once per request.
"""

from __future__ import annotations

import os
import time


def uuid7() -> str:
    millis = time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF
    rand = int.from_bytes(os.urandom(10), "big")
    rand_a = rand >> 68 & 0xFFF
    rand_b = rand & 0x3FFF_FFFF_FFFF_FFFF
    return (
        f"{millis >> 16:08x}-{millis & 0xFFFF:04x}-{0x7000 | rand_a:04x}-"
        f"{0x8000 | rand_b >> 48:04x}-{rand_b & 0xFFFF_FFFF_FFFF:012x}"
    )
