"""The key ring's lookup (`app.access.keyring.KeyRing.authenticate`): by the SHA-256 of the secret as
the table stores it (`catalog.keys.hash_secret`), for an ASCII secret hashed from its bytes and for
any other byte string as UTF-8 or Latin-1 text; and the gate's check that the key is still held."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import msgspec
import pytest
import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.access.gate import AccessGate
from app.access.keyring import KeyRing
from app.context import new_context
from app.errors import AuthenticationFailed
from app.metrics import Counter
from app.settings import Settings
from catalog.database import open_engine
from catalog.keys import (
    KeyChanges,
    KeyRecord,
    create_key,
    hash_secret,
    keys_watermark,
    list_keys,
    revoke_key,
    update_key,
)
from catalog.migrate import upgrade_async
from catalog.snapshot import ModelEntry


def _ring(*secrets: str) -> KeyRing:
    settings = Settings()
    ring = KeyRing(open_engine("sqlite+aiosqlite://"), settings.auth, None, structlog.get_logger("test"))
    now = datetime.now(UTC)
    for index, secret in enumerate(secrets):
        hashed = hash_secret(secret)
        ring.apply(KeyRecord(id=f"k{index}", secret_hash=hashed, prefix="", name="k", created_at=now, updated_at=now))
    return ring


@pytest.mark.parametrize(
    ("header", "value"),
    [(b"authorization", b"Bearer sy-" + b"a" * 43), (b"x-api-key", b"sy-" + b"a" * 43)],
)
def test_an_ascii_secret_is_found_by_its_hash(header: bytes, value: bytes) -> None:
    ring = _ring("sy-" + "b" * 43, "sy-" + "a" * 43)
    assert ring.authenticate([(b"host", b"x"), (header, value)]).record.id == "k1"


def test_a_secret_of_other_bytes_is_found_as_its_text_was_hashed() -> None:
    secret = "sy-caf\u00e9-" + "a" * 40  # sent as latin-1 bytes, the way an HTTP header carries them
    ring = _ring(secret)
    assert ring.authenticate([(b"authorization", b"Bearer " + secret.encode("latin-1"))]).record.id == "k0"


def test_an_unknown_or_missing_secret_is_refused() -> None:
    ring = _ring("sy-" + "a" * 43)
    for headers in ([(b"authorization", b"Bearer sy-" + b"c" * 43)], [(b"x-api-key", b"sy-caf\xe9")], []):
        with pytest.raises(AuthenticationFailed):
            ring.authenticate(headers)


_A, _B = b"sy-" + b"a" * 43, b"sy-" + b"b" * 43


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"x-api-key", _A), (b"authorization", b"Bearer " + _B)], "k1"),
        ([(b"authorization", b"Bearer " + _B), (b"x-api-key", _A)], "k0"),
        ([(b"authorization", b"Bearer " + _A), (b"authorization", b"bearer " + _B)], "k1"),
        ([(b"x-api-key", _A), (b"authorization", b"Token " + _B)], "k0"),  # another scheme is not a key
        ([(b"x-api-key", _B), (b"authorization", b"Basic " + base64.b64encode(b"u:" + _A))], "k0"),
        ([(b"authorization", b"Basic " + base64.b64encode(b"spend:" + _B))], "k1"),
        ([(b"x-api-key", b"  " + _A + b" ")], "k0"),
    ],
)
def test_the_last_credential_sent_is_the_one_used(headers: list[tuple[bytes, bytes]], expected: str) -> None:
    ring = _ring(_A.decode(), _B.decode())
    assert ring.authenticate(headers, basic=True).record.id == expected


def test_a_basic_credential_counts_only_where_asked() -> None:
    """Only the spend page's routes take a Basic password (`require_page_key`)."""
    ring = _ring(_A.decode(), _B.decode())
    credential = (b"authorization", b"Basic " + base64.b64encode(b"u:" + _A))
    assert ring.authenticate([credential], basic=True).record.id == "k0"
    with pytest.raises(AuthenticationFailed):
        ring.authenticate([credential])
    assert ring.authenticate([(b"x-api-key", _B), credential]).record.id == "k1"  # ignored, not a refusal


def test_a_secret_of_other_bytes_sent_as_utf8_is_found_too() -> None:
    secret = "sy-caf\u00e9-" + "a" * 40  # curl sends the terminal's bytes: UTF-8
    ring = _ring(secret)
    assert ring.authenticate([(b"x-api-key", secret.encode())]).record.id == "k0"


def test_an_authorization_of_another_scheme_alone_is_refused() -> None:
    ring = _ring(_A.decode())
    with pytest.raises(AuthenticationFailed):
        ring.authenticate([(b"authorization", b"Token " + _A)])


