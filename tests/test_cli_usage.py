"""`switchyard usage` as an operator runs it (a subprocess, the configured SQLite database, no
server): the JSON is the report the raw ledger adds up to, the CSV parses back to the same
numbers, the table ends with the exact totals, and a bad option exits 2 naming it."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest

from catalog.database import open_engine
from catalog.ledger_write import write_records
from catalog.migrate import upgrade_async
from catalog.usage_query import parse_query
from tests.catalog.usage_oracle import expected, ledger_rows, seeded_records
from tests.support.cli import run_cli, write_config

PERIOD = ("--from", "2026-11-28T03:17:42.5Z", "--to", "2026-11-30T16:45:00Z")
PARAMS = {"from": "2026-11-28T03:17:42.5Z", "to": "2026-11-30T16:45:00Z"}
INTEGERS = ("requests", "errors", "cancelled", "unpriced_requests", "input_tokens", "output_tokens")


async def _seed(url: str) -> list[dict[str, Any]]:
    await upgrade_async(url)
    engine = open_engine(url)
    try:
        await write_records(engine, seeded_records())
        return await ledger_rows(engine)
    finally:
        await engine.dispose()


@pytest.fixture
def seeded(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    config = write_config(tmp_path)
    rows = asyncio.run(_seed(f"sqlite+aiosqlite:///{tmp_path / 'switchyard.db'}"))
    return config, rows


def usage(config: Path, *args: str) -> str:
    done = run_cli(config.parent, "usage", "--config", str(config), *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_json_is_the_ledgers_aggregate(seeded: tuple[Path, list[dict[str, Any]]]) -> None:
    config, rows = seeded
    answer = json.loads(usage(config, *PERIOD, "--group-by", "model,status", "--owner", "team-x", "--format", "json"))
    query = parse_query({**PARAMS, "group_by": "model,status", "owner": "team-x"}, datetime.now(UTC))
    assert {k: answer[k] for k in ("group_by", "rows", "totals")} == expected(rows, query)


def test_csv_parses_back_to_the_json_numbers(seeded: tuple[Path, list[dict[str, Any]]]) -> None:
    config, _ = seeded
    options = (*PERIOD, "--group-by", "key,day")
    answer = json.loads(usage(config, *options, "--format", "json"))
    parsed = list(csv.DictReader(io.StringIO(usage(config, *options, "--format", "csv"))))
    assert len(parsed) == len(answer["rows"]) > 4
    for line, row in zip(parsed, answer["rows"], strict=True):
        assert line == {name: "" if value is None else str(value) for name, value in row.items()}
        assert [int(line[name]) for name in INTEGERS] == [row[name] for name in INTEGERS]
        assert (Decimal(line["cost_usd"]) if line["cost_usd"] else None) == _decimal(row["cost_usd"])
        assert Decimal(line["authoritative_cost_usd"]) == Decimal(row["authoritative_cost_usd"])


FORMULAS = ('=HYPERLINK("http://x","y")', "+cmd|' /C calc'!A0", "-1+1", "@SUM(1)")


def test_csv_owners_that_look_like_formulas_stay_text(tmp_path: Path) -> None:
    """An owner is free text: a CSV cell starting with `=`, `+`, `-`, or `@` is a formula to
    Excel and LibreOffice (OWASP "CSV injection"), so it gets a `'`; the figures are unchanged."""
    config = write_config(tmp_path)
    records = seeded_records(len(FORMULAS))
    records = [msgspec.structs.replace(r, owner=owner) for r, owner in zip(records, FORMULAS, strict=True)]
    asyncio.run(_write(f"sqlite+aiosqlite:///{tmp_path / 'switchyard.db'}", records))
    period = ("--from", "2026-11-01", "--to", "2026-12-31", "--group-by", "owner")
    answer = json.loads(usage(config, *period, "--format", "json"))
    parsed = list(csv.DictReader(io.StringIO(usage(config, *period, "--format", "csv"))))
    assert sorted(line["owner"] for line in parsed) == sorted("'" + owner for owner in FORMULAS)
    for line, row in zip(parsed, answer["rows"], strict=True):
        assert line["owner"] == "'" + row["owner"]
        assert [int(line[name]) for name in INTEGERS] == [row[name] for name in INTEGERS]
        assert line["cost_usd"] == ("" if row["cost_usd"] is None else row["cost_usd"])


async def _write(url: str, records: list[Any]) -> None:
    await upgrade_async(url)
    engine = open_engine(url)
    try:
        await write_records(engine, records)
    finally:
        await engine.dispose()


def _decimal(value: str | None) -> Decimal | None:
    return None if value is None else Decimal(value)


def test_the_table_ends_with_the_exact_totals(seeded: tuple[Path, list[dict[str, Any]]]) -> None:
    config, _ = seeded
    answer = json.loads(usage(config, *PERIOD, "--group-by", "provider", "--format", "json"))
    lines = usage(config, *PERIOD, "--group-by", "provider").splitlines()
    assert lines[0] == "usage from 2026-11-28T03:17:42.500000Z to 2026-11-30T16:45:00Z"
    assert lines[1].split()[:4] == ["provider", "requests", "errors", "cancelled"]
    assert [line.split()[0] for line in lines[2:-1]] == [row["provider"] for row in answer["rows"]]
    total = lines[-1].split()
    totals = answer["totals"]
    assert total[0] == "total"
    assert total[1:5] == [str(totals[name]) for name in ("requests", "errors", "cancelled", "input_tokens")]
    assert totals["cost_usd"] in total


def test_no_latency_leaves_out_only_the_percentiles(seeded: tuple[Path, list[dict[str, Any]]]) -> None:
    config, _ = seeded
    options = (*PERIOD, "--group-by", "model", "--format", "json")
    whole = json.loads(usage(config, *options))
    fast = json.loads(usage(config, *options, "--no-latency"))
    for row in [*whole["rows"], whole["totals"]]:
        assert row.pop("p50_ms") is not None
        del row["p95_ms"]
    assert fast == whole
    assert "p50_ms" not in usage(config, *PERIOD, "--group-by", "model", "--no-latency").splitlines()[1]


def test_a_total_with_no_known_cost_shows_a_dash_as_a_row_does(seeded: tuple[Path, list[dict[str, Any]]]) -> None:
    """A period with no rows: its totals' `cost_usd` and percentiles are null, shown `-` (as in a
    group's row), so every column of the totals line is there to read."""
    config, _ = seeded
    empty = ("--from", "2020-01-01", "--to", "2020-01-02", "--group-by", "model")
    assert json.loads(usage(config, *empty, "--format", "json"))["totals"]["cost_usd"] is None
    head, total = usage(config, *empty).splitlines()[1:]
    assert len(total.split()) == len(head.split())  # `total` under the group's column, a figure under each
    named = dict(zip(head.split()[1:], total.split()[1:], strict=True))
    assert (named["requests"], named["cost_usd"], named["p50_ms"], named["p95_ms"]) == ("0", "-", "-", "-")


