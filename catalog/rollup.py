"""The roll-ups (`usage_hourly`, `usage_hourly_models`, `usage_hourly_model_status`,
`usage_daily`): how a batch of new ledger rows is added to them.

Four levels, each the sums of the ledger rows per group: per UTC hour x model x provider x key x
owner x api x status (`KEY`), per hour x model x provider x status — without the caller's
dimensions, key, owner and api (`MODEL_KEY`: reports that neither group by nor filter on them read
4.9 times fewer rows there in the bench) —, per hour x model x status — without the provider too
(`MODEL_STATUS_KEY`: 2.7 times fewer again, for reports that do not need the provider either) —
and per UTC day with every dimension (`DAY_KEY`). Reports read whole days from the daily roll-up
and whole hours from the smallest hourly level that holds their dimensions
(`catalog.usage_report`), so all four must hold exactly the sums of the ledger rows, no more:
only rows actually inserted are counted (a replayed request id, skipped by `ON CONFLICT
(request_id) DO NOTHING`, is not counted again), and all change in the transaction that inserts
the rows, so a report never sees one without the others. A row belongs to the hour and the day of
its `started_at` (UTC): a request started at 23:59 and finished after midnight is the earlier
day's.

- PostgreSQL (`postgres_statement`): one statement per batch. The ledger INSERT sits in a CTE whose
  `RETURNING` yields only the rows it inserted; they are grouped by hour and dimensions inside the
  database, the hour groups are upserted into `usage_hourly`, summed per hour without the
  caller's dimensions into `usage_hourly_models`, without the provider too into
  `usage_hourly_model_status`, and summed per day into `usage_daily`. The
  gateway sends the batch as before and reads nothing back: the roll-ups cost it no work per row.
- SQLite (`SQLiteRollup`): the store inserts the batch with `executemany` and compares the rows it
  changed with the batch's length. Equal (every row is new, the normal case): the batch is summed
  per hour group here, on the store's thread — one tuple and a few integer additions per row,
  money as integer units of 1e-18 USD, which is the ledger's scale, so the sums are exact — the
  hour groups summed again per hour without the caller's dimensions, per hour without the
  provider too and per day (a few additions per group, not per row), and each level upserted one
  row per group. Fewer (a replay, or one
  request id twice in a batch): the transaction is rolled back and the batch inserted row by row,
  counting only the rows whose INSERT changed something. SQLite has no exact decimal arithmetic
  (cost columns hold decimal text), so the upsert adds two texts with `decimal_add`, a function
  registered on the connection — and only when the batch adds a cost: a NULL sum (no
  authoritative cost, the usual case) keeps the stored text without the call into Python.

Unpriced (`UNPRICED`): a request with no cost though it was served or used tokens; a failed
request that reported no usage cost nothing we know of and counts as an error only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any

from catalog.exact import COST_SCALE

DIMENSIONS = ("model", "provider", "api_key_id", "owner", "api")
MODEL_DIMENSIONS = ("model", "provider")  # `usage_hourly_models`: DIMENSIONS less key, owner and api
MODEL_STATUS_DIMENSIONS = ("model",)  # `usage_hourly_model_status`: MODEL_DIMENSIONS less the provider
TOKENS = ("input_tokens", "output_tokens", "reasoning_tokens", "cache_read_tokens", "cache_write_tokens")
KEY = ("hour", *DIMENSIONS, "status")
MODEL_KEY = ("hour", *MODEL_DIMENSIONS, "status")
MODEL_STATUS_KEY = ("hour", *MODEL_STATUS_DIMENSIONS, "status")
DAY_KEY = ("day", *DIMENSIONS, "status")
SUMS = ("requests", "unpriced_requests", *TOKENS, "cost_usd", "authoritative_cost_usd")
UNPRICED = "cost_usd IS NULL AND (status <> 'error' OR input_tokens IS NOT NULL)"
SOURCE = ("started_at", *DIMENSIONS, "status", *TOKENS, "cost_usd", "cost_source")

_ONE = 10**COST_SCALE


def atto(text: str) -> int:
    """A cost as SQLite stores it (decimal text with exactly `COST_SCALE` decimals) in 1e-18 USD."""
    whole, _, fraction = text.partition(".")
    return int(whole + fraction.ljust(COST_SCALE, "0")[:COST_SCALE])


def atto_text(value: int) -> str:
    """The decimal text of `value` 1e-18 USD, in the stored form (`COST_SCALE` decimals)."""
    whole, fraction = divmod(abs(value), _ONE)
    return f"{'-' if value < 0 else ''}{whole}.{fraction:0{COST_SCALE}d}"


def decimal_add(left: str | None, right: str | None) -> str | None:
    """SQLite's `decimal_add(a, b)`: the exact sum of two cost texts; NULL plus x is x."""
    if left is None or right is None:
        return left if right is None else right
    return atto_text(atto(left) + atto(right))


