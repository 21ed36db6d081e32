"""Request ids are RFC 9562 UUIDv7: version 7, RFC variant, and sortable by creation time."""

from __future__ import annotations

import time
import uuid

from app.ids import uuid7


def test_uuid7_layout_and_time_order() -> None:
    first = uuid7()
    time.sleep(0.002)
    second = uuid7()
    for value in (first, second):
        parsed = uuid.UUID(value)
        assert str(parsed) == value
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
    assert first < second
    millis = int(first.replace("-", "")[:12], 16)
    assert abs(millis - time.time_ns() // 1_000_000) < 5_000


def test_uuid7_is_unique() -> None:
    assert len({uuid7() for _ in range(10_000)}) == 10_000
