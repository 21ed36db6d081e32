"""The SQL price catalog, cost arithmetic and the usage ledger (a leaf package: no `app`, no `providers`).

Schema and database:
- `tables`: the schema (SQLAlchemy models, one `metadata`) and the exact column types.
- `exact`: the exact column arithmetic without SQLAlchemy (money at a column's scale, UTC text).
- `database`: `open_engine(url)`, the one way the service opens its database (SQLite's pragmas),
  and `database_unreachable(exc)`.
- `migrate`: Alembic upgrade/downgrade/current from code (`migrations/` holds the revisions).
- `keys`: API keys at rest: the secret's shape and hash, the key's record, the `keys` table.

The catalog:
- `files`: the reviewed catalog TOML files, validated into `CatalogFile` (`models.toml`: the one
  shipped with the package).
- `sync`: files → SQL, idempotently; a changed price becomes a new effective-dated row.
- `snapshot`: the in-memory view the request path reads (SQL is never queried per request).
- `saved_snapshot`: the catalog snapshot's copy beside the journal, for starting without SQL.
- `pricing`: usage times the price row → exact `Decimal` cost, or None when unpriced.

The ledger:
- `records`: `LedgerRecord`, the row type the app hands the writer, and its enums.
- `ledger`: the batched, off-request-path `LedgerWriter`.
- `journal`: the ledger's local journal: each row on disk before its response ends, replayed at
  start, read back through a database outage.
- `ledger_store`: how a batch reaches each database (SQLite's driver on its own thread or process,
  one JSON document per batch for PostgreSQL), with the per-row encoding done once per batch.
- `sqlite_rows`: ledger rows into a SQLite file with the stdlib driver (no SQLAlchemy).
- `sqlite_child`: the SQLite ledger writer's own process.
- `outages`: which failures of a ledger write are outages (retried) and which the rows' own fault.
- `rollup`: how a batch of ledger rows is added to the hourly and daily roll-ups.

Reports:
- `report_period`: the period a report covers (`from`/`to`).
- `usage_query`: what a usage report asks for and answers, parsed once for every caller.
- `usage_report`: the usage report, aggregated in SQL from the roll-ups and the raw rows.
- `usage_sql`: the SQL a usage report writes differently on PostgreSQL and SQLite.
- `drift`, `gpu_cost`: the cost reports (billed against estimated; amortized $/Mtok beside hosted
  prices), with exact SQL sums on both databases (`exact_sum`).

Importing this package does nothing but define names: engines, tasks and files are opened by the
caller (the app's lifespan or the CLI).
"""
