"""`switchyard catalog drift` and `switchyard catalog gpu-cost`: the catalog's cost reports, read
straight from the configured database (no running server needed).

    switchyard catalog drift    [--from ISO] [--to ISO] [--format table|json]
    switchyard catalog gpu-cost [--from ISO] [--to ISO] [--format table|json]

`json` prints exactly what `GET /api/v1/catalog/drift` and `GET /api/v1/catalog/gpu-cost` answer
(`app.edge.cost_reports`); `table` (the default) is for people: one line per provider and model,
drifted rows marked `DRIFT`, each hosted price on its own indented line under the GPU row. A bad
`--from`/`--to` exits 2 with a message naming the option, like any other bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from app.settings import ConfigError, Settings
from catalog.database import open_engine
from catalog.drift import DriftReport, price_drift
from catalog.gpu_cost import GpuCostReport, gpu_costs
from catalog.migrate import schema_ready
from catalog.report_period import Period, QueryError, parse_period

COMMANDS = ("drift", "gpu-cost")


def register(catalog_commands: Any, config_option: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the two report subcommands to the `catalog` command group."""
    helps = {
        "drift": "billed against catalog-estimated cost per provider and model",
        "gpu-cost": "$/Mtok on your GPUs beside the hosted prices for the same models",
    }
    for name in COMMANDS:
        parser: argparse.ArgumentParser = catalog_commands.add_parser(name, help=helps[name])
        config_option(parser)
        parser.add_argument("--from", dest="start", help="ISO 8601, inclusive (default: 30 days before --to)")
        parser.add_argument("--to", dest="end", help="ISO 8601, exclusive (default: now)")
        parser.add_argument("--format", choices=("table", "json"), default="table")


def run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        period = parse_period(args.start, args.end)
    except QueryError as exc:
        raise ConfigError(exc.for_cli()) from None
    report = asyncio.run(_report(args.catalog_command, settings, period))
    if args.format == "json":
        print(msgspec.json.encode(report).decode())
    elif isinstance(report, DriftReport):
        print(drift_table(report))
    else:
        print(gpu_cost_table(report))
    return 0


async def _report(command: str, settings: Settings, period: Period) -> DriftReport | GpuCostReport:
    await schema_ready(settings.database.url, migrate=settings.migrate_on_start, create=False)
    engine = open_engine(settings.database.url)
    try:
        if command == "drift":
            return await price_drift(engine, period)
        return await gpu_costs(engine, period)
    finally:
        await engine.dispose()


def drift_table(report: DriftReport) -> str:
    header = ("provider", "model", "requests", "billed_usd", "estimated_usd", "ratio", "")
    lines = [
        (r.provider, r.model, str(r.requests), r.billed_usd, r.estimated_usd, r.ratio or "-", _flag(r.flagged))
        for r in report.rows
    ]
    title = f"price drift {report.start} .. {report.end} (flagged: more than {report.threshold} off)"
    return "\n".join([title, *_aligned([header, *lines])]) if lines else f"{title}\nno authoritative costs to compare"


def gpu_cost_table(report: GpuCostReport) -> str:
    header = ("provider", "model", "requests", "tokens", "usd", "usd_per_mtok")
    lines: list[tuple[str, ...]] = []
    for row in report.rows:
        per_mtok = row.usd_per_mtok or "-"
        lines.append((row.provider, row.model, str(row.requests), str(row.tokens), row.amortized_usd, per_mtok))
        for hosted in row.hosted:
            rates = f"in {hosted.input_usd_per_mtok or '-'} out {hosted.output_usd_per_mtok or '-'}"
            same = hosted.same_usage_usd or "unpriced"
            lines.append((f"  vs {hosted.provider}", rates, "", "", same, hosted.usd_per_mtok or "-"))
    title = f"GPU cost {report.start} .. {report.end} (amortized, beside hosted prices on the same tokens)"
    return "\n".join([title, *_aligned([header, *lines])]) if lines else f"{title}\nno amortized requests"


def _flag(flagged: bool) -> str:
    return "DRIFT" if flagged else ""


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
