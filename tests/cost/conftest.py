"""Fixtures for the cost reports: a migrated database of its own per test, SQLite or PostgreSQL.

`report_db` is parametrized over both dialects; a PostgreSQL one is a new database created for the
test (`tests.catalog.conftest.PgDatabases`, dropped at the end of the session), so no test sees
another's rows. PostgreSQL being down fails these tests; it never skips them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from catalog.migrate import upgrade_async
from tests.catalog.conftest import PgDatabases, pg_databases

__all__ = ["pg_databases", "report_db"]


@pytest.fixture(params=["sqlite", "postgresql"])
async def report_db(request: pytest.FixtureRequest, tmp_path: Path, pg_databases: PgDatabases) -> str:
    """The URL of a new, migrated, empty database of the parametrized dialect."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'reports.db'}"
    else:
        url = await pg_databases.create()
    await upgrade_async(url)
    return url
