"""What a usage report asks for and what it answers (cost.md "Reporting"): parsed once, shared by
`GET /api/v1/usage`, the spend page and `switchyard usage`.

`parse_query` turns the request's parameters (strings, as a query string or the command line
gives them) into a `UsageQuery`, or raises `QueryError` naming the bad parameter. Choices where
cost.md is silent:
- `from`/`to` as every report takes them (`catalog.report_period`): a date (midnight UTC) or an
  ISO 8601 date-time, UTC without an offset; the 30 days before now by default.
- A filter takes one value or several, comma-separated (`model=a,b`); an empty value is no filter
  (what an empty field of the page's form sends). `api` filters too, like the other group-bys.
  A value holding a comma (an owner is free text: `team, EU`) writes it `\\,`, and a backslash
  before a comma `\\\\` (`owner=team\\, EU`); any other backslash is itself.
- An unknown parameter is a 400: a misspelt filter (`modle=x`) would otherwise report everything.
- `group_by` values are kept in the order given; a repeated one counts once.
- `latency=false` (the command's `--no-latency`) leaves the p50/p95 out where they would come:
  they are exact values over the period's raw rows (seconds at ten million rows), while every
  other figure comes from the roll-ups (milliseconds). `true` is the default, as cost.md asks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, unquote_to_bytes

import msgspec

from catalog.report_period import QueryError, parse_period

GROUPS = ("model", "provider", "key", "owner", "api", "day", "hour", "status")
TIME_GROUPS = frozenset({"day", "hour"})
FILTERS = ("model", "provider", "key", "owner", "api", "status")
STATUSES = ("ok", "error", "cancelled")
APIS = ("unified", "openai_chat", "openai_completions", "anthropic_messages")  # ingress.md's, `app.context.Ingress`
PARAMETERS = frozenset({"from", "to", "group_by", "latency", *FILTERS})
_SWITCH = {"true": True, "false": False}


class UsageQuery(msgspec.Struct, frozen=True, kw_only=True):
    """A report: the period [start, end), the grouping and the filters (empty tuple: no filter).

    `only_key` is the caller's restriction, not a filter the caller chose: with API keys, a
    non-admin key's reports are limited to its own rows (access.md); None sees everything."""

    start: datetime
    end: datetime
    group_by: tuple[str, ...] = ()
    model: tuple[str, ...] = ()
    provider: tuple[str, ...] = ()
    key: tuple[str, ...] = ()
    owner: tuple[str, ...] = ()
    api: tuple[str, ...] = ()
    status: tuple[str, ...] = ()
    only_key: str | None = None
    latency: bool = True  # False: no percentiles even where they apply (they read raw rows)

    @property
    def percentiles(self) -> bool:
        """Latency percentiles come with groups other than time only (cost.md)."""
        return self.latency and bool(self.group_by) and not TIME_GROUPS.intersection(self.group_by)


class UsageFigures(msgspec.Struct, kw_only=True, gc=False):
    """The figures of one row of a report, or of its totals. Not tracked by the garbage collector
    (`gc=False`: they hold text and numbers only, so never a cycle): a report by hour x model makes
    5,768 of them in the bench, and tracked they set off collections that cost its build a third
    more (bench/RESULTS.md)."""

    requests: int
    errors: int
    cancelled: int
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: str | None  # exact decimal sum; null when no request of the row had a known cost
    unpriced_requests: int
    authoritative_cost_usd: str  # the part of cost_usd the upstreams reported themselves
    p50_ms: float | msgspec.UnsetType | None = msgspec.UNSET
    p95_ms: float | msgspec.UnsetType | None = msgspec.UNSET


class UsageRow(UsageFigures, kw_only=True):
    """A row: its group values (only those grouped by; null where the ledger had none), then figures."""

    model: str | msgspec.UnsetType | None = msgspec.UNSET
    provider: str | msgspec.UnsetType | None = msgspec.UNSET
    key: str | msgspec.UnsetType | None = msgspec.UNSET
    owner: str | msgspec.UnsetType | None = msgspec.UNSET
    api: str | msgspec.UnsetType | None = msgspec.UNSET
    day: str | msgspec.UnsetType | None = msgspec.UNSET
    hour: str | msgspec.UnsetType | None = msgspec.UNSET
    status: str | msgspec.UnsetType | None = msgspec.UNSET


