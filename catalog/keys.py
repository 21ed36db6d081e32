"""API keys at rest: the secret's shape and hash, the key's record, and the `keys` table.

Secrets are `sy-` followed by 32 random bytes in base64url (43 characters): 256 bits from
`secrets`, so a plain SHA-256 of the secret is a safe thing to store and to look up by — there is
nothing to brute-force, no salt or slow hash is needed, and a lookup is an index probe on the hash,
never a comparison of plain-text secrets (the admin key from the environment is looked up the same
way, by its hash: `app.access.keyring`). A display prefix (`sy-` and 4 characters) lets a person
tell keys apart in lists without the secret.

Key ids are `key_` and 16 hex digits: short enough for a log line and a metrics label, random so
they say nothing about the order or number of keys.

Spend (`spent_since`) is the ledger's cost sum for a key since a moment, exact on both databases:
the usage report's total for the key.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from catalog.files import CatalogFile, control
from catalog.tables import ApiKey
from catalog.usage_query import UsageQuery
from catalog.usage_report import usage_report

SECRET_PREFIX = "sy-"  # noqa: S105  # the secrets' public prefix, not a secret
SECRET_BYTES = 32
DISPLAY_CHARS = 4
SPEND_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # `spent_since(…, None)`: every row
SPEND_END = datetime(3000, 1, 1, tzinfo=UTC)  # `spent_since(…, until=None)`: no end
BudgetPeriod = Literal["day", "month", "total"]
_KEYS_LOCK = 0x6B657973  # pg_advisory_xact_lock key for key changes (`_stamp`)


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def display_prefix(secret: str) -> str:
    return secret[: len(SECRET_PREFIX) + DISPLAY_CHARS]


class KeyRecord(Struct, frozen=True, kw_only=True):
    """One key as the gateway holds it in memory (never the secret; the hash is the cache's index)."""

    id: str
    secret_hash: str
    prefix: str
    name: str
    owner: str | None = None
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    models: tuple[str, ...] | None = None
    budget_usd: Decimal | None = None
    budget_period: BudgetPeriod | None = None
    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None

    @property
    def limited(self) -> bool:
        """Whether any limit applies: then admission needs the limiter (Redis with several processes)."""
        return (
            self.budget_usd is not None
            or self.rpm is not None
            or self.tpm is not None
            or self.max_concurrency is not None
        )

    def usable(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


class KeyChanges(Struct, frozen=True, kw_only=True):
    """What `create_key` sets or `update_key` changes: UNSET leaves a field alone, None clears it."""

    name: str | UnsetType = UNSET
    owner: str | UnsetType | None = UNSET
    expires_at: datetime | UnsetType | None = UNSET
    models: tuple[str, ...] | UnsetType | None = UNSET
    budget_usd: Decimal | UnsetType | None = UNSET
    budget_period: BudgetPeriod | UnsetType | None = UNSET
    rpm: int | UnsetType | None = UNSET
    tpm: int | UnsetType | None = UNSET
    max_concurrency: int | UnsetType | None = UNSET

    def values(self) -> dict[str, object]:
        out = {f: v for f in self.__struct_fields__ if (v := getattr(self, f)) is not UNSET}
        if isinstance(out.get("models"), tuple):
            out["models"] = list(out["models"])
        return out


_COLUMNS = tuple(KeyRecord.__struct_fields__)


def _record(row: ApiKey) -> KeyRecord:
    values = {name: getattr(row, name) for name in _COLUMNS}
    if values["models"] is not None:
        values["models"] = tuple(values["models"])
    return KeyRecord(**values)


async def create_key(engine: AsyncEngine, changes: KeyChanges) -> tuple[KeyRecord, str]:
    """A new key; returns its record and its secret (which nothing keeps)."""
    if changes.name is UNSET:
        raise ValueError("a key needs a name")
    secret = new_secret()
    now = datetime.now(UTC)
    row = ApiKey(
        id=f"key_{secrets.token_hex(8)}",
        secret_hash=hash_secret(secret),
        prefix=display_prefix(secret),
        created_at=now,
        updated_at=now,  # until `_stamp`
        **changes.values(),
    )
    async with engine.begin() as conn:
        await conn.execute(insert(ApiKey).values(**{c: getattr(row, c) for c in _row_columns(row)}))
        await _stamp(conn, row.id)
    return await _get(engine, row.id), secret


def _row_columns(row: ApiKey) -> list[str]:
    return [column.key for column in ApiKey.__table__.columns if getattr(row, column.key, None) is not None]


async def _get(engine: AsyncEngine, key_id: str) -> KeyRecord:
    found = await get_key(engine, key_id)
    if found is None:
        raise LookupError(f"no key {key_id}")
    return found


async def get_key(engine: AsyncEngine, key_id: str) -> KeyRecord | None:
    async with engine.connect() as conn:
        row = (await conn.execute(select(ApiKey).where(ApiKey.id == key_id))).first()
    return _record(row) if row is not None else None  # type: ignore[arg-type]  # a Row reads like the model


async def find_by_secret(engine: AsyncEngine, secret: str) -> KeyRecord | None:
    """The key whose secret this is: an index lookup by hash, no plain-text comparison."""
    digest = hash_secret(secret)
    async with engine.connect() as conn:
        row = (await conn.execute(select(ApiKey).where(ApiKey.secret_hash == digest))).first()
    return _record(row) if row is not None else None  # type: ignore[arg-type]


async def list_keys(engine: AsyncEngine) -> list[KeyRecord]:
    async with engine.connect() as conn:
        rows = (await conn.execute(select(ApiKey).order_by(ApiKey.created_at, ApiKey.id))).all()
    return [_record(row) for row in rows]  # type: ignore[arg-type]  # a Row reads like the model


async def keys_watermark(engine: AsyncEngine) -> tuple[int, datetime | None]:
    """The table's number of keys and its latest `updated_at`: every creation, change and
    revocation moves one of them (a cheap check before reading every key again)."""
    async with engine.connect() as conn:
        count, latest = (await conn.execute(select(func.count(), func.max(ApiKey.updated_at)))).one()
    return int(count), latest


async def _stamp(conn: AsyncConnection, key_id: str) -> None:
    """Give a key changed in this transaction an `updated_at` past every key's (its own version
    before the change included): now, or 1 µs after the table's latest when that is not behind.

    Versions were written by each host's clock (the CLI's, each replica's): a change from a host
    behind the last writer's got an older `updated_at` than the version processes held, which
    kept theirs (`KeyRing.apply`), and the watermark they poll did not move, so the change never
    reached them until a restart. Two changes at once must not read the same latest either (a
    tie keeps the held version): on PostgreSQL a transaction-scoped advisory lock orders them; on
    SQLite the change itself does, as it holds the database's write lock until the commit."""
    if conn.dialect.name == "postgresql":
        await conn.execute(text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": _KEYS_LOCK})
    latest = (await conn.execute(select(func.max(ApiKey.updated_at)))).scalar_one()
    now = datetime.now(UTC)
    stamp = now if latest is None or latest < now else latest + timedelta(microseconds=1)
    await conn.execute(update(ApiKey).where(ApiKey.id == key_id).values(updated_at=stamp))


async def update_key(engine: AsyncEngine, key_id: str, changes: KeyChanges) -> KeyRecord | None:
    async with engine.begin() as conn:
        values = {**changes.values(), "updated_at": ApiKey.updated_at}  # a write whatever changes: the lock
        result = await conn.execute(update(ApiKey).where(ApiKey.id == key_id).values(**values))
        if result.rowcount:
            await _stamp(conn, key_id)
    return await get_key(engine, key_id) if result.rowcount else None


async def revoke_key(engine: AsyncEngine, key_id: str) -> KeyRecord | None:
    """Revoked keys stay (their ledger rows point at them); revoking twice keeps the first time."""
    async with engine.begin() as conn:
        result = await conn.execute(
            update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None)).values(revoked_at=datetime.now(UTC))
        )
        if result.rowcount:
            await _stamp(conn, key_id)
    return await get_key(engine, key_id)


async def spent_since(
    engine: AsyncEngine, key_id: str, since: datetime | None, until: datetime | None = None
) -> Decimal:
    """The ledger's cost total for `key_id` from `since` (None: ever) until `until` (exclusive; None:
    no end, so a row a replica's clock dated ahead counts too), exactly: the usage report's
    total for the key, so whole days and hours come from the roll-ups (`catalog.usage_report`). A
    sum over the raw rows read every row of the ledger for a key's all-time spend (the reporting
    index leads with the time): 172 ms at 2 million rows on PostgreSQL, and on SQLite each cost
    was read into Python."""
    query = UsageQuery(start=since or SPEND_EPOCH, end=until or SPEND_END, only_key=key_id, latency=False)
    total = (await usage_report(engine, query)).totals.cost_usd
    return Decimal(total) if total is not None else Decimal(0)


def to_builtins(record: KeyRecord) -> dict[str, object]:
    """The key as the API and `keys list --format json` show it: no hash."""
    data: dict[str, object] = msgspec.to_builtins(record)
    del data["secret_hash"]
    if record.budget_usd is not None:
        data["budget_usd"] = format(record.budget_usd.normalize(), "f")
    return data


def parse_expires(text: str) -> datetime:
    """`2027-01-01` (midnight UTC) or an ISO 8601 date-time (UTC when it names no offset)."""
    try:
        value = datetime.fromisoformat(text)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except ValueError:
        raise ValueError(f"expires: '{text[:64]}' is not a date or an ISO 8601 date-time") from None
    except OverflowError:  # an offset that moves it out of the years 1 to 9999
        raise ValueError(f"expires: '{text[:64]}' is out of range") from None


AMOUNT = re.compile(r"[0-9]+(?:\.[0-9]+)?")  # a budget as text: Decimal() also took '5_0' (50), ' 5', '1e3'
MIN_BUDGET = Decimal("0.000000001")  # a nano-dollar: the unit limits count in
MAX_BUDGET = Decimal(9_000_000)  # Redis counts nano-dollars in doubles, exact up to 2**53 (about $9.007 million)
MAX_LIMIT = 2**31 - 1  # rpm, tpm, max_concurrency: INTEGER columns
KEY_ID = re.compile(r"key_[0-9a-f]{16}")  # what `create_key` makes: anything else names no key
MAX_TEXT = 200  # name and owner: VARCHAR(200) columns (PostgreSQL refuses longer, SQLite keeps any)


def checked(changes: KeyChanges, current: KeyRecord | None = None) -> KeyChanges:
    """`changes` with the rules every way of making a key shares: a name that is not blank, a
    name and an owner without control characters that fit their columns, positive limits, a
    budget of at least a nano-dollar (less would be stored as 0), a period only with a budget and
    a budget always with one (a budget without one is per `month`), and at least one model when
    models are listed. ValueError names the option."""
    if isinstance(changes.name, str) and not changes.name.strip():
        raise ValueError("name: must not be empty")
    for option in ("name", "owner"):
        text = getattr(changes, option)
        if isinstance(text, str) and len(text) > MAX_TEXT:
            raise ValueError(f"{option}: at most {MAX_TEXT} characters")
        if isinstance(text, str) and any(control(char) for char in text):
            raise ValueError(f"{option}: must not hold control characters")  # a NUL PostgreSQL refuses, an ESC
    if changes.models == ():
        raise ValueError("models: name at least one model (leave it out, or none, for every model)")
    for option in ("rpm", "tpm", "max_concurrency"):
        value = getattr(changes, option)
        if isinstance(value, int) and not 1 <= value <= MAX_LIMIT:
            raise ValueError(f"{option}: must be from 1 to {MAX_LIMIT}")
    budget = changes.budget_usd
    if isinstance(budget, Decimal) and not (budget.is_finite() and budget > 0):
        raise ValueError("budget_usd: must be a positive amount")
    if isinstance(budget, Decimal) and budget < MIN_BUDGET:
        raise ValueError(f"budget_usd: must be at least {MIN_BUDGET:f} (a nano-dollar)")
    if isinstance(budget, Decimal) and budget > MAX_BUDGET:
        raise ValueError(f"budget_usd: must be at most {MAX_BUDGET:,f} (what the limiter counts exactly)")
    if isinstance(budget, Decimal) and budget != budget.quantize(MIN_BUDGET, rounding="ROUND_DOWN"):
        raise ValueError("budget_usd: at most 9 decimal places (limits count whole nano-dollars)")
    has_budget = budget is not None if budget is not UNSET else (current is not None and current.budget_usd is not None)
    if changes.budget_period not in (UNSET, None) and not has_budget:
        raise ValueError("budget_period: needs a budget (budget_usd)")
    if changes.budget_period is None and has_budget:
        raise ValueError("budget_period: a budget needs a period (day, month or total); clear budget_usd instead")
    period_known = current is not None and current.budget_period is not None
    if isinstance(budget, Decimal) and changes.budget_period is UNSET and not period_known:
        return msgspec.structs.replace(changes, budget_period="month")
    if budget is None:
        return msgspec.structs.replace(changes, budget_period=None)
    return changes


def catalog_models(changes: KeyChanges, resolve: Callable[[str], str | None]) -> KeyChanges:
    """`changes` with its `models` as catalog ids (access.md: allowed models are catalog ids): an
    alias becomes the id it names (`resolve`: a model name or alias to its id, None when the
    catalog does not know it), and a name the catalog does not know is a ValueError — stored as
    written, it would never match a request (a request's model is resolved to its id first)."""
    if not isinstance(changes.models, tuple):
        return changes
    resolved: list[str] = []
    for name in changes.models:
        model = resolve(name)
        if model is None:
            raise ValueError(f"models: unknown model '{name[:64]}' (not a catalog id or alias)")
        if model not in resolved:
            resolved.append(model)
    return msgspec.structs.replace(changes, models=tuple(resolved))


def file_resolver(catalog: CatalogFile) -> Callable[[str], str | None]:
    """`catalog_models`'s `resolve` over the configured catalog files (the CLI, without a server)."""
    names = {model.id: model.id for model in catalog.models}
    names |= {alias: model.id for model in catalog.models for alias in model.aliases}
    return names.get
