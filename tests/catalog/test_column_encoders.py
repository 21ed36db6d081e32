"""The one-call encoders of `catalog.tables` agree with the plain formulas they replace.

The ledger stores through `UTCDateTime.sqlite_text` and `ExactDecimal.quantize/sqlite_text` (fast
paths: msgspec's formatter, one quantize whose context precision is the column's). Each is checked
here against the obvious definition over many seeded random values and the edge cases: a whole
second, offsets, years 1 and 9999; ties, a carry into one integer digit too many, NaN, infinities.
"""

from __future__ import annotations

import decimal
import random
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from catalog.tables import ExactDecimal, UTCDateTime

_WIDE = decimal.Context(prec=80, rounding=decimal.ROUND_HALF_EVEN, traps=[decimal.InvalidOperation])


def reference_text(value: Decimal, precision: int, scale: int) -> str | None:
    """Rounded half-even to `scale` places in fixed notation, or None when it does not fit."""
    if not value.is_finite():
        return None
    rounded = value.quantize(Decimal(1).scaleb(-scale), context=_WIDE)
    return None if rounded.adjusted() >= precision - scale else format(rounded, "f")


def encoded(column: ExactDecimal, value: Decimal) -> str | None:
    try:
        return column.sqlite_text(value)
    except ValueError:
        return None


def random_decimals(seed: int, count: int) -> list[Decimal]:
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    values = []
    for _ in range(count):
        digits = str(rng.randrange(10 ** rng.randint(1, 40)))
        exponent = rng.randint(-40, 12)
        if rng.random() < 0.3:  # a tie at some digit
            digits, exponent = digits + "5", exponent - 1
        values.append(Decimal((rng.randint(0, 1), tuple(map(int, digits)), exponent)))
    return values


EDGES = [
    "0",
    "-0",
    "0E+40",
    "0E-40",
    "1E-18",
    "5E-19",
    "15E-19",
    "25E-19",
    "-25E-19",
    "999999999999.9999999999999999995",
]
EDGES += ["999999999999.999999999999999999", "1000000000000", "NaN", "-NaN", "sNaN", "Infinity", "-Infinity"]


@pytest.mark.parametrize(("precision", "scale"), [(30, 18), (20, 10)])
def test_decimal_text_is_the_rounded_fixed_notation(precision: int, scale: int) -> None:
    column = ExactDecimal(precision, scale)
    values = [Decimal(edge) for edge in EDGES] + random_decimals(precision, 20_000)
    mismatches = [v for v in values if encoded(column, v) != reference_text(v, precision, scale)]
    assert mismatches == []


def test_decimal_refusals_say_why() -> None:
    column = ExactDecimal(30, 18)
    with pytest.raises(ValueError, match="not a finite decimal"):
        column.quantize(Decimal("NaN"))
    with pytest.raises(ValueError, match="more than 12 integer digits"):
        column.quantize(Decimal("999999999999.9999999999999999995"))  # rounds up to 13 digits
    assert column.quantize(Decimal("2.5E-18")) == Decimal("2E-18")  # half-even


def random_moments(seed: int, count: int) -> list[datetime]:
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    base = datetime(2026, 11, 30, tzinfo=UTC)
    moments = []
    for _ in range(count):
        moment = base + timedelta(microseconds=rng.randint(-(10**16), 10**16))
        if rng.random() < 0.2:
            moment = moment.replace(microsecond=0)
        if rng.random() < 0.3:
            moment = moment.astimezone(timezone(timedelta(minutes=rng.randint(-900, 900))))
        moments.append(moment)
    return moments


def test_timestamp_text_is_naive_utc_with_microseconds() -> None:
    edges = [datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)]
    edges.append(datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(hours=-5))))
    moments = edges + random_moments(7, 20_000)
    expected = [m.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds") for m in moments]
    assert [UTCDateTime.sqlite_text(m) for m in moments] == expected


def test_naive_timestamps_are_refused() -> None:
    with pytest.raises(ValueError, match="naive datetime"):
        UTCDateTime.sqlite_text(datetime(2026, 1, 1))
