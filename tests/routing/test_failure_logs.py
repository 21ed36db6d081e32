"""What an operator reads in the log when upstreams fail: one `attempt_failed` line per failed
attempt, one line per change of a provider's or a breaker's state and per probe failure and
recovery (not one per round), and the 502 that names each attempt's cause.

The gateway runs in the test's process and writes its JSON lines to stdout, which `capfd`
captures; `Logs.lines` flushes the gateway's line buffer first and returns the lines of one event
without their timestamps.
"""

from __future__ import annotations

import contextlib
import functools
import socket
from typing import Any

import pytest

from app.routing.failover import attempt_cause, transport_error
from devtools.mock_http import Reply
from providers.adapter import Provider, make_client
from providers.config import ProviderConfig, Timeouts
from providers.errors import Failure, UpstreamError
from tests.providers.test_adapter import REQUEST
from tests.routing.conftest import CATALOG, PROBE_PATH, launch
from tests.support.client import USER, complete
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.logs import Logs
from tests.support.observe import deployments, metric, scrape
from tests.support.replies import answer, error, models_reply
from tests.support.upstream import ReplayUpstream, played, reply_json
from tests.support.waiting import wait_until

FAILURE_COOLDOWN = 4
BREAKER = {"breaker_min_samples": 2, "breaker_error_ratio": 0.5, "failure_cooldown_s": 0}
SECRET = "sk-test-SECRET-log-7c1e"
PROMPT = "PROMPT-MARKER-heron-51d2"


def attempt(
    provider: str, kind: str, status: int | None, error: str | None, cause: str, cooldown: float | None
) -> dict[str, Any]:
    """An `attempt_failed` line for `provider`'s `chat-1` backend."""
    return {
        "event": "attempt_failed",
        "level": "warning",
        "provider": provider,
        "model": "chat-1",
        "upstream_model": f"{provider}/chat-1",
        "kind": kind,
        "status": status,
        "error": error,
        "cause": cause,
        "cooldown_s": cooldown,
    }


def attempt_lines(logs: Logs, gw: GatewayHandle) -> list[dict[str, Any]]:
    """The `attempt_failed` lines, each naming the request it was an attempt of, without that id
    (`tests/gateway/test_observability.py` checks it is the request's)."""
    lines = logs.lines("attempt_failed", gw)
    assert all(isinstance(line.pop("request_id"), str) for line in lines), lines
    return lines


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port  # nothing listens there: connecting is refused


def malformed() -> Reply:
    return Reply(status=200, headers=[("content-type", "application/json")], chunks=[b"{not json"])


# -- one line per failed attempt --------------------------------------------------------------------


async def test_a_503_then_failover_is_one_attempt_line_with_its_cool_down(
    start_gateway: StartGateway,
    alpha: ReplayUpstream,
    beta: ReplayUpstream,
    logs: Logs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SWITCHYARD_TEST_LOG_KEY", SECRET)
    common = {"failure_cooldown_s": FAILURE_COOLDOWN, "api_key_env": "SWITCHYARD_TEST_LOG_KEY"}
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common=common)
    alpha.enqueue(error(503, "unavailable"))
    beta.enqueue(answer("from beta"))
    message = {**USER, "content": [{"kind": "text", "data": PROMPT}]}
    response = await gw.client.post("/api/v1/completions", json={"model": "chat-1", "messages": [message]})
    assert response.json()["provider"] == "beta"
    assert attempt_lines(logs, gw) == [attempt("alpha", "transient", 503, None, "503", FAILURE_COOLDOWN)]
    assert logs.lines("breaker_open") == []
    assert [line["attempts"] for line in logs.lines("request")] == [2]
    assert alpha.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in logs.raw
    assert PROMPT not in logs.raw


