"""`switchyard keys create|list|update|revoke`: API keys on the configured database, no server needed.

`create` prints the secret on a line of its own (the only time it is shown; the key's id goes to
stderr), or with `--format json` the key object with a `secret` field. `update` changes only the
options given; `none` clears one (`--models none`: every model; `--budget-usd none`: no budget).
Like `serve`, the embedded SQLite database is brought up to date first (`auto_migrate`).

A change is announced on Redis when `[redis]` is configured (every process reloads the key within a
second); without Redis the running processes poll the table's watermark (every 0.5 s) and see it then.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET

from app.access.keyring import POLL_S, REDIS_POLL_S, announce, unshared_limit
from app.errors import clip
from app.settings import ConfigError, Settings
from catalog.database import open_engine
from catalog.files import CatalogFileError, load_catalog
from catalog.keys import (
    AMOUNT,
    KEY_ID,
    KeyChanges,
    KeyRecord,
    catalog_models,
    checked,
    create_key,
    file_resolver,
    list_keys,
    parse_expires,
    revoke_key,
    update_key,
)
from catalog.keys import to_builtins as key_builtins
from catalog.migrate import schema_ready
from catalog.saved_snapshot import save_keys

_NONE = "none"
_COLUMNS = ("id", "name", "owner", "prefix", "models", "budget", "rpm", "tpm", "max_concurrency", "expires", "state")


def add_parser(commands: Any, config_option: Callable[[argparse.ArgumentParser], None]) -> None:
    keys = commands.add_parser("keys", help="API keys").add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="a new key; prints its secret once")
    create.add_argument("--name", required=True)
    _options(create, config_option)
    update = keys.add_parser("update", help="change a key's options (an option given as `none` is cleared)")
    update.add_argument("id")
    update.add_argument("--name")
    _options(update, config_option)
    listing = keys.add_parser("list", help="every key, revoked ones too")
    listing.add_argument("--format", choices=("table", "json"), default="table")
    config_option(listing)
    revoke = keys.add_parser("revoke", help="revoke a key (refused from then on)")
    revoke.add_argument("id")
    revoke.add_argument("--format", choices=("table", "json"), default="table")
    config_option(revoke)


def _options(parser: argparse.ArgumentParser, config_option: Callable[[argparse.ArgumentParser], None]) -> None:
    add = parser.add_argument
    add("--owner", help="who the key's usage is attributed to (free text, e.g. a team)")
    add("--models", help="comma-separated catalog ids (default: every model)")
    add("--budget-usd", help="USD the key may spend in each budget period")
    add("--budget-period", choices=("day", "month", "total", _NONE), help="UTC calendar period (default: month)")
    add("--rpm", help="requests per minute")
    add("--tpm", help="tokens per minute (input and output)")
    add("--max-concurrency", help="requests in flight at once")
    add("--expires", help="a date (UTC midnight) or an ISO 8601 date-time (UTC without an offset)")
    add("--format", choices=("table", "json"), default="table")
    config_option(parser)


def run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        changes = _changes(args) if args.keys_command in ("create", "update") else None
    except ValueError as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2
    problem = unshared_limit(settings, changes) if changes is not None else None
    if problem is not None:
        option, _, detail = problem.partition(": ")
        print(f"switchyard: --{option.replace('_', '-')}: {detail}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(args, settings, changes))
    except ValueError as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2


def check_shared_limits(settings: Settings, keys: Iterable[KeyRecord]) -> None:
    """`serve` refuses several processes (workers x replicas) with `keys` that have limits and no
    `[redis]`: each process would enforce the whole limit on its own (access.md)."""
    processes = settings.server.workers * settings.server.replicas
    if settings.auth.mode != "keys" or settings.redis is not None or processes == 1:
        return
    limited = [key.id for key in keys if key.limited and key.revoked_at is None]
    if limited:
        raise ConfigError(
            f"{processes} processes (server.workers x server.replicas) and API keys with limits "
            f"({', '.join(limited[:3])}) need [redis]: limits must be shared to hold"
        )


async def _run(args: argparse.Namespace, settings: Settings, changes: KeyChanges | None) -> int:
    # a key may be made before the first start; the others read or change what is there, and run
    # against another directory's config they made an empty database and said "no key"
    create = args.keys_command == "create"
    await schema_ready(settings.database.url, migrate=settings.migrate_on_start, create=create)
    engine = open_engine(settings.database.url)
    try:
        command = args.keys_command
        if command == "list":
            _show(await list_keys(engine), args.format)
            return 0
        if command == "create":
            assert changes is not None
            record, secret = await create_key(engine, _with_catalog_ids(checked(changes), settings))
            if args.format == "json":
                print(msgspec.json.encode({**key_builtins(record), "secret": secret}).decode())
            else:  # the secret alone on stdout, for `$(…)`; its id, which the other commands take, beside
                print(secret, flush=True)  # delivered before the line that says so
                print(f"switchyard: created {record.id}; the secret is shown this once", file=sys.stderr)
            if record.expires_at is not None and record.expires_at <= datetime.now(UTC):
                print(f"switchyard: warning: {record.id} has expired already", file=sys.stderr)
        else:
            found = await _change(engine, args, changes, settings)
            if found is None:
                secret = args.id.startswith("sy-")  # not echoed: it is the key's secret, not its id
                print(
                    f"switchyard: no key {'with that id (it is a secret)' if secret else repr(args.id)}",
                    file=sys.stderr,
                )
                return 1
            record = found
            _show([record], args.format, single=True)
        _save_copy(await list_keys(engine), settings.journal_dir)
        if settings.redis is not None and not await announce(settings.redis, record.id):
            print(
                f"switchyard: warning: Redis could not be reached, so running servers see this change "
                f"at their next poll (every {POLL_S:g} s; {REDIS_POLL_S:g} s at the latest), not at once",
                file=sys.stderr,
            )
        return 0
    finally:
        await engine.dispose()


def _save_copy(keys: list[KeyRecord], journal_dir: Path) -> None:
    """The key table as it now is, over the copy a server saved beside its journal, when this
    host has that directory: a server starting with the database down reads that copy, and a key
    revoked while no server ran would have worked there until the database came back. A server
    elsewhere keeps its own copy, which it rewrites at its next read of the table."""
    if not journal_dir.is_dir():
        return
    try:
        save_keys(keys, journal_dir)
    except OSError as exc:
        print(f"switchyard: warning: the key copy in {journal_dir} was not rewritten: {exc}", file=sys.stderr)


def _with_catalog_ids(changes: KeyChanges, settings: Settings) -> KeyChanges:
    """`changes` with its models as ids of the configured catalog (its files: the database's
    catalog is only filled when the service starts or `catalog sync` runs)."""
    if not isinstance(changes.models, tuple):
        return changes
    try:
        catalog = load_catalog(settings.catalog.files, Path(settings.base_dir), settings.source)
    except CatalogFileError as exc:
        raise ValueError(f"models: the catalog cannot be read: {exc}") from None
    return catalog_models(changes, file_resolver(catalog))


async def _change(
    engine: Any, args: argparse.Namespace, changes: KeyChanges | None, settings: Settings
) -> KeyRecord | None:
    if KEY_ID.fullmatch(args.id) is None:  # no query for what cannot be an id (a NUL is a PostgreSQL error)
        return None
    if args.keys_command == "revoke":
        return await revoke_key(engine, args.id)
    assert changes is not None
    current = next((key for key in await list_keys(engine) if key.id == args.id), None)
    if current is None:
        return None
    return await update_key(engine, args.id, _with_catalog_ids(checked(changes, current), settings))


def _changes(args: argparse.Namespace) -> KeyChanges:
    def given(value: str | None, parse: Callable[[str], Any]) -> Any:
        if value is None:
            return UNSET
        return None if value == _NONE else parse(value)

    return KeyChanges(
        name=args.name if args.name is not None else UNSET,
        owner=given(args.owner, str),
        models=given(args.models, lambda text: tuple(m.strip() for m in text.split(",") if m.strip())),
        budget_usd=given(args.budget_usd, _amount),
        budget_period=given(args.budget_period, str),
        rpm=given(args.rpm, _count("rpm")),
        tpm=given(args.tpm, _count("tpm")),
        max_concurrency=given(args.max_concurrency, _count("max-concurrency")),
        expires_at=given(args.expires, parse_expires),
    )


def _amount(text: str) -> Decimal:
    if not AMOUNT.fullmatch(text):  # Decimal() reads '5_0' as 50
        raise ValueError(f"--budget-usd: '{clip(text)}' is not an amount (digits, a point and digits: 25 or 25.50)")
    try:
        return Decimal(text)
    except InvalidOperation:
        raise ValueError(f"--budget-usd: '{text}' is not an amount") from None


def _count(option: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()):  # not '²' or '١٢', which `isdigit` also takes
            raise ValueError(f"--{option}: '{text}' is not a whole number")
        return int(text)

    return parse


def _show(records: list[KeyRecord], format: str, single: bool = False) -> None:
    if format == "json":
        data = [key_builtins(record) for record in records]
        print(msgspec.json.encode(data[0] if single else data).decode())
        return
    rows = [_COLUMNS, *(_row(record) for record in records)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _row(record: KeyRecord) -> tuple[str, ...]:
    budget = f"${record.budget_usd.normalize():f}/{record.budget_period}" if record.budget_usd is not None else "-"
    state = "revoked" if record.revoked_at is not None else "active" if record.usable(datetime.now(UTC)) else "expired"
    return (
        record.id,
        record.name,
        record.owner or "-",
        record.prefix + "…",
        ",".join(record.models) if record.models is not None else "*",
        budget,
        str(record.rpm or "-"),
        str(record.tpm or "-"),
        str(record.max_concurrency or "-"),
        record.expires_at.isoformat() if record.expires_at is not None else "-",
        state,
    )
