"""Fixtures every test directory shares; their machinery lives in `tests/support`.

`start_gateway` starts a real Switchyard on loopback per test (`tests.support.gateway`); `logs`
reads back the JSON lines it wrote (`tests.support.logs`).
"""

from __future__ import annotations

from tests.support.gateway import start_gateway
from tests.support.logs import logs

__all__ = ["logs", "start_gateway"]
