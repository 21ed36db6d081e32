"""A key's `updated_at` is its version: the key ring keeps the later of two, and the processes'
poll reads the table's latest (`catalog.keys._stamp`). Every change moves it past every key's,
whatever the writing host's clock, and changes made at once get distinct versions, on SQLite and
on PostgreSQL: a tie kept a process's held version, and a watermark that did not move hid the
second change from the poll."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.keys import KeyChanges, create_key, keys_watermark, list_keys, revoke_key, update_key
from catalog.tables import ApiKey


async def test_concurrent_changes_get_distinct_versions_past_a_clock_ahead(engine: AsyncEngine) -> None:
    keys = [(await create_key(engine, KeyChanges(name=f"k{n}")))[0] for n in range(4)]
    ahead = keys[-1].updated_at + timedelta(seconds=30)  # the last writer's clock was ahead of ours
    async with engine.begin() as conn:
        await conn.execute(update(ApiKey).values(updated_at=ahead))
    changes = [
        update_key(engine, keys[0].id, KeyChanges(name="a")),
        update_key(engine, keys[0].id, KeyChanges(name="b")),  # the same key twice at once
        update_key(engine, keys[1].id, KeyChanges(rpm=5)),
        revoke_key(engine, keys[2].id),
        create_key(engine, KeyChanges(name="new")),
    ]
    await asyncio.gather(*changes)
    stamps = sorted(record.updated_at for record in await list_keys(engine) if record.updated_at > ahead)
    assert len(stamps) == 4  # keys 0, 1 and 2, and the new one: key 3 kept the old version
    assert len(set(stamps)) == 4
    assert (await keys_watermark(engine))[1] == stamps[-1]
    key_0 = next(record for record in await list_keys(engine) if record.id == keys[0].id)
    assert key_0.name in ("a", "b")