async def test_a_refused_connection_is_named_by_its_error_class(
    start_gateway: StartGateway, beta: ReplayUpstream, logs: Logs
) -> None:
    providers = {
        "alpha": {
            "kind": "openai_compatible",
            "base_url": f"http://127.0.0.1:{closed_port()}/v1",
            "failure_cooldown_s": FAILURE_COOLDOWN,
        },
        "beta": {"kind": "openai_compatible", "base_url": beta.url},
    }
    gw = await start_gateway(providers=providers, catalog=CATALOG)
    beta.enqueue(answer("from beta"))
    assert (await complete(gw)).json()["provider"] == "beta"
    expected = attempt("alpha", "transient", None, "ConnectionRefusedError", "connection refused", FAILURE_COOLDOWN)
    assert attempt_lines(logs, gw) == [expected]


async def test_a_reset_connection_and_a_malformed_answer(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, gamma: ReplayUpstream, logs: Logs
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta, "gamma": gamma}, common={"failure_cooldown_s": 0})
    alpha.enqueue(played(answer("lost"), reset_after=0))
    beta.enqueue(malformed())
    gamma.enqueue(answer("from gamma"))
    assert (await complete(gw)).json()["provider"] == "gamma"
    assert attempt_lines(logs, gw) == [
        attempt("alpha", "transient", None, "ConnectionResetError", "connection reset", None),
        attempt("beta", "transient", 502, None, "malformed response", None),
    ]


async def test_an_answer_that_is_not_http_1_1_is_a_malformed_response_not_a_connection_failure(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, logs: Logs
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common={"failure_cooldown_s": 0})
    alpha.enqueue(Reply(raw=b"HTTP/2 200 OK\r\ncontent-length: 2\r\n\r\n{}"))
    beta.enqueue(answer("from beta"))
    assert (await complete(gw)).json()["provider"] == "beta"
    assert attempt_lines(logs, gw) == [
        attempt("alpha", "transient", None, "HttpParserError", "malformed response", None)
    ]


