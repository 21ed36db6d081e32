"""The hourly roll-up (`usage_hourly`): how a batch of new ledger rows is added to it.

Reports read whole hours from the roll-up (`catalog.usage_report`), so it must hold exactly the
sums of the ledger rows, no more: only rows actually inserted are counted (a replayed request id,
skipped by `ON CONFLICT (request_id) DO NOTHING`, is not counted again), and the roll-up changes in
the transaction that inserts them, so a report never sees one without the other.

- PostgreSQL (`postgres_statement`): one statement per batch. The ledger INSERT sits in a CTE whose
  `RETURNING` yields only the rows it inserted; the outer INSERT groups them by hour and dimensions
  inside the database and upserts the sums. The gateway sends the batch as before and reads
  nothing back: the roll-up costs it no work per row.
- SQLite (`SQLiteRollup`): the store inserts the batch with `executemany` and compares the rows it
  changed with the batch's length. Equal (every row is new, the normal case): the batch is summed
  per group here, on the store's thread — one tuple and a few integer additions per row, money as
  integer units of 1e-18 USD, which is the ledger's scale, so the sums are exact — and upserted one
  row per group. Fewer (a replay, or one request id twice in a batch): the transaction is rolled
  back and the batch inserted row by row, counting only the rows whose INSERT changed something.
  SQLite has no exact decimal arithmetic (cost columns hold decimal text), so the upsert adds two
  texts with `decimal_add`, a function registered on the connection.

Unpriced (`UNPRICED`): a request with no cost though it was served or used tokens; a failed
request that reported no usage cost nothing we know of and counts as an error only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import Any

from catalog.tables import COST_SCALE

DIMENSIONS = ("model", "provider", "api_key_id", "owner", "api")
TOKENS = ("input_tokens", "output_tokens", "reasoning_tokens", "cache_read_tokens", "cache_write_tokens")
KEY = ("hour", *DIMENSIONS, "status")
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
    dims = ", ".join(f"COALESCE({name}, '')" for name in DIMENSIONS)
    tokens = ", ".join(f"COALESCE(SUM({name}), 0)" for name in TOKENS)
    return (
        f"SELECT date_trunc('hour', started_at, 'UTC'), {dims}, status, "  # noqa: S608
        f"COUNT(*), COUNT(*) FILTER (WHERE {UNPRICED}), {tokens}, SUM(cost_usd), "
        f"SUM(cost_usd) FILTER (WHERE cost_source = 'authoritative') "
        f"FROM {source} GROUP BY 1, 2, 3, 4, 5, 6, 7 ORDER BY 1, 2, 3, 4, 5, 6, 7"
    )


def _postgres_upsert() -> str:
    added = ", ".join(f"{name} = h.{name} + EXCLUDED.{name}" for name in SUMS[:-2])
    money = ", ".join(f"{name} = COALESCE(h.{name} + EXCLUDED.{name}, h.{name}, EXCLUDED.{name})" for name in SUMS[-2:])
    return f"ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET {added}, {money}"


def postgres_statement(insert_rows: str) -> str:
    """`insert_rows` (an INSERT INTO ledger … ON CONFLICT DO NOTHING) with the roll-up upsert of the
    rows it inserted, in one statement. Groups are upserted in key order, so two writers adding to
    the same groups lock them in the same order and never deadlock."""
    returning = ", ".join(SOURCE)
    return (
        f"WITH inserted AS ({insert_rows} RETURNING {returning}) "
        f"INSERT INTO usage_hourly AS h ({', '.join(KEY)}, {', '.join(SUMS)}) "
        f"{_grouped_select('inserted')} {_postgres_upsert()}"
    )


def postgres_backfill() -> str:
    """Migration 0005: the roll-up of every ledger row already there."""
    return f"INSERT INTO usage_hourly ({', '.join(KEY)}, {', '.join(SUMS)}) {_grouped_select('ledger')}"


def sqlite_upsert() -> str:
    marks = ", ".join("?" * (len(KEY) + len(SUMS)))
    added = ", ".join(f"{name} = {name} + excluded.{name}" for name in SUMS[:-2])
    money = ", ".join(f"{name} = decimal_add({name}, excluded.{name})" for name in SUMS[-2:])
    return (
        f"INSERT INTO usage_hourly ({', '.join(KEY)}, {', '.join(SUMS)}) VALUES ({marks}) "  # noqa: S608
        f"ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET {added}, {money}"
    )


class SQLiteRollup:
    """Sums SQLite-encoded ledger rows (lists in `columns` order) per roll-up group."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.pick = itemgetter(*(columns.index(name) for name in SOURCE))
        self.upsert = sqlite_upsert()

    def groups(self, rows: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
        """One upsert parameter tuple per group of `rows` (each a full encoded ledger row)."""
        return summed(self.pick(row) for row in rows)


def summed(sources: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Group `SOURCE`-shaped tuples (SQLite text timestamps and costs) into roll-up rows."""
    totals: dict[tuple[str, ...], list[Any]] = {}
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
    return [(*group, *sums[:7], *_texts(sums[7:])) for group, sums in sorted(totals.items())]


def _texts(values: Sequence[int | None]) -> list[str | None]:
    return [None if value is None else atto_text(value) for value in values]
