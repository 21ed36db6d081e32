"""Fixtures of the Anthropic Messages ingress tests (this directory overrides `gw` and `client`;
what they route over is `catalog.py`):
- `primary`, `secondary`: the two loopback upstreams;
- `gw`: a gateway routed to them over `CATALOG`;
- `client`: the real `anthropic` SDK pointed at it, without retries (a test scripts every
  upstream answer).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anthropic
import pytest

from tests.ingress.anthropic.catalog import CATALOG, providers_for
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.upstream import ReplayUpstream, upstream_fixture

primary = upstream_fixture("primary")
secondary = upstream_fixture("secondary")


@pytest.fixture
async def gw(start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream) -> GatewayHandle:
    return await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG)


@pytest.fixture
async def client(gw: GatewayHandle) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=gw.url, api_key="unused", max_retries=0) as sdk:
        yield sdk