async def test_a_request_the_upstream_refuses_is_an_info_line_without_a_cool_down(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, logs: Logs
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    alpha.enqueue(error(400, "invalid_request_error"))
    response = await complete(gw)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == "upstream says 400"
    assert attempt_lines(logs, gw) == [{**attempt("alpha", "client", 400, None, "400", None), "level": "info"}]


# -- the 502 names every attempt's cause ------------------------------------------------------------


async def test_the_502_names_each_attempt_s_provider_and_cause(
    start_gateway: StartGateway, beta: ReplayUpstream, gamma: ReplayUpstream
) -> None:
    """gamma's key variable is unset: it is out of rotation, not an attempt."""
    providers = {
        "alpha": {"kind": "openai_compatible", "base_url": f"http://127.0.0.1:{closed_port()}/v1"},
        "beta": {"kind": "openai_compatible", "base_url": beta.url},
        "gamma": {"kind": "openai_compatible", "base_url": gamma.url, "api_key_env": "SWITCHYARD_TEST_UNSET_KEY"},
    }
    gw = await start_gateway(providers=providers, catalog=CATALOG)
    beta.enqueue(error(503, "unavailable"))
    refused = await complete(gw)
    assert refused.status_code == 502, refused.text
    message = "all backends refused the request (alpha: connection refused; beta: 503)"
    assert refused.json()["error"]["message"] == message
    assert refused.json()["errors"][0]["detail"] == message


async def test_the_502_for_a_malformed_answer_and_a_refused_key(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    alpha.enqueue(malformed())
    beta.enqueue(error(401, "authentication_error"))
    refused = await complete(gw)
    assert refused.status_code == 502, refused.text
    message = "all backends refused the request (alpha: malformed response; beta: 401)"
    assert refused.json()["error"]["message"] == message


# -- provider and breaker state ---------------------------------------------------------------------


async def test_a_401_is_an_attempt_line_and_one_provider_disabled_line(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, logs: Logs
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    alpha.enqueue(error(401, "authentication_error"))
    beta.enqueue(answer("from beta"), repeat=2)
    assert (await complete(gw)).json()["provider"] == "beta"
    assert (await complete(gw)).json()["provider"] == "beta"
    assert attempt_lines(logs, gw) == [attempt("alpha", "auth", 401, None, "401", None)]
    assert logs.lines("provider_disabled") == [
        {
            "event": "provider_disabled",
            "level": "error",
            "provider": "alpha",
            "reason": "auth: upstream returned 401",
            "status": 401,
            "code": "authentication_error",
            "source": "attempt",
        }
    ]


async def test_the_breaker_opening_and_a_probe_closing_it_are_a_line_each(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, logs: Logs
) -> None:
    alpha.enqueue(models_reply(first_byte_delay_s=0.6), path=PROBE_PATH)  # no probe round ends before that
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common=BREAKER, routing={"probe_interval_s": 0.1})
    alpha.enqueue(error(502), repeat=2)
    beta.enqueue(answer("from beta"), repeat=2)
    for _ in range(2):
        assert (await complete(gw)).json()["provider"] == "beta"
    assert attempt_lines(logs, gw) == [attempt("alpha", "transient", 502, None, "502", None)] * 2
    names = {"provider": "alpha", "model": "chat-1", "upstream_model": "alpha/chat-1"}
    assert logs.lines("breaker_open") == [{"event": "breaker_open", "level": "warning", **names, "source": "attempt"}]

    async def closed() -> bool:
        return (await deployments(gw))["alpha"]["breaker_open"] is False

    await wait_until(closed, within=3.0)
    await wait_until(lambda: len(logs.lines("breaker_closed", gw)) > 0)
    assert logs.lines("breaker_closed", gw) == [
        {"event": "breaker_closed", "level": "info", **names, "source": "probe"}
    ]
    assert len(logs.lines("breaker_open", gw)) == 1


async def test_a_failing_probe_is_logged_when_it_starts_failing_and_when_it_recovers(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, logs: Logs
) -> None:
    alpha.enqueue(error(503, "unavailable"), repeat=3, path=PROBE_PATH)  # three failed rounds, then 200s
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, routing={"probe_interval_s": 0.1})

    async def failing() -> bool:
        samples = await scrape(gw)
        return metric(samples, "switchyard_backend_probe_failed", provider="alpha", model="chat-1") == 1

    await wait_until(failing, within=3.0)

    async def recovered() -> bool:
        return alpha.pending == 0 and (await deployments(gw))["alpha"]["probe_failed"] is False

    await wait_until(recovered, within=3.0)
    assert metric(await scrape(gw), "switchyard_backend_probe_failed", provider="alpha", model="chat-1") == 0
    await wait_until(lambda: len(logs.lines("probe_recovered", gw)) > 0)
    assert logs.lines("probe_failed") == [
        {"event": "probe_failed", "level": "warning", "provider": "alpha", "cause": "503", "error": None}
    ]
    (line,) = logs.lines("probe_recovered")
    assert {k: v for k, v in line.items() if k != "failing_s"} == {
        "event": "probe_recovered",
        "level": "warning",
        "provider": "alpha",
    }
    assert 0.15 <= line["failing_s"] < 2.0  # from the first failed round to the first good one


# -- another worker's breaker -----------------------------------------------------------------------


async def test_a_breaker_another_worker_opened_and_closed_is_logged_with_its_origin(
    redis_prefix: str, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, logs: Logs
) -> None:
    redis = {"url": "redis://127.0.0.1:6379/0", "key_prefix": redis_prefix}
    upstreams = {"alpha": alpha, "beta": beta}
    b = await launch(start_gateway, upstreams, common=BREAKER, redis=redis, routing={"probe_interval_s": 60})
    alpha.enqueue(models_reply(first_byte_delay_s=0.6), path=PROBE_PATH)  # a's first probe, answered late
    a = await launch(start_gateway, upstreams, common=BREAKER, redis=redis, routing={"probe_interval_s": 0.1})
    alpha.enqueue(error(502), repeat=2)
    beta.enqueue(answer("from beta"), repeat=2)
    for _ in range(2):
        assert (await complete(a)).json()["provider"] == "beta"

    async def closed_on_b() -> bool:
        return (await deployments(b))["alpha"]["breaker_open"] is False and any(
            line["source"] == "cluster" for line in logs.lines("breaker_closed", a, b)
        )

    await wait_until(lambda: any(line["source"] == "cluster" for line in logs.lines("breaker_open", a, b)))
    await wait_until(closed_on_b, within=3.0)
    assert a.service.cluster is not None
    names = {"provider": "alpha", "model": "chat-1", "upstream_model": "alpha/chat-1"}
    origin = {"source": "cluster", "origin": a.service.cluster.worker_id}
    by_source = functools.partial(sorted, key=lambda line: line["source"])  # two writers: flushed in any order
    assert by_source(logs.lines("breaker_open", a, b)) == [
        {"event": "breaker_open", "level": "warning", **names, "source": "attempt"},
        {"event": "breaker_open", "level": "warning", **names, **origin},
    ]
    assert by_source(logs.lines("breaker_closed", a, b)) == [
        {"event": "breaker_closed", "level": "info", **names, **origin},
        {"event": "breaker_closed", "level": "info", **names, "source": "probe"},
    ]


async def test_a_probe_that_hangs_delays_only_its_own_provider(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """The providers' probes were gathered in rounds: beta's probe hanging to the read timeout
    (10 s) held alpha's next probe as long, so alpha stayed out of rotation after it recovered."""
    beta.enqueue(reply_json(200, {"data": []}, first_byte_delay_s=30.0), repeat=3, path=PROBE_PATH)
    alpha.enqueue(error(503, "unavailable"), path=PROBE_PATH)  # one failed probe, then 200s
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, routing={"probe_interval_s": 0.1})

    async def recovered() -> bool:
        return alpha.pending == 0 and (await deployments(gw))["alpha"]["probe_failed"] is False

    await wait_until(recovered, within=3.0)


async def test_a_connect_timeout_is_named_connect_timeout_not_the_timers_cancellation() -> None:
    """A port whose listen backlog is full drops the SYN: the connect times out. `attempt_failed`
    named the innermost wrapped error, the timer's `CancelledError`."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = [socket.socket() for _ in range(4)]
    for filler in fillers:
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
    client = make_client()
    config = ProviderConfig(
        name="a", kind="openai_compatible", base_url=f"http://127.0.0.1:{port}/v1", timeouts=Timeouts(connect=0.3)
    )
    try:
        with pytest.raises(UpstreamError) as failed:
            async for _ in Provider(config, client).events(REQUEST, "m", stream=False):
                pass
    finally:
        await client.aclose()
        for sock in (listener, *fillers):
            sock.close()
    assert (failed.value.kind, transport_error(failed.value), attempt_cause(failed.value)) == (
        Failure.TIMEOUT,
        "ConnectTimeout",
        "timed out",
    )


async def test_catalog_deployments_on_providers_the_config_lacks_are_reported_at_start(
    logs: Logs, start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """`orphan-1` is deployed only on `nowhere` and `elsewhere` (a typo, or a provider removed from
    config.toml), `chat-1` also on `gamma`, which this gateway lacks: never routed to, and nothing
    said so (orphan-1's requests were 503s with no reason given anywhere)."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    reason = "not in the config: its deployments are never routed to"
    expected = [("elsewhere", ["orphan-1"]), ("gamma", ["chat-1"]), ("nowhere", ["orphan-1"])]
    assert logs.lines("catalog_provider_unknown", gw) == [
        {"provider": name, "models": models, "reason": reason, "event": "catalog_provider_unknown", "level": "warning"}
        for name, models in expected
    ]
