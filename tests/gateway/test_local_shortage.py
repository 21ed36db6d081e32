"""The gateway's own file descriptors running out (a connection flood, a slowloris) is no
upstream's fault: dialling one fails with EMFILE, which was read as the upstream refusing the
connection, so every backend was cooled down and counted by its breaker (and, with `[redis]`,
for every replica): on `switchyard serve` with `prlimit --nofile=120`, 18 requests of 20 got 503
and the next ones still did once the flood was gone. Now (`Failure.LOCAL`) it cools nothing
down: the request gets 503 `unavailable` with `Retry-After: 1`, and the next one is served by the
primary. The shortage is real: the test process's descriptor limit lowered and filled."""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import providers.transport
from app.routing.failover import Candidates, attempt_cause, exhausted
from providers.errors import Failure, UpstreamError
from tests.gateway.conftest import CATALOG, providers_for
from tests.support.client import body, post
from tests.support.gateway import StartGateway
from tests.support.logs import Logs
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream


@contextmanager
def descriptors_spent() -> Iterator[None]:
    """Every file descriptor this process may open, taken: the next `socket()` fails with EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(name) for name in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 32, hard))
    held: list[int] = []
    try:
        while (fd := _opened()) is not None:
            held.append(fd)
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _opened() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError as exc:
        if exc.errno != errno.EMFILE:
            raise
        return None


async def test_descriptors_running_out_here_cool_no_backend_down(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream, logs: Logs
) -> None:
    gw = await start_gateway(
        providers=providers_for(primary, secondary, {"primary": {"failure_cooldown_s": 30.0}}), catalog=CATALOG
    )
    assert (await gw.client.get("/healthz")).status_code == 200  # the client's connection, open before
    with descriptors_spent():
        short = await post(gw, body())
    assert short.status_code == 503, short.text
    assert short.headers["retry-after"] == "1"
    assert short.json()["error"]["type"] == "unavailable"
    assert (primary.requests, secondary.requests) == ([], [])
    attempts = [(line["provider"], line["kind"], line["cooldown_s"]) for line in logs.lines("attempt_failed", gw)]
    assert attempts == [("primary", "local", None), ("secondary", "local", None)]
    primary.enqueue(answer("from primary"))
    served = await post(gw, body())
    assert (served.status_code, served.json()["provider"]) == (200, "primary")
    rows = await gw.ledger_rows()
    assert sorted(row["status"] for row in rows) == ["error", "ok"]


async def test_a_probe_that_finds_no_descriptor_here_says_nothing_of_the_upstream(
    start_gateway: StartGateway,
    primary: ReplayUpstream,
    secondary: ReplayUpstream,
    logs: Logs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A probe round while the descriptors are spent took every backend out of rotation (a failed
    probe) until the next round; it is skipped instead, the backends left as they were. (No
    pooled connection is reused: each probe dials.)"""
    monkeypatch.setattr(providers.transport, "MAX_IDLE_S", 0.0)
    gw = await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG)
    health = gw.service.health
    assert health is not None
    await health.probe_all()
    assert (await gw.client.get("/healthz")).status_code == 200
    with descriptors_spent():
        await health.probe_all()
    assert sorted(line["provider"] for line in logs.lines("probe_skipped", gw)) == ["primary", "secondary"]
    assert logs.lines("probe_failed", gw) == []
    primary.enqueue(answer("from primary"))
    served = await post(gw, body())
    assert (served.status_code, served.json()["provider"]) == (200, "primary")


@pytest.mark.parametrize(
    ("other", "status", "error_type"),
    [
        (UpstreamError(Failure.TIMEOUT, "upstream timed out"), 504, "upstream_error"),
        (UpstreamError(Failure.CAPACITY, "upstream at capacity", status=429, retry_after=3.0), 429, "rate_limit_error"),
    ],
)
def test_an_attempt_the_gateways_shortage_failed_leaves_the_answer_to_the_others(
    other: UpstreamError, status: int, error_type: str
) -> None:
    """One attempt failed on the gateway's own descriptors, another on its upstream: the client's
    answer is the upstream's kind (504 for a timeout, 429 for capacity), as if the shortage had
    not been there; it was a 502 "all backends refused" naming the shortage "connection failed"."""
    short = UpstreamError(Failure.LOCAL, "the gateway is short of file descriptors or memory", retry_after=1.0)
    candidates = Candidates([], 0.0, probe_interval=10.0)
    candidates.capacity_waits.append(3.0)
    answer = exhausted([("primary", short), ("secondary", other)], candidates)
    assert (answer.status_code, answer.type) == (status, error_type)
    assert attempt_cause(short) == "gateway out of descriptors"
