"""rev2 review: a statement cache size in the database URL that `open_engine` could not hand asyncpg
as a number is refused with the configuration's errors, not a traceback later."""

from __future__ import annotations

import pytest

from app.config_urls import database_url_problem

BASE = "postgresql+asyncpg://u@127.0.0.1/db?"


@pytest.mark.parametrize("query", ["statement_cache_size=%C2%B2", "statement_cache_size=0&statement_cache_size=0"])
def test_a_cache_size_asyncpg_cannot_take_is_refused(query: str) -> None:
    problem = database_url_problem(BASE + query)
    assert problem is not None
    assert problem.startswith("statement_cache_size"), problem


def test_a_plain_zero_passes() -> None:
    assert database_url_problem(BASE + "statement_cache_size=0") is None
