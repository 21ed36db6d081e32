"""Request ids are RFC 9562 UUIDv7: version 7, RFC variant, and sortable by creation time."""

from __future__ import annotations

import time
import uuid

from app.ids import uuid7
from tests.support.waiting import wait_until_sync


def _millis(value: str) -> int:
    """The id's 48-bit Unix millisecond timestamp."""
    return int(value.replace("-", "")[:12], 16)


def test_uuid7_layout_and_time_order() -> None:
    first = uuid7()
    wait_until_sync(lambda: time.time_ns() // 1_000_000 > _millis(first), within=1.0, interval=0.0005)
    second = uuid7()  # a later millisecond: the order must come from the timestamp
    for value in (first, second):
        parsed = uuid.UUID(value)
        assert str(parsed) == value
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
    assert first < second
    assert abs(_millis(first) - time.time_ns() // 1_000_000) < 5_000


def test_uuid7_is_unique() -> None:
    assert len({uuid7() for _ in range(10_000)}) == 10_000


def test_uuid7_random_bits_span_pool_refills() -> None:
    """Ids drawn across several 4 KiB refills keep 74 random bits each: no short slice at a
    pool's end (4096 is not a multiple of 10), every id valid and distinct."""
    ids = [uuid7() for _ in range(2_000)]
    assert len(set(ids)) == len(ids)
    random_parts = {value.replace("-", "")[13:] for value in ids}  # after the version nibble
    assert len(random_parts) == len(ids)
    for value in ids:
        parsed = uuid.UUID(value)
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122


def test_forked_child_does_not_repeat_parent_ids() -> None:
    import os

    uuid7()  # the pool is filled and partly used
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        os.write(write_end, "\n".join(uuid7() for _ in range(50)).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child = set(pipe.read().split("\n"))
    os.waitpid(pid, 0)
    parent = {uuid7() for _ in range(50)}
    assert len(child) == 50

    def random_bits(ids: set[str]) -> set[str]:
        return {value.replace("-", "")[13:] for value in ids}

    assert not random_bits(child) & random_bits(parent)


def test_every_random_digit_of_uuid7_varies() -> None:
    """The 74 random bits are spread over the id's digits (after the version nibble, the variant's
    digit, the rest): across 2,000 ids every random digit takes most of its 16 values, and the
    variant's digit each of its four (8, 9, a, b: the variant's `10` then two random bits)."""
    digits = [value.replace("-", "") for value in (uuid7() for _ in range(2_000))]
    assert {value[12] for value in digits} == {"7"}
    assert {value[16] for value in digits} == set("89ab")
    for position in [*range(13, 16), *range(17, 32)]:
        assert len({value[position] for value in digits}) >= 14, position
