"""`switchyard catalog import PROVIDER`: a provider's listed prices as catalog TOML to review.

    switchyard catalog import PROVIDER [--write FILE] [--effective-from ISO]

cost.md: provider model lists that carry prices (primalabs `/models`) "can be imported the same
way, as a reviewed diff". The same way is the catalog files: this command asks the provider for its
list (`GET {base_url}/models` with its key; the conventions read are `providers.model_prices`'),
compares each rate with the catalog files' price in effect for the catalog model deployed on that
upstream model (`plain_model`: case aside, without a `models/` prefix, as the health probe reads a
list), and proposes a `[[prices]]` row, effective now (or `--effective-from`), for every
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
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from app.settings import Settings, key_missing, provider_configs
from catalog.files import MONEY_KEYS, CatalogFile, PriceSpec, load_catalog
from providers.adapter import Provider, make_client
from providers.model_prices import ListedPrice, ModelList, plain_model, read_model_list

COMMAND = "import"


def register(catalog_commands: Any, config_option: Any) -> None:
    parser: argparse.ArgumentParser = catalog_commands.add_parser(
        COMMAND, help="propose prices from a provider's model list, as catalog TOML to review"
    )
    parser.add_argument("provider", help="a provider of the config whose /models lists prices")
    parser.add_argument("--write", metavar="FILE", help="append the proposed rows to this catalog file")
    parser.add_argument("--effective-from", help="when they apply: an ISO 8601 date-time, UTC (default: now)")
    config_option(parser)


LIST_TIMEOUT_S = 30.0  # the whole answer; the client's 10 s bounds each read, and a trickle never ends


class Collision(ValueError):
    """A proposed row at an instant the files already give a price for that model (bad usage)."""


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
    catalog = load_catalog(settings.catalog.files, Path(settings.base_dir), settings.source)
    try:
        listing = read_model_list(asyncio.run(_fetch(settings, name)))
        rows, summary = propose(catalog, name, listing, when)
    except Collision as exc:
        print(f"switchyard: --effective-from: {exc}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError) as exc:
        why = str(exc) or f"{name} sent no whole model list within {LIST_TIMEOUT_S:g} s"
        print(f"switchyard: {why}", file=sys.stderr)
        return 1
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        print(f"switchyard: {name}'s /models is no model list: {exc}", file=sys.stderr)
        return 1
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
        async with asyncio.timeout(LIST_TIMEOUT_S):
            return await Provider(config, client).model_list()
    finally:
        await client.aclose()


def _when(text: str | None) -> datetime | None:
    """The rows' instant, to the second (the file keeps seconds); None for what is no date-time."""
    if text is None:
        return datetime.now(UTC).replace(microsecond=0)
    try:
        value = datetime.fromisoformat(text)
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (ValueError, OverflowError):  # an offset that moves it out of the years 1 to 9999
        return None
    return value.replace(microsecond=0)


def propose(
    catalog: CatalogFile, provider: str, listing: ModelList, when: datetime
) -> tuple[list[PriceSpec], list[str]]:
    """The rows to add, and the summary's lines (module doc). A catalog model priced two ways by
    the list (deployed on two upstream models, or an id listed twice) gets no row: a conflict."""
    deployed: dict[str, list[str]] = {}  # upstream model (`plain_model`) -> catalog models deployed on it here
    for model in catalog.models:
        for deployment in model.deployments:
            if deployment.provider == provider:
                deployed.setdefault(plain_model(deployment.upstream_model), []).append(model.id)
    current = {m: _in_effect(catalog, provider, m, when) for models in deployed.values() for m in models}
    ways: dict[str, dict[tuple[Any, ...], tuple[PriceSpec, str]]] = {}  # model -> rates -> (row, upstream)
    for listed in listing.priced:
        for model_id in deployed.get(plain_model(listed.model), []):
            row = _row(provider, model_id, listed, when, current[model_id])
            ways.setdefault(model_id, {}).setdefault(_rates(row), (row, listed.model))
    rows: list[PriceSpec] = []
    lines: list[str] = []
    for model_id, found in ways.items():
        if len(found) > 1:
            listed_as = _names(upstream for _, upstream in found.values())
            lines.append(f"! {model_id}: listed at {len(found)} different prices ({listed_as}): no row")
            continue
        ((row, upstream),) = found.values()
        was = current[model_id]
        if was is not None and _rates(was) == _rates(row):
            continue
        if was is not None and was.effective_from == when:
            raise Collision(f"the files already price {model_id} on {provider} from {_stamp(when)}")
        rows.append(row)
        lines.append(_change(was, row, upstream))
    return rows, [_head(provider, lines, len(ways)), *lines, *_notes(catalog, provider, listing)]


