"""`switchyard catalog import PROVIDER`: a provider's listed prices as catalog TOML to review.

    switchyard catalog import PROVIDER [--write FILE] [--effective-from ISO]

cost.md: provider model lists that carry prices (primalabs `/models`) "can be imported the same
way, as a reviewed diff". The same way is the catalog files: this command asks the provider for its
list (`GET {base_url}/models` with its key; the conventions read are `providers.model_prices`'),
compares each rate with the catalog files' price in effect for the catalog model deployed on that
upstream model, and proposes a `[[prices]]` row, effective now (or `--effective-from`), for every
model whose listed rates differ or that has no price yet. Nothing reaches the database: the rows go
to stdout (redirect them into a catalog file) or are appended to `--write FILE`; a person reviews
them, and `switchyard catalog sync` makes them effective-dated rows as any other edit.

The summary goes to stderr: each change (`~ model (upstream): input 0.25 -> 0.3`), each new price
(`+`), and what could not be matched — listed models no catalog model is deployed on here,
deployed upstream models the list does not price, entries whose rates could not be read. A model
the list does not name keeps its price: a missing entry is no price change. Exit 0 when the list
was read (with or without changes), 2 for bad usage (an unknown provider, a bad date), 1 when the
provider could not be asked or its answer is no model list.
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from app.settings import Settings, key_missing, provider_configs
from catalog.files import MONEY_KEYS, CatalogFile, PriceSpec, load_catalog
from providers.adapter import Provider, make_client
from providers.model_prices import ListedPrice, ModelList, read_model_list

COMMAND = "import"


def register(catalog_commands: Any, config_option: Any) -> None:
    parser: argparse.ArgumentParser = catalog_commands.add_parser(
        COMMAND, help="propose prices from a provider's model list, as catalog TOML to review"
    )
    parser.add_argument("provider", help="a provider of the config whose /models lists prices")
    parser.add_argument("--write", metavar="FILE", help="append the proposed rows to this catalog file")
    parser.add_argument("--effective-from", help="when they apply: an ISO 8601 date-time, UTC (default: now)")
    config_option(parser)


def run(args: argparse.Namespace, settings: Settings) -> int:
    name = args.provider
    if name not in settings.providers:
        print(f"switchyard: {name!r}: no such provider in the config", file=sys.stderr)
        return 2
    when = _when(args.effective_from)
    if when is None:
        print(f"switchyard: --effective-from: {args.effective_from!r} is not an ISO 8601 date-time", file=sys.stderr)
        return 2
    if key_missing(settings, name):
        variable = settings.providers[name].api_key_env
        print(f"switchyard: providers.{name}: key variable {variable} is unset", file=sys.stderr)
        return 1
    catalog = load_catalog(settings.catalog.files, Path(settings.base_dir))
    try:
        listing = read_model_list(asyncio.run(_fetch(settings, name)))
    except OSError as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 1
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        print(f"switchyard: {name}'s /models is no model list: {exc}", file=sys.stderr)
        return 1
    rows, summary = propose(catalog, name, listing, when)
    print("\n".join(summary), file=sys.stderr)
    text = toml_rows(name, rows, when)
    if args.write is None:
        sys.stdout.write(text)
    elif rows:
        _append(Path(args.write), text, settings)
    return 0


async def _fetch(settings: Settings, name: str) -> bytes:
    (config,) = [config for config in provider_configs(settings) if config.name == name]
    client = make_client()
    try:
        return await Provider(config, client).model_list()
    finally:
        await client.aclose()


def _when(text: str | None) -> datetime | None:
    if text is None:
        return datetime.now(UTC).replace(microsecond=0)
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def propose(
    catalog: CatalogFile, provider: str, listing: ModelList, when: datetime
) -> tuple[list[PriceSpec], list[str]]:
    """The rows to add, and the summary's lines (module doc)."""
    deployed: dict[str, list[str]] = {}  # upstream model -> catalog models deployed on it here
    for model in catalog.models:
        for deployment in model.deployments:
            if deployment.provider == provider:
                deployed.setdefault(deployment.upstream_model, []).append(model.id)
    rows: list[PriceSpec] = []
    lines: list[str] = []
    unchanged = 0
    for listed in listing.priced:
        for model_id in deployed.get(listed.model, []):
            current = _in_effect(catalog, provider, model_id, when)
            row = _row(provider, model_id, listed, when)
            if current is not None and all(getattr(current, k) == getattr(row, k) for k in MONEY_KEYS):
                unchanged += 1
                continue
            rows.append(row)
            lines.append(_change(current, row, listed.model))
    listed_names = {listed.model for listed in listing.priced}
    changed = sum(line.startswith("~") for line in lines)
    head = f"{provider}: {changed} changed, {len(lines) - changed} new, {unchanged} unchanged"
    unmatched = sorted(listed_names - set(deployed))
    notes = [
        ("not in the catalog here (listed with prices, no catalog model deployed on them)", unmatched),
        ("no price listed for (their catalog prices stay)", sorted(set(deployed) - listed_names)),
        ("unreadable", [f"{model} ({why})" for model, why in listing.unreadable]),
    ]
    return rows, [head, *lines, *(f"{what}: {', '.join(names)}" for what, names in notes if names)]


