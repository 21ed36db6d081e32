"""`switchyard usage`: the usage report (cost.md) from the configured database, no server needed.

    switchyard usage [--group-by model,day] [--from 2026-11-01] [--to …] [--model …] [--provider …]
                     [--key …] [--owner …] [--api …] [--status …] [--format table|csv|json]

The options are the API's parameters (`--group-by` is `group_by`) and are parsed by the same code,
so a bad one exits 2 with the API's message, naming the option. Like `serve`, on the embedded SQLite
default the schema is brought up to date first (an older database gets its roll-ups then).

- `table` (default): one line per row, group values first, then the figures, and a `total` line;
  costs are the exact decimal strings, right-aligned; a null group value reads `(none)`, a null
  figure (no known cost) `-`.
- `csv`: a header and one line per row, the same fields and names as the JSON rows (an empty
  cell is null); no totals line, which a spreadsheet would take for one more row to sum. A group
  value that a spreadsheet would read as a formula (an owner is free text: `=HYPERLINK(…)`,
  `+cmd`, `@SUM(1)`) gets a `'` in front, as OWASP's "CSV injection" advises; figures never do.
- `json`: exactly the body of `GET /api/v1/usage`.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import sys
from datetime import UTC, datetime
from typing import Any

import msgspec

from app.settings import Settings
from catalog.database import open_engine
from catalog.migrate import schema_ready
from catalog.report_period import QueryError
from catalog.usage_query import FILTERS, UsageFigures, UsageReport, parse_query
from catalog.usage_report import usage_report

FIGURES = tuple(UsageFigures.__struct_fields__)


def add_parser(commands: Any) -> None:
    """Register `usage` on the `switchyard` parser's subcommands."""
    usage = commands.add_parser("usage", help="the usage report, from the database")
    usage.add_argument("--config", help="config file (default: $SWITCHYARD_CONFIG, ./config.toml, bundled example)")
    usage.add_argument("--group-by", help="comma-separated: model, provider, key, owner, api, day, hour, status")
    usage.add_argument("--from", dest="start", help="inclusive, ISO 8601 (default: 30 days before --to)")
    usage.add_argument("--to", dest="end", help="exclusive, ISO 8601 (default: now)")
    for name in FILTERS:
        usage.add_argument(f"--{name}", help=f"only these {name} values (comma-separated)")
    usage.add_argument(
        "--no-latency",
        action="store_true",
        help="leave out p50/p95 (exact, from raw rows: slow over millions of rows); the rest is from roll-ups",
    )
    usage.add_argument("--format", choices=("table", "csv", "json"), default="table")


def run(args: argparse.Namespace, settings: Settings) -> int:
    given = {"group_by": args.group_by, "from": args.start, "to": args.end}
    given.update({name: getattr(args, name) for name in FILTERS})
    params = {name: value for name, value in given.items() if value is not None}
    if args.no_latency:
        params["latency"] = "false"
    try:
        query = parse_query(params, datetime.now(UTC))
    except QueryError as exc:
        print(f"switchyard usage: {exc.for_cli()}", file=sys.stderr)
        return 2
    report = asyncio.run(_report(settings, query))
    sys.stdout.write(render(report, args.format))
    return 0


async def _report(settings: Settings, query: Any) -> UsageReport:
    await schema_ready(settings.database.url, migrate=settings.migrate_on_start, create=False)
    engine = open_engine(settings.database.url)
    try:
        return await usage_report(engine, query)
    finally:
        await engine.dispose()


def render(report: UsageReport, form: str) -> str:
    if form == "json":
        return msgspec.json.encode(report).decode() + "\n"
    figures = [name for name in FIGURES if _present(report, name)]
    rows = [_cells(msgspec.to_builtins(row), [*report.group_by, *figures]) for row in report.rows]
    if form == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([*report.group_by, *figures])
        groups = len(report.group_by)
        writer.writerows([[_inert(cell) for cell in row[:groups]] + row[groups:] for row in rows])
        return out.getvalue()
    rows = [[cell or ("(none)" if i < len(report.group_by) else "-") for i, cell in enumerate(row)] for row in rows]
    head = list(report.group_by) or [""]
    totals = [cell or "-" for cell in _cells(msgspec.to_builtins(report.totals), figures)]  # as a row's
    total = ["total"] + [""] * (len(head) - 1) + totals
    lines = [[*head, *figures], *(rows if report.group_by else []), total]
    return f"usage from {report.start} to {report.end}\n" + _table(lines, len(head))


def _inert(cell: str) -> str:
    """A CSV cell a spreadsheet shows as text, not runs as a formula (module doc)."""
    return "'" + cell if cell.startswith(_FORMULA) else cell


_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _present(report: UsageReport, name: str) -> bool:
    """Latency columns only where the report has them (grouped by something other than time)."""
    return name not in ("p50_ms", "p95_ms") or report.totals.p50_ms is not msgspec.UNSET


def _cells(values: dict[str, Any], fields: list[str]) -> list[str]:
    return ["" if values.get(name) is None else str(values[name]) for name in fields]


def _table(lines: list[list[str]], left: int) -> str:
    """Columns padded to their widest cell: the first `left` (group values) to the left, the
    figures to the right."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = []
    for line in lines:
        cells = (
            cell.ljust(w) if i < left else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        text.append("  ".join(cells).rstrip())
    return "\n".join(text) + "\n"
