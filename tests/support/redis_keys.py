"""`redis_prefix`: a key prefix of the test's own on the machine's Redis (db 0), its keys deleted
after the test, for gateways that share routing state and metrics through it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    client = Redis.from_url(REDIS_URL)
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()