def _grouped_select(source: str) -> str:
    dims = ", ".join(f"COALESCE({name}, '') AS {name}" for name in DIMENSIONS)
    tokens = ", ".join(f"COALESCE(SUM({name}), 0) AS {name}" for name in TOKENS)
    return (
        f"SELECT date_trunc('hour', started_at, 'UTC') AS hour, {dims}, status, "  # noqa: S608
        f"COUNT(*) AS requests, COUNT(*) FILTER (WHERE {UNPRICED}) AS unpriced_requests, {tokens}, "
        f"SUM(cost_usd) AS cost_usd, SUM(cost_usd) FILTER (WHERE cost_source = 'authoritative') "
        f"AS authoritative_cost_usd FROM {source} GROUP BY 1, 2, 3, 4, 5, 6, 7"
    )


def _resummed_select(source: str, moment: str, dimensions: Sequence[str]) -> str:
    """The hourly sums in `source` (`usage_hourly` or a CTE of its shape) summed again per
    `moment` (an expression of `hour`) x `dimensions` x status."""
    sums = ", ".join(f"SUM({name})" for name in SUMS)
    return (
        f"SELECT {moment}, {', '.join(dimensions)}, status, {sums} "  # noqa: S608
        f"FROM {source} GROUP BY {_positions(len(dimensions) + 2)}"
    )


def _daily_select(source: str) -> str:
    return _resummed_select(source, "date_trunc('day', hour, 'UTC')", DIMENSIONS)


def _models_select(source: str) -> str:
    return _resummed_select(source, "hour", MODEL_DIMENSIONS)


def _model_status_select(source: str) -> str:
    return _resummed_select(source, "hour", MODEL_STATUS_DIMENSIONS)


def _positions(count: int) -> str:
    return ", ".join(str(position) for position in range(1, count + 1))


def _postgres_upsert(table: str, key: Sequence[str], select: str) -> str:
    """INSERT the rows of `select` (key columns, then `SUMS`) into `table`, adding to the rows there."""
    added = ", ".join(f"{name} = r.{name} + EXCLUDED.{name}" for name in SUMS[:-2])
    money = ", ".join(f"{name} = COALESCE(r.{name} + EXCLUDED.{name}, r.{name}, EXCLUDED.{name})" for name in SUMS[-2:])
    return (
        f"INSERT INTO {table} AS r ({', '.join(key)}, {', '.join(SUMS)}) {select} "
        f"ORDER BY {_positions(len(key))} ON CONFLICT ({', '.join(key)}) DO UPDATE SET {added}, {money}"
    )


def postgres_statement(insert_rows: str) -> str:
    """`insert_rows` (an INSERT INTO ledger … ON CONFLICT DO NOTHING) with the upserts of the rows
    it inserted into the four roll-ups, in one statement.

    The rows are grouped per hour once (`hourly`, materialized: four readers); the model hours,
    the model-status hours and the days are summed from those groups. The daily upsert is the
    main statement and runs first; the three upserts in CTEs nothing reads run after it, to
    completion, the later ones in the WITH list first (PostgreSQL runs such CTEs after the main
    query, last-written first: `ExecPostprocessPlan`; checked on 15 with triggers logging each
    insert). So every writer takes the same locks in the same order — its day groups, then its
    model-status hour groups, then its model hour groups, then its hour groups, each in key
    order — and two writers adding to the same groups wait for each other and never deadlock."""
    returning = ", ".join(SOURCE)
    hourly = _postgres_upsert("usage_hourly", KEY, "SELECT * FROM hourly")
    models = _postgres_upsert("usage_hourly_models", MODEL_KEY, _models_select("hourly"))
    statuses = _postgres_upsert("usage_hourly_model_status", MODEL_STATUS_KEY, _model_status_select("hourly"))
    daily = _postgres_upsert("usage_daily", DAY_KEY, _daily_select("hourly"))
    return (
        f"WITH inserted AS ({insert_rows} RETURNING {returning}), "
        f"hourly AS MATERIALIZED ({_grouped_select('inserted')}), "
        f"rolled AS ({hourly}), rolled_models AS ({models}), rolled_statuses AS ({statuses}) {daily}"
    )