@pytest.mark.parametrize(
    ("args", "option"),
    [(("--group-by", "colour"), "--group-by"), (("--from", "last week"), "--from"), (("--status", "fine"), "--status")],
)
def test_a_bad_option_exits_2_naming_it(tmp_path: Path, args: tuple[str, ...], option: str) -> None:
    config = write_config(tmp_path)
    done = run_cli(tmp_path, "usage", "--config", str(config), *args)
    assert done.returncode == 2
    assert done.stderr.startswith(f"switchyard usage: {option}: ")


@pytest.mark.parametrize("command", [("usage",), ("catalog", "drift"), ("catalog", "gpu-cost")])
def test_a_reversed_period_names_both_options(tmp_path: Path, command: tuple[str, ...]) -> None:
    config = write_config(tmp_path)
    done = run_cli(tmp_path, *command, "--config", str(config), "--from", "2026-12-02", "--to", "2026-12-01")
    assert done.returncode == 2
    assert done.stderr.endswith(": --from: must be before --to\n")


@pytest.mark.parametrize(
    "args", [("usage",), ("usage", "--format", "json"), ("keys", "list"), ("catalog", "drift"), ("catalog", "gpu-cost")]
)
def test_a_report_on_a_database_that_does_not_exist_says_so_and_makes_none(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Run from the wrong directory, it made an empty SQLite file and printed a report of zeros."""
    config = write_config(tmp_path)
    result = run_cli(tmp_path, *args, "--config", str(config))
    database = tmp_path / "switchyard.db"
    message = f"no database at {database} (`switchyard serve` or `db upgrade` makes it): is this its config?"
    assert (result.returncode, result.stdout, result.stderr) == (1, "", f"switchyard: SchemaNotCurrent: {message}\n")
    assert not database.exists()
    made = run_cli(tmp_path, "keys", "create", "--name", "first", "--config", str(config))  # a key before any start
    assert made.returncode == 0, made.stderr
    assert database.exists()
