"""Alembic migrations for the catalog and ledger schema (`catalog.tables.metadata`).

There is no `alembic.ini`: `catalog.migrate` builds the Alembic configuration in code, pointing
`script_location` at this package and passing the database URL in `config.attributes["url"]`.
"""
