"""The SQL price catalog, cost arithmetic and the usage ledger (a leaf package: no `app`, no `providers`).

- `tables`: the schema (SQLAlchemy models, one `metadata`) and the exact column types.
- `migrate`: Alembic upgrade/downgrade/current from code (`migrations/` holds the revisions).
- `files`: the reviewed catalog TOML files, validated into `CatalogFile`.
- `sync`: files → SQL, idempotently; a changed price becomes a new effective-dated row.
- `snapshot`: the in-memory view the request path reads (SQL is never queried per request).
- `pricing`: usage times the price row → exact `Decimal` cost, or None when unpriced.
- `ledger`: the batched, off-request-path `LedgerWriter` (`records`: `LedgerRecord`).
- `journal`: the ledger's local journal: each row on disk before its response ends, replayed at
  start, read back through a database outage.
- `saved_snapshot`: the catalog snapshot's copy beside the journal, for starting without SQL.
- `ledger_store`: how a batch reaches each database (SQLite's driver on its own thread, one JSON
  document per batch for PostgreSQL), with the per-row encoding done once per batch.
- `drift`, `gpu_cost`: the cost reports (billed against estimated; amortized $/Mtok beside hosted
  prices), over `report_period` (`from`/`to`) with exact SQL sums on both databases (`exact_sum`).

Importing this package does nothing but define names: engines, tasks and files are opened by the
caller (the app's lifespan or the CLI).
"""