def postgres_backfill() -> str:
    """Migration 0005: the hourly roll-up of every ledger row already there."""
    return f"INSERT INTO usage_hourly ({', '.join(KEY)}, {', '.join(SUMS)}) {_grouped_select('ledger')}"


def postgres_daily_backfill() -> str:
    """Migration 0006: the daily roll-up, summed from the hourly one (which holds every row)."""
    return f"INSERT INTO usage_daily ({', '.join(DAY_KEY)}, {', '.join(SUMS)}) {_daily_select('usage_hourly')}"


def postgres_models_backfill() -> str:
    """Migration 0007: the hourly roll-up per model, summed from the hourly one."""
    columns = f"{', '.join(MODEL_KEY)}, {', '.join(SUMS)}"
    return f"INSERT INTO usage_hourly_models ({columns}) {_models_select('usage_hourly')}"


def postgres_model_status_backfill() -> str:
    """The hourly roll-up per model and status, summed from the hourly one, as migration 0008
    fills it (the migration keeps its own copy of the statement): for bench/usage_report.py."""
    columns = f"{', '.join(MODEL_STATUS_KEY)}, {', '.join(SUMS)}"
    return f"INSERT INTO usage_hourly_model_status ({columns}) {_model_status_select('usage_hourly')}"


def sqlite_upsert(table: str = "usage_hourly", key: Sequence[str] = KEY) -> str:
    marks = ", ".join("?" * (len(key) + len(SUMS)))
    added = ", ".join(f"{name} = {name} + excluded.{name}" for name in SUMS[:-2])
    money = ", ".join(
        f"{name} = CASE WHEN excluded.{name} IS NULL THEN {name} ELSE decimal_add({name}, excluded.{name}) END"
        for name in SUMS[-2:]
    )
    return (
        f"INSERT INTO {table} ({', '.join(key)}, {', '.join(SUMS)}) VALUES ({marks}) "  # noqa: S608
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {added}, {money}"
    )


class SQLiteRollup:
    """Sums SQLite-encoded ledger rows (lists in `columns` order) into the four roll-up levels."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.pick = itemgetter(*(columns.index(name) for name in SOURCE))
        self.hourly = sqlite_upsert("usage_hourly", KEY)
        self.models = sqlite_upsert("usage_hourly_models", MODEL_KEY)
        self.statuses = sqlite_upsert("usage_hourly_model_status", MODEL_STATUS_KEY)
        self.daily = sqlite_upsert("usage_daily", DAY_KEY)

    def add(self, cursor: Any, rows: Iterable[Sequence[Any]]) -> None:
        """Upsert the sums of `rows` (each a full encoded ledger row) per hour, per model hour, per
        model-status hour and per day, on `cursor`, inside the caller's transaction (in
        PostgreSQL's order, days first). The other levels are summed from the hour groups."""
        hours = _hour_sums(self.pick(row) for row in rows)
        cursor.executemany(self.daily, _upsert_rows(_regrouped(hours.items(), _day_group)))
        cursor.executemany(self.statuses, _upsert_rows(_regrouped(hours.items(), _model_status_group)))
        cursor.executemany(self.models, _upsert_rows(_regrouped(hours.items(), _model_group)))
        cursor.executemany(self.hourly, _upsert_rows(hours))


Sums = list[Any]  # requests, unpriced, the five token sums (int), cost, authoritative (int 1e-18 USD or None)