class UsageReport(msgspec.Struct, kw_only=True):
    start: str = msgspec.field(name="from")
    end: str = msgspec.field(name="to")
    group_by: list[str]
    rows: list[UsageRow]
    totals: UsageFigures


def parse_query(params: Mapping[str, str], now: datetime, *, only_key: str | None = None) -> UsageQuery:
    """The `UsageQuery` that `params` ask for; QueryError names the first bad parameter."""
    for name in params:
        if not name.strip():  # `?=x`, `?&=`: a name the message could not show
            raise QueryError(name[:64], f"a parameter without a name ({name[:64]!r}; one of {', '.join(PARAMETERS)})")
        if name not in PARAMETERS:
            raise QueryError(name[:64], "unknown parameter")
    period = parse_period(params.get("from"), params.get("to"), now)
    group_by = _values(params, "group_by")
    for name in group_by:
        if name not in GROUPS:
            raise QueryError("group_by", f"unknown group {name[:64]!r} (one of {', '.join(GROUPS)})")
    filters: dict[str, Any] = {name: _values(params, name) for name in FILTERS}
    for name, values in filters.items():
        if any(_UNREADABLE_CHAR.search(value) for value in values):
            raise QueryError(name, UNREADABLE)  # a NUL: PostgreSQL's error; a control no key or model name holds
    for name, known in (("status", STATUSES), ("api", APIS)):
        for value in filters[name]:
            if value not in known:
                raise QueryError(name, f"unknown {name} {value[:64]!r} (one of {', '.join(known)})")
    status = filters.pop("status")
    latency = _SWITCH.get(params.get("latency", "true").strip().lower())
    if latency is None:
        raise QueryError("latency", f"{params['latency'][:32]!r} is not true or false")
    return UsageQuery(
        start=period.start,
        end=period.end,
        group_by=group_by,
        status=status,
        only_key=only_key,
        latency=latency,
        **filters,
    )


UNREADABLE = "must not hold control characters or undecodable bytes"
_UNREADABLE_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")  # C0, DEL, C1, lone surrogates


def undecodable(query_string: bytes) -> str | None:
    """The first parameter of a raw query string whose name or value is not UTF-8 once
    percent-decoded, or None. The parsed query has U+FFFD in its place (`?owner=%FF`), a filter on
    a name nobody has that answered an empty report, not the 400 a bad value gets."""
    for pair in query_string.split(b"&"):
        name, _, value = pair.partition(b"=")
        try:
            unquote_to_bytes(name.replace(b"+", b" ")).decode()
            unquote_to_bytes(value.replace(b"+", b" ")).decode()
        except UnicodeDecodeError:
            return unquote(name.decode("latin-1").replace("+", " "), errors="replace")[:64]
    return None


def _values(params: Mapping[str, str], name: str) -> tuple[str, ...]:
    text = params.get(name, "")
    values = _escaped_list(text) if "\\" in text else text.split(",")
    return tuple(dict.fromkeys(value.strip() for value in values if value.strip()))


def _escaped_list(text: str) -> list[str]:
    """`text` split at its commas but `\\,`, which is a comma of the value, as `\\\\` is a
    backslash; any other backslash is itself (module docstring)."""
    values: list[str] = []
    value: list[str] = []
    chars = iter(text)
    for char in chars:
        if char == ",":
            values.append("".join(value))
            value.clear()
        elif char == "\\" and (escaped := next(chars, "")) in (",", "\\"):
            value.append(escaped)
        else:
            value.append(char if char != "\\" else char + escaped)
    values.append("".join(value))
    return values


def iso(moment: datetime) -> str:
    """A report's `from`/`to`: UTC, `Z`, microseconds only when there are some."""
    text: str = msgspec.to_builtins(moment.astimezone(UTC))
    return text