def _in_effect(catalog: CatalogFile, provider: str, model: str, when: datetime) -> PriceSpec | None:
    rows = [p for p in catalog.prices if (p.provider, p.model) == (provider, model) and p.effective_from <= when]
    return max(rows, key=lambda p: p.effective_from, default=None)


def _row(provider: str, model: str, listed: ListedPrice, when: datetime) -> PriceSpec:
    rates = {key: getattr(listed, key) for key in MONEY_KEYS}
    return PriceSpec(provider=provider, model=model, effective_from=when, **rates)


def _change(current: PriceSpec | None, row: PriceSpec, upstream: str) -> str:
    if current is None:
        rates = ", ".join(f"{k} {_text(getattr(row, k))}" for k in MONEY_KEYS if getattr(row, k) is not None)
        return f"+ {row.model} ({upstream}): {rates}"
    moved = [k for k in MONEY_KEYS if getattr(current, k) != getattr(row, k)]
    rates = ", ".join(f"{k} {_text(getattr(current, k))} -> {_text(getattr(row, k))}" for k in moved)
    return f"~ {row.model} ({upstream}): {rates}"


def _text(value: Any) -> str:
    return "none" if value is None else format(value.normalize(), "f")


def toml_rows(provider: str, rows: list[PriceSpec], when: datetime) -> str:
    """`[[prices]]` tables for a catalog file (money as strings, as the files want it)."""
    if not rows:
        return ""
    stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    out = [f"\n# from {provider}'s /models at {stamp} (`switchyard catalog import`): review, then `catalog sync`\n"]
    for row in rows:
        out.append(f"\n[[prices]]\nprovider = {json.dumps(provider)}\nmodel = {json.dumps(row.model)}\n")
        out.append(f"effective_from = {stamp}\n")
        out.extend(f'{k} = "{_text(getattr(row, k))}"\n' for k in MONEY_KEYS if getattr(row, k) is not None)
    return "".join(out)


def _append(path: Path, text: str, settings: Settings) -> None:
    with path.open("a", encoding="utf-8") as file:
        file.write(text)
    print(f"switchyard: appended to {path}", file=sys.stderr)
    patterns = settings.catalog.files
    base = Path(settings.base_dir)
    if patterns is None or not any(fnmatch.fnmatch(str(path.resolve()), str((base / p).resolve())) for p in patterns):
        warning = f"{path} is not among [catalog] files: `catalog sync` will not read it"
        print(f"switchyard: warning: {warning}", file=sys.stderr)
