"""Two loopback upstreams (`primary`, `secondary`) and a gateway routed to them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import GatewayHandle, StartGateway
from tests.gateway.catalog import CATALOG
from tests.upstream import ReplayUpstream


@pytest.fixture
async def primary() -> AsyncIterator[ReplayUpstream]:
    async with ReplayUpstream() as upstream:
        yield upstream


@pytest.fixture
async def secondary() -> AsyncIterator[ReplayUpstream]:
    async with ReplayUpstream() as upstream:
        yield upstream


def providers_for(
    primary: ReplayUpstream, secondary: ReplayUpstream, overrides: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    providers: dict[str, Any] = {
        "primary": {"kind": "local", "base_url": primary.url, "priority": 10},
        "secondary": {"kind": "openai_compatible", "base_url": secondary.url, "priority": 5},
    }
    for name, extra in (overrides or {}).items():
        providers[name] = {**providers[name], **extra}
    return providers


@pytest.fixture
async def gw(start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream) -> GatewayHandle:
    return await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG)
