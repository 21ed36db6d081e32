"""The period a cost report covers: `from` (inclusive) and `to` (exclusive), as cost.md's usage
report takes them — ISO 8601, the last 30 days by default.

One parser for every report (usage, drift, GPU cost). Decisions where the spec is silent: a date
(`2026-11-01`) is its midnight UTC; a time with no offset is UTC (a report is about UTC buckets);
an empty value is absent; with only `from`, the period runs to now; with only `to`, it starts 30
days before it; `from` must be before `to`. A bad value raises `QueryError` naming the parameter,
which the API answers with a 400 and the CLI with exit code 2.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from msgspec import Struct

DEFAULT_SPAN = timedelta(days=30)
# Instants a report takes: what `datetime` holds, less a margin for the arithmetic done on them
# (UTC conversion, the 30-day default, rounding to hours and days). Beyond: a 400, not an overflow.
EARLIEST = datetime(1, 2, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 1, tzinfo=UTC)


class QueryError(ValueError):
    """A bad report parameter; `param` is its name as the caller wrote it, and `message` starts
    with it. `other`: the one other parameter the message names, quoted (`'to'`)."""

    def __init__(self, param: str, message: str, other: str | None = None) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = f"{param}: {message}"
        self._detail, self._other = message, other

    def for_cli(self) -> str:
        """The message in the CLI's words, its parameters named as options: `--from: must be
        before --to` (the API's `from: must be before 'to'`)."""
        detail = self._detail
        if self._other is not None:
            detail = detail.replace(repr(self._other), option(self._other))
        return f"{option(self.param)}: {detail}"


def option(param: str) -> str:
    """A report parameter's command-line option: `group_by` → `--group-by`."""
    return "--" + param.replace("_", "-")


class Period(Struct, frozen=True):
    start: datetime  # inclusive, aware UTC
    end: datetime  # exclusive, aware UTC


def parse_instant(param: str, value: str) -> datetime:
    """`value` (ISO 8601) as an aware UTC datetime; QueryError naming `param` when it is not one."""
    try:
        parsed = datetime.fromisoformat(value)
        instant = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except ValueError:
        raise QueryError(param, f"not an ISO 8601 date or time: {value[:64]!r}") from None
    except OverflowError:  # an offset that moves it out of the years 1 to 9999
        instant = None
    if instant is None or not EARLIEST <= instant < LATEST:
        raise QueryError(param, f"out of range: {value[:64]!r} (from 0001-02-01, up to but not including 9999-12-01)")
    return instant


def parse_period(start: str | None, end: str | None, now: datetime | None = None) -> Period:
    """The period `from`=`start`, `to`=`end`, either absent for its default."""
    start, end = (start or "").strip(), (end or "").strip()
    end_at = parse_instant("to", end) if end else (now or datetime.now(UTC))
    start_at = parse_instant("from", start) if start else end_at - DEFAULT_SPAN
    if start_at >= end_at:
        raise QueryError("from", "must be before 'to'", other="to")
    return Period(start_at, end_at)
