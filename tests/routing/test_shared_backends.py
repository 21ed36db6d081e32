"""A backend is "a provider serving one upstream model" (providers.md): two catalog models deployed
to the same upstream model on one provider share its capacity, queue, cool-downs and breaker, and
a deployment that leaves the catalog and comes back finds its live state (the requests still in
flight there). Each had a state of its own: the upstream got twice its `max_concurrency`, and a 429
for one model sent the other straight back to it."""

from __future__ import annotations

from msgspec.structs import replace

from catalog.snapshot import CatalogSnapshot
from tests.support.catalog import catalog_toml, model
from tests.support.client import Held, complete, holding
from tests.support.gateway import GatewayHandle, StartGateway, provider_table
from tests.support.observe import completions, deployments, metric, scrape
from tests.support.replies import answer, error, stalled_stream
from tests.support.upstream import ReplayUpstream
from tests.support.waiting import wait_until

CATALOG = catalog_toml(
    model("m-a", ("alpha", "shared/upstream", 100), ("beta", "beta/m-a", 50), default=True),
    model("m-b", ("alpha", "shared/upstream", 100), ("beta", "beta/m-b", 50)),
)
ONE_SLOT = {"max_concurrency": 1, "max_queue": 0}


async def launch(start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream) -> GatewayHandle:
    providers = provider_table({"alpha": alpha, "beta": beta}, {**ONE_SLOT, "max_cooldown_s": 60})
    return await start_gateway(providers=providers, catalog=CATALOG)


async def test_two_models_on_one_upstream_model_share_its_slots(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, alpha, beta)
    alpha.enqueue(stalled_stream())
    beta.enqueue(answer("from beta"))
    async with holding() as held:
        held.append(Held(gw, model="m-a"))
        assert await held[0].started() == "alpha"
        response = await complete(gw, "m-b")
        assert (response.status_code, response.json()["provider"]) == (200, "beta")  # alpha's one slot is taken
        state = await deployments(gw, "m-b")
        assert (state["alpha"]["in_flight"], state["alpha"]["limit"]) == (1, 1)
    assert len(completions(alpha)) == 1


async def test_a_429_for_one_model_cools_the_upstream_model_for_the_other(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, alpha, beta)
    alpha.enqueue(error(429, "rate_limit_error", {"retry-after": "30"}))
    beta.enqueue(answer(), repeat=2)
    assert (await complete(gw, "m-a")).json()["provider"] == "beta"
    assert (await complete(gw, "m-b")).json()["provider"] == "beta"
    assert len(completions(alpha)) == 1  # m-b's request was not sent back to the upstream that said 429
    assert (await deployments(gw, "m-b"))["alpha"]["cooling_reason"] == "capacity"


async def test_a_deployment_that_leaves_the_catalog_and_comes_back_keeps_its_requests_in_flight(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, alpha, beta)
    router = gw.service.router
    assert router is not None
    full = router.snapshot
    without_alpha = CatalogSnapshot(
        [replace(m, deployments=tuple(d for d in m.deployments if d.provider != "alpha")) for m in full.models],
        full.prices,
    )
    alpha.enqueue(stalled_stream())
    beta.enqueue(answer("from beta"))
    async with holding() as held:
        held.append(Held(gw, model="m-a"))
        assert await held[0].started() == "alpha"
        router.replace_snapshot(without_alpha)  # as `catalog sync` of a catalog without it, then with it
        router.replace_snapshot(full)
        response = await complete(gw, "m-a")
        assert (response.status_code, response.json()["provider"]) == (200, "beta")
        assert (await deployments(gw, "m-a"))["alpha"]["in_flight"] == 1
    assert len(completions(alpha)) == 1


async def test_the_per_model_gauges_count_each_models_own_requests(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """Read from the shared state, one request showed under both models: a sum over models (a
    dashboard's in-flight per provider) counted it twice."""
    gw = await launch(start_gateway, alpha, beta)
    alpha.enqueue(stalled_stream())
    async with holding() as held:
        held.append(Held(gw, model="m-a"))
        assert await held[0].started() == "alpha"
        samples = await scrape(gw)
        gauge = "switchyard_backend_in_flight"
        assert {m: metric(samples, gauge, provider="alpha", model=m) for m in ("m-a", "m-b")} == {"m-a": 1, "m-b": 0}
        assert metric(samples, "switchyard_backend_limit", provider="alpha", model="m-b") == 1
    await wait_until(lambda: _idle(gw))


async def _idle(gw: GatewayHandle) -> bool:
    samples = await scrape(gw)
    return metric(samples, "switchyard_backend_in_flight", provider="alpha", model="m-a") == 0