@pytest.fixture
async def table(tmp_path: Any) -> AsyncIterator[AsyncEngine]:
    """A migrated SQLite database of the test's own, for the ring's snapshots of the keys table."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}"
    await upgrade_async(url)
    engine = open_engine(url)
    yield engine
    await engine.dispose()


def _table_ring(engine: AsyncEngine) -> KeyRing:
    return KeyRing(engine, Settings().auth, None, structlog.get_logger("test"))


def _headers(secret: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", b"Bearer " + secret.encode())]


async def test_a_snapshot_taken_before_a_revocation_does_not_bring_the_key_back(table: AsyncEngine) -> None:
    """The poll's snapshot read before a revocation, arriving after the revocation's pub/sub
    reload was applied: the key stays refused, and a late reload of its pre-revocation version
    changes nothing either."""
    ring = _table_ring(table)
    record, secret = await create_key(table, KeyChanges(name="agent"))
    await ring.reload()
    assert ring.authenticate(_headers(secret)).record.id == record.id
    stale = await list_keys(table)
    revoked = await revoke_key(table, record.id)
    assert revoked is not None
    ring.apply(revoked)
    ring.merge(stale)
    with pytest.raises(AuthenticationFailed):
        ring.authenticate(_headers(secret))
    ring.apply(record)
    with pytest.raises(AuthenticationFailed):
        ring.authenticate(_headers(secret))
    assert record.id not in ring.by_id


async def test_a_snapshot_older_than_a_change_keeps_the_change_and_the_new_key(table: AsyncEngine) -> None:
    """A key created and a budget changed in this process while a snapshot of the table was on its
    way: the merge keeps both (the older version of the changed key loses by `updated_at`)."""
    ring = _table_ring(table)
    first, _ = await create_key(table, KeyChanges(name="first", budget_usd=Decimal(1), budget_period="day"))
    await ring.reload()
    stale = await list_keys(table)
    changed = await update_key(table, first.id, KeyChanges(budget_usd=Decimal(5)))
    assert changed is not None
    ring.apply(changed)
    second, secret = await create_key(table, KeyChanges(name="second"))
    ring.apply(second)
    ring.merge(stale)
    assert ring.by_id[first.id].record.budget_usd == Decimal(5)
    assert ring.by_id[first.id].budget_nano == 5_000_000_000
    assert ring.authenticate(_headers(secret)).record.id == second.id
    await ring.reload()  # a fresh snapshot has both as they are
    assert ring.by_id[first.id].record.budget_usd == Decimal(5)
    assert ring.authenticate(_headers(secret)).record.id == second.id


@pytest.mark.parametrize("change", ["update", "revoke", "create"])
async def test_a_change_from_a_host_whose_clock_is_behind_still_reaches_the_ring(
    table: AsyncEngine, change: str
) -> None:
    """The version processes hold was written by a host whose clock is 30 s ahead (a replica);
    the CLI's change, on a clock behind it, must still move the key's version and the table's
    watermark forward: processes kept their version, the change never reached them."""
    record, secret = await create_key(table, KeyChanges(name="k"))
    async with table.begin() as conn:  # the last writer's clock was ahead
        await conn.execute(text("UPDATE keys SET updated_at = :at"), {"at": _sqlite_time(record.updated_at, 30)})
    ring = _table_ring(table)
    await ring.reload()
    held = ring.by_id[record.id].record.updated_at
    assert held >= record.updated_at + timedelta(seconds=30)
    if change == "update":
        changed = await update_key(table, record.id, KeyChanges(name="renamed"))
    elif change == "revoke":
        changed = await revoke_key(table, record.id)
    else:
        changed, _ = await create_key(table, KeyChanges(name="new"))
    assert changed is not None
    assert changed.updated_at > held
    assert (await keys_watermark(table))[1] == changed.updated_at  # the poll sees it
    ring.apply(changed)
    if change == "update":
        assert ring.by_id[record.id].record.name == "renamed"
    elif change == "revoke":
        with pytest.raises(AuthenticationFailed):
            ring.authenticate(_headers(secret))
    else:
        assert changed.id in ring.by_id


def _sqlite_time(at: datetime, ahead_s: int) -> str:
    """How `UTCDateTime` keeps a time on SQLite (naive UTC ISO text), `ahead_s` later."""
    return (at + timedelta(seconds=ahead_s)).astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ")


def test_a_key_revoked_after_the_edge_authenticated_it_is_refused_at_the_gate() -> None:
    """The edge authenticates before the body is decoded; a revocation applied before the pipeline
    asks the gate is a 401 there, not a request with no key's limits (the gate fails closed)."""
    settings = Settings()
    ring = _ring(_A.decode())
    engine = open_engine("sqlite+aiosqlite://")  # never connected
    log = structlog.get_logger("test")
    gate = AccessGate(settings, engine, ring, log, Counter("c", "c", ()))
    entry = ring.authenticate([(b"x-api-key", _A)])
    ctx = new_context("r1", "unified", stream=False, deadline=0.0, principal=entry.principal)
    model = ModelEntry("m", (), 8192, 1024, frozenset(), True, ())
    assert gate.permit(ctx, model) is entry
    ring.apply(msgspec.structs.replace(entry.record, revoked_at=datetime.now(UTC), updated_at=datetime.now(UTC)))
    with pytest.raises(AuthenticationFailed):
        gate.permit(ctx, model)
