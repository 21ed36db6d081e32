"""Fixtures every test directory shares; their machinery lives in `tests/support`.

`start_gateway` starts a real Switchyard on loopback per test (`tests.support.gateway`); `logs`
reads back the JSON lines it wrote (`tests.support.logs`); `redis_prefix` is a Redis key prefix of
the test's own (`tests.support.redis_keys`).
"""

from __future__ import annotations

from tests.support.gateway import start_gateway
from tests.support.logs import logs
from tests.support.redis_keys import redis_prefix

__all__ = ["logs", "redis_prefix", "start_gateway"]
