"""Fixtures every test directory shares; their machinery lives in `tests/support`.

`start_gateway` starts a real Switchyard on loopback per test (`tests.support.gateway`).
"""

from __future__ import annotations

from tests.support.gateway import start_gateway

__all__ = ["start_gateway"]
