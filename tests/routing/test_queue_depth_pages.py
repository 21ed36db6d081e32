"""Real servers' `/metrics` pages read for their queue depth: only finite, non-negative samples
count (a `NaN`, `+Inf` or negative gauge is no queue and must not stick to a backend)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from devtools.mock_http import Reply
from tests.routing.conftest import launch
from tests.support.client import complete
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.observe import completions, deployments, probes_at
from tests.support.replies import answer, metrics_reply
from tests.support.upstream import ReplayUpstream
from tests.support.waiting import wait_until

VLLM_PAGE = b"""# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="/models/llama-3.1-8b"} 3.0
vllm:num_requests_waiting{engine="1",model_name="/models/llama-3.1-8b"} NaN
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/models/llama-3.1-8b"} 1e+01
"""


def _page(text: bytes) -> Reply:
    return Reply(headers=[("content-type", "text/plain; version=0.0.4; charset=utf-8")], chunks=[text])


def _depths(gw: GatewayHandle, **depths: float) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        state = await deployments(gw, "even-1")
        return {name: state[name]["upstream_queue_depth"] for name in depths} == depths

    return check


async def test_a_nan_series_is_no_queue_and_the_others_still_count(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """vLLM with two engines, one of whose series reads `NaN`: the queue is the other's 3; a NaN
    sum made alpha's load NaN, which sorts before any number (alpha taken though it has a queue)."""
    alpha.enqueue(_page(VLLM_PAGE), repeat=1000, path="/metrics")
    gw = await launch(
        start_gateway, {"alpha": alpha, "beta": beta}, common={"kind": "local"}, routing={"probe_interval_s": 0.1}
    )
    await wait_until(lambda: len(probes_at(alpha, "/metrics")) >= 2)  # read at least once in full
    alpha.enqueue(answer("from alpha"))
    beta.enqueue(answer("from beta"))
    response = await complete(gw, "even-1")
    assert (response.status_code, response.json()["provider"]) == (200, "beta")
    assert completions(alpha) == []
    assert (await deployments(gw, "even-1"))["alpha"]["upstream_queue_depth"] == 3


async def test_a_negative_or_infinite_gauge_is_no_queue(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """A negative gauge would make a busy server look emptier than an idle one; `+Inf` would keep
    a backend last forever: neither is a queue the server has, so neither counts (a round that reads
    none counts 0, README)."""
    page = b'sglang:num_queue_reqs{model_name="m",tp_rank="0"} -5\nllamacpp:requests_deferred +Inf\n'
    alpha.enqueue(_page(page), repeat=1000, path="/metrics")
    beta.enqueue(metrics_reply(2), repeat=1000, path="/metrics")
    gw = await launch(
        start_gateway, {"alpha": alpha, "beta": beta}, common={"kind": "local"}, routing={"probe_interval_s": 0.1}
    )
    await wait_until(_depths(gw, alpha=0, beta=2))
