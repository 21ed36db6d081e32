"""The gate's leased path (`AccessGate.admit`): a busy key's requests are admitted from this
process's lease in the key's lane, with no Redis command, their `x-ratelimit-*` headers counting
down, and settle summed — against the real Redis on this machine, through a tap that sees every
command."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import msgspec
import structlog
from redis import Redis

from app.access.gate import AccessGate, Ticket
from app.access.keyring import Entry, KeyRing
from app.access.lease import LEASE_MIN
from app.context import RequestContext, new_context
from app.metrics import Counter
from app.pipeline.events import header_pairs
from app.settings import RedisSettings, Settings
from catalog.database import open_engine
from catalog.keys import KeyRecord
from catalog.snapshot import CatalogSnapshot, ModelEntry
from providers.types import CompletionRequest, Message, TextPart
from tests.access.test_redis_lease import _early_in_a_second, _window
from tests.access.test_redis_limiter import URL, _Tap
from tests.access.test_worstcase import _snapshot


async def _admit(
    gate: AccessGate,
    entry: Entry,
    ctx: RequestContext,
    request: CompletionRequest,
    model: ModelEntry,
    snapshot: CatalogSnapshot,
) -> Ticket:
    """As the pipeline admits: from the lease (`reserve`), else by the limiter (`admit`); route: "a"."""
    ticket = gate.reserve(entry, ctx, request, model, ("a",), snapshot)
    return ticket if isinstance(ticket, Ticket) else await gate.admit(entry, ctx, ticket)


def _header(ticket: Ticket, name: bytes) -> bytes:
    return dict(header_pairs(ticket.headers))[name]


async def test_a_busy_key_is_admitted_from_its_lane_without_redis(prefix: str, tap: tuple[_Tap, int]) -> None:
    wire, port = tap
    settings = msgspec.structs.replace(
        Settings(), redis=RedisSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix=prefix)
    )
    engine = open_engine("sqlite+aiosqlite://")  # never connected: the key has no budget to load
    log = structlog.get_logger("test")
    gate = AccessGate(settings, engine, KeyRing(engine, settings.auth, None, log), log, Counter("c", "c", ()))
    now = datetime.now(UTC)
    entry = Entry(
        KeyRecord(
            id="k1", name="n", secret_hash="00" * 32, prefix="sy-x", created_at=now, updated_at=now, rpm=1000, tpm=10**6
        )
    )
    snapshot, model = _snapshot(("a", "2026-01-01T00:00:00+00:00", "1", "4"))
    request = CompletionRequest(messages=[Message(role="user", content=[TextPart(data="hi")])], max_tokens=16)
    reserved = 57 + 2 * 16 + 16  # its messages' JSON, an allowance per message and one more, max_tokens
    try:
        await _early_in_a_second()
        tickets = []
        for n in range(LEASE_MIN):
            ctx = new_context(f"r{n}", "native", stream=False, deadline=0.0, principal=entry.principal)
            ticket = await _admit(gate, entry, ctx, request, model, snapshot)
            assert ticket is not None
            tickets.append(ticket)
        first, *leased = tickets
        assert first.ask is not None
        assert first.lane is None
        assert all(t.ask is None and t.lane is not None and t.second == first.second for t in leased)
        assert b"".join(wire.writes).count(gate._shared.admit_script.sha.encode()) == 1  # type: ignore[union-attr]
        remaining = [int(_header(t, b"x-ratelimit-remaining-requests")) for t in tickets]
        assert remaining == [1000 - n for n in range(1, LEASE_MIN + 1)]
        tokens = [int(_header(t, b"x-ratelimit-remaining-tokens")) for t in tickets]
        assert tokens == [10**6 - reserved * n for n in range(1, LEASE_MIN + 1)]
        assert first.ask.tokens == reserved
        assert leased[0].tokens == reserved

        for ticket in tickets:
            gate.settle(ticket, Decimal("0.000001"), 40)  # each used 40 of the tokens it reserved
        await gate.close()  # the summed settlements sent and answered
        sent = b"".join(wire.writes)
        assert sent.count(gate._shared.settle_script.sha.encode()) == 1  # type: ignore[union-attr]
        window = _window(prefix)
        assert (window[b"R"], window[b"T"]) == (b"%d" % LEASE_MIN, b"%d" % (40 * LEASE_MIN))
    finally:
        await engine.dispose()


async def test_a_new_budget_period_takes_a_new_lane(prefix: str) -> None:
    """A lane is kept until its key's budget period ends: an admission in the next period goes to
    Redis under that period's spend, never to the old period's lease."""
    settings = msgspec.structs.replace(Settings(), redis=RedisSettings(url=URL, key_prefix=prefix))
    engine = open_engine("sqlite+aiosqlite://")
    log = structlog.get_logger("test")
    gate = AccessGate(settings, engine, KeyRing(engine, settings.auth, None, log), log, Counter("c", "c", ()))
    now = datetime.now(UTC)
    record = KeyRecord(
        id="k1",
        name="n",
        secret_hash="00" * 32,
        prefix="sy-x",
        created_at=now,
        updated_at=now,
        budget_usd=Decimal(1000),
        budget_period="day",
        rpm=1000,
    )
    entry = Entry(record)
    snapshot, model = _snapshot(("a", "2026-01-01T00:00:00+00:00", "1", "4"))
    request = CompletionRequest(messages=[Message(role="user", content=[TextPart(data="hi")])], max_tokens=16)
    client = Redis.from_url(URL)
    try:
        for day in ("2026-12-03", "2026-12-04"):  # the spend of each day is there: no ledger to read
            client.hset(f"{prefix}:lim:{{k1}}:spend:d{day.replace('-', '')}", mapping={"s": 0, "r": 0})
        await _early_in_a_second()
        tickets = []
        for n, when in enumerate(("2026-12-03T23:59:59.5", "2026-12-03T23:59:59.6", "2026-12-04T00:00:00")):
            ctx = new_context(f"r{n}", "native", stream=False, deadline=0.0, principal=entry.principal)
            ctx = msgspec.structs.replace(ctx, started_at=datetime.fromisoformat(when).replace(tzinfo=UTC))
            ticket = await _admit(gate, entry, ctx, request, model, snapshot)
            assert ticket is not None
            tickets.append(ticket)
        assert tickets[1].lane is not None  # the same day: from the lease
        assert tickets[2].ask is not None
        assert tickets[2].ask.period == "d20261204"
        # each day's own lease of LEASE_MIN, at the worst case of (89 in x $1 + 16 out x $4) / 1M
        reserved = [client.hget(f"{prefix}:lim:{{k1}}:spend:d{day}", "r") for day in ("20261203", "20261204")]
        assert reserved == [b"%d" % (LEASE_MIN * 153_000)] * 2
    finally:
        await gate.close()
        client.close()
        await engine.dispose()


async def test_a_new_catalog_keeps_the_keys_lease(prefix: str, tap: tuple[_Tap, int]) -> None:
    """A new catalog snapshot (a reload, a price change) makes the route's plan again, but the key's
    lane and its lease go on: the next request is still admitted from the lease, without Redis."""
    wire, port = tap
    settings = msgspec.structs.replace(
        Settings(), redis=RedisSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix=prefix)
    )
    engine = open_engine("sqlite+aiosqlite://")
    log = structlog.get_logger("test")
    gate = AccessGate(settings, engine, KeyRing(engine, settings.auth, None, log), log, Counter("c", "c", ()))
    now = datetime.now(UTC)
    entry = Entry(
        KeyRecord(id="k1", name="n", secret_hash="00" * 32, prefix="sy-x", created_at=now, updated_at=now, rpm=1000)
    )
    snapshot, model = _snapshot(("a", "2026-01-01T00:00:00+00:00", "1", "4"))
    reloaded, _model = _snapshot(("a", "2026-01-01T00:00:00+00:00", "1", "4"))
    request = CompletionRequest(messages=[Message(role="user", content=[TextPart(data="hi")])], max_tokens=16)
    try:
        await _early_in_a_second()
        first = await _admit(
            gate, entry, new_context("r0", "native", stream=False, deadline=0.0), request, model, snapshot
        )
        assert first.ask is not None  # Redis's admission, which brought the lease
        ctx = new_context("r1", "native", stream=False, deadline=0.0)
        leased = gate.reserve(entry, ctx, request, model, ("a",), reloaded)
        assert isinstance(leased, Ticket)
        assert leased.lane is not None
        assert b"".join(wire.writes).count(gate._shared.admit_script.sha.encode()) == 1  # type: ignore[union-attr]
    finally:
        await gate.close()
        await engine.dispose()
