"""The period a cost report covers: `from` (inclusive) and `to` (exclusive), as cost.md's usage
report takes them — ISO 8601, the last 30 days by default.

Decisions where the spec is silent: a date (`2026-11-01`) is its midnight UTC; a time with no
offset is UTC (a report is about UTC buckets); with only `from`, the period runs to now; with only
`to`, it starts 30 days before it; `to` must be after `from`. A bad value raises `PeriodError`
naming the parameter, which the API answers with a 400 and the CLI with exit code 2.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from msgspec import Struct

DEFAULT_SPAN = timedelta(days=30)


class PeriodError(ValueError):
    """A bad `from` or `to`; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


class Period(Struct, frozen=True):
    start: datetime  # inclusive, aware UTC
    end: datetime  # exclusive, aware UTC


def parse_instant(param: str, value: str) -> datetime:
    """`value` (ISO 8601) as an aware UTC datetime; PeriodError naming `param` when it is not one."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise PeriodError(param, f"{param}: not an ISO 8601 date or time: {value[:64]!r}") from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def parse_period(start: str | None, end: str | None, now: datetime | None = None) -> Period:
    """The period `from`=`start`, `to`=`end`, either absent for its default."""
    moment = now or datetime.now(UTC)
    end_at = parse_instant("to", end) if end else moment
    start_at = parse_instant("from", start) if start else end_at - DEFAULT_SPAN
    if end_at <= start_at:
        raise PeriodError("to", "to: must be after from")
    return Period(start_at, end_at)
