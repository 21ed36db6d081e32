"""Fault injection for routing: loopback upstreams serving one model, and a gateway routed to them.

Providers are `alpha`, `beta` and `gamma` (all `openai_compatible`, provider priority 0 unless a
test overrides it). The catalog:
- `chat-1`: alpha (deployment priority 100), beta (50), gamma (10): strict failover order;
- `even-1`: alpha and beta at the same priority (least loaded wins; ties go in catalog order,
  which is the provider name);
- `orphan-1`: deployed only on providers no test configures.

Replies come from `tests.support.replies`, requests from `tests.support.client`, and routing state
is read back through HTTP only with `tests.support.observe`.
"""

from __future__ import annotations

from typing import Any

from tests.support.catalog import catalog_toml, model
from tests.support.gateway import GatewayHandle, StartGateway, provider_table
from tests.support.upstream import ReplayUpstream, upstream_fixture

CATALOG = catalog_toml(
    model(
        "chat-1",
        ("alpha", "alpha/chat-1", 100),
        ("beta", "beta/chat-1", 50),
        ("gamma", "gamma/chat-1", 10),
        context_window=32768,
        max_output=4096,
        default=True,
    ),
    model("even-1", ("alpha", "alpha/even-1", 100), ("beta", "beta/even-1", 100)),
    model("orphan-1", ("nowhere", "nowhere/orphan-1", 100), ("elsewhere", "elsewhere/orphan-1", 50)),
)
PROBE_PATH = "/v1/models"  # what a hosted kind's health probe asks for (base_url is `…/v1`)

alpha = upstream_fixture("alpha")
beta = upstream_fixture("beta")
gamma = upstream_fixture("gamma")


async def launch(
    start_gateway: StartGateway,
    upstreams: dict[str, ReplayUpstream],
    *,
    common: dict[str, Any] | None = None,
    routing: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    redis: dict[str, Any] | None = None,
    **overrides: dict[str, Any],
) -> GatewayHandle:
    """A gateway whose providers are `upstreams` (name → server); `common` applies to every
    provider, `overrides[name]` to one."""
    providers = provider_table(upstreams, common, **overrides)
    return await start_gateway(providers=providers, catalog=CATALOG, routing=routing, server=server, redis=redis)