def summed(sources: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Group `SOURCE`-shaped tuples (SQLite text timestamps and costs) into hourly roll-up rows."""
    return _upsert_rows(_hour_sums(sources))


def summed_by_day(hourly_rows: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Migration 0006 on SQLite: `usage_hourly` rows (`KEY` then `SUMS`, costs as stored text)
    summed per day into daily roll-up rows, exactly (costs as integers of 1e-18 USD)."""
    return _upsert_rows(_regrouped(_stored_hours(hourly_rows), _day_group))


def summed_by_model(hourly_rows: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Migration 0007 on SQLite: `usage_hourly` rows summed per hour x `MODEL_DIMENSIONS` x status
    into `usage_hourly_models` rows, exactly."""
    return _upsert_rows(_regrouped(_stored_hours(hourly_rows), _model_group))


def _stored_hours(hourly_rows: Iterable[Sequence[Any]]) -> Iterator[tuple[tuple[str, ...], Sums]]:
    for row in hourly_rows:
        costs = (None if value is None else atto(value) for value in row[-2:])
        yield tuple(row[: len(KEY)]), [*row[len(KEY) : -2], *costs]


def _hour_sums(sources: Iterable[Sequence[Any]]) -> dict[tuple[str, ...], Sums]:
    totals: dict[tuple[str, ...], Sums] = {}
    for started, model, provider, key, owner, api, status, i, o, r, cr, cw, cost, source in sources:
        group = (f"{started[:13]}:00:00.000000", model or "", provider or "", key or "", owner or "", api or "", status)
        sums = totals.get(group)
        if sums is None:
            sums = totals[group] = [0, 0, 0, 0, 0, 0, 0, None, None]
        sums[0] += 1
        sums[2] += i or 0
        sums[3] += o or 0
        sums[4] += r or 0
        sums[5] += cr or 0
        sums[6] += cw or 0
        if cost is None:
            if status != "error" or i is not None:
                sums[1] += 1
            continue
        value = atto(cost)
        sums[7] = value if sums[7] is None else sums[7] + value
        if source == "authoritative":
            sums[8] = value if sums[8] is None else sums[8] + value
    return totals


def _day_group(hour_group: tuple[str, ...]) -> tuple[str, ...]:
    """An hour group's day group: midnight of the hour's UTC day (SQLite text), the same dimensions."""
    return (f"{hour_group[0][:10]} 00:00:00.000000", *hour_group[1:])


def _model_group(hour_group: tuple[str, ...]) -> tuple[str, ...]:
    """An hour group (`KEY`) without its key, owner and api (`MODEL_KEY`)."""
    hour, model, provider, _key, _owner, _api, status = hour_group
    return (hour, model, provider, status)


def _model_status_group(hour_group: tuple[str, ...]) -> tuple[str, ...]:
    """An hour group (`KEY`) without its provider, key, owner and api (`MODEL_STATUS_KEY`)."""
    hour, model, _provider, _key, _owner, _api, status = hour_group
    return (hour, model, status)


def _regrouped(
    hours: Iterable[tuple[tuple[str, ...], Sums]], regroup: Callable[[tuple[str, ...]], tuple[str, ...]]
) -> dict[tuple[str, ...], Sums]:
    """Hour groups (`KEY`, SQLite text hours) summed into the groups `regroup` maps them to."""
    groups: dict[tuple[str, ...], Sums] = {}
    for hour_group, sums in hours:
        group = regroup(hour_group)
        total = groups.get(group)
        if total is None:
            groups[group] = list(sums)
            continue
        for index in range(7):
            total[index] += sums[index]
        for index in (7, 8):
            if sums[index] is not None:
                total[index] = sums[index] if total[index] is None else total[index] + sums[index]
    return groups


def _upsert_rows(totals: dict[tuple[str, ...], Sums]) -> list[tuple[Any, ...]]:
    return [(*group, *sums[:7], *_texts(sums[7:])) for group, sums in sorted(totals.items())]


def _texts(values: Sequence[int | None]) -> list[str | None]:
    return [None if value is None else atto_text(value) for value in values]
