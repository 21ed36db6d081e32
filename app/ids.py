"""Request ids: UUID version 7 (RFC 9562), so ids sort by creation time and index well.

Python 3.11's `uuid` has no `uuid7`; this is the RFC layout: 48 bits of Unix milliseconds, the
version nibble, 12 random bits, the variant bits, 62 random bits.
"""

from __future__ import annotations

import os
import time
import uuid


def uuid7() -> str:
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76
    value |= (rand >> 62 & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & 0x3FFF_FFFF_FFFF_FFFF
    return str(uuid.UUID(int=value))