def _rates(price: PriceSpec) -> tuple[Any, ...]:
    return tuple(getattr(price, key) for key in MONEY_KEYS)


def _head(provider: str, lines: list[str], priced: int) -> str:
    changed, added, conflicts = (sum(line.startswith(mark) for line in lines) for mark in "~+!")
    unchanged = priced - changed - added - conflicts
    return f"{provider}: {changed} changed, {added} new, {unchanged} unchanged"


def _notes(catalog: CatalogFile, provider: str, listing: ModelList) -> list[str]:
    """What could not be matched, each model named as its side spells it (compared `plain_model`)."""
    upstream = {d.upstream_model for m in catalog.models for d in m.deployments if d.provider == provider}
    listed = {price.model for price in listing.priced}
    deployed, priced = {plain_model(name) for name in upstream}, {plain_model(name) for name in listed}
    notes = [
        (
            "not in the catalog here (listed with prices, no catalog model deployed on them)",
            sorted(name for name in listed if plain_model(name) not in deployed),
        ),
        (
            "no price listed for (their catalog prices stay)",
            sorted(name for name in upstream if plain_model(name) not in priced),
        ),
    ]
    found = [f"{what}: {_names(names)}" for what, names in notes if names]
    if listing.unreadable:
        found.append("unreadable: " + ", ".join(f"{_shown(model)} ({why})" for model, why in listing.unreadable))
    return found


def _names(names: Iterable[str]) -> str:
    return ", ".join(_shown(name) for name in names)


def _shown(name: str) -> str:
    """An upstream's id for a terminal: as it is, or quoted when it holds control characters."""
    return name if name.isprintable() else repr(name)


def _in_effect(catalog: CatalogFile, provider: str, model: str, when: datetime) -> PriceSpec | None:
    rows = [p for p in catalog.prices if (p.provider, p.model) == (provider, model) and p.effective_from <= when]
    return max(rows, key=lambda p: p.effective_from, default=None)


def _row(provider: str, model: str, listed: ListedPrice, when: datetime, current: PriceSpec | None) -> PriceSpec:
    """The listed rates; a bucket the list gives no rate for keeps the current one (the list says
    nothing about it: a cache-read rate dropped would bill cache reads at the input rate)."""
    rates = {key: getattr(listed, key) for key in MONEY_KEYS}
    for key, rate in rates.items():
        if rate is None and current is not None:
            rates[key] = getattr(current, key)
    return PriceSpec(provider=provider, model=model, effective_from=when, **rates)


def _change(current: PriceSpec | None, row: PriceSpec, upstream: str) -> str:
    if current is None:
        rates = ", ".join(f"{k} {_text(getattr(row, k))}" for k in MONEY_KEYS if getattr(row, k) is not None)
        return f"+ {row.model} ({_shown(upstream)}): {rates}"
    moved = [k for k in MONEY_KEYS if getattr(current, k) != getattr(row, k)]
    rates = ", ".join(f"{k} {_text(getattr(current, k))} -> {_text(getattr(row, k))}" for k in moved)
    return f"~ {row.model} ({_shown(upstream)}): {rates}"


def _text(value: Any) -> str:
    return "none" if value is None else format(value.normalize(), "f")


def toml_rows(provider: str, rows: list[PriceSpec], when: datetime) -> str:
    """`[[prices]]` tables for a catalog file (money as strings, as the files want it)."""
    if not rows:
        return ""
    stamp = _stamp(when)
    out = [f"\n# from {provider}'s /models at {stamp} (`switchyard catalog import`): review, then `catalog sync`\n"]
    for row in rows:
        out.append(f"\n[[prices]]\nprovider = {_toml_string(provider)}\nmodel = {_toml_string(row.model)}\n")
        out.append(f"effective_from = {stamp}\n")
        out.extend(f'{k} = "{_text(getattr(row, k))}"\n' for k in MONEY_KEYS if getattr(row, k) is not None)
    return "".join(out)


def _stamp(when: datetime) -> str:
    """A TOML datetime: four-digit years (strftime's %Y writes 999, which TOML refuses)."""
    return when.isoformat().replace("+00:00", "Z")


def _toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, but not its surrogate pairs (`\\ud83d`), so
    characters go as they are, DEL escaped (TOML refuses it raw)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _append(path: Path, text: str, settings: Settings) -> None:
    with path.open("a", encoding="utf-8") as file:
        file.write(text)
    print(f"switchyard: appended to {path}", file=sys.stderr)
    patterns = settings.catalog.files
    base = Path(settings.base_dir)
    if patterns is None or not any(fnmatch.fnmatch(str(path.resolve()), str((base / p).resolve())) for p in patterns):
        warning = f"{path} is not among [catalog] files: `catalog sync` will not read it"
        print(f"switchyard: warning: {warning}", file=sys.stderr)
