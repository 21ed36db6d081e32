"""A gateway with `[auth] mode = "keys"` in the test's event loop, over one loopback upstream.

Catalog: `chat` (priced: $1 in, $2 out per million tokens, max_output 1000), `other` (priced
the same; both also take raw-prompt completions), `free` (served, unpriced) and `idle` (no
backend: its only provider is not configured). Keys are made through the admin API
(`make_key`), as an operator's automation would; the admin key's secret is in
`SWITCHYARD_TEST_ADMIN_KEY`.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from app.access.redis_scripts import ADMIT, LOAD, SETTLE
from app.logging import configure_logging
from tests.access.test_redis_limiter import URL, _Tap
from tests.support.catalog import catalog_toml, model, price
from tests.support.gateway import GatewayHandle, StartGateway, provider_table
from tests.support.ports import free_port
from tests.support.upstream import ReplayUpstream, upstream_fixture
from tests.support.waiting import wait_until_sync

ADMIN = "sy-admin-secret-for-tests-0123456789abcdefghijkl"
ADMIN_ENV = "SWITCHYARD_TEST_ADMIN_KEY"
LEGACY = ("completions",)  # raw-prompt completions (`/v1/completions`)
CATALOG = catalog_toml(
    model("chat", ("up", "up-chat"), max_output=1000, default=True, aliases=("chat-latest",), capabilities=LEGACY),
    model("other", ("up", "up-other"), max_output=1000, capabilities=LEGACY),
    model("free", ("up", "up-free")),
    model("idle", ("gone", "up-idle")),  # deployed only on a provider this gateway does not configure
    prices=[price("up", "chat", "1", "2"), price("up", "other", "1", "2")],
)

up = upstream_fixture("up")


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    """A Redis key prefix of the test's own, its keys deleted afterwards (the limiter's tests)."""
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = Redis.from_url(URL)
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
async def tap() -> AsyncIterator[tuple[_Tap, int]]:
    """A proxy to the real Redis that keeps every byte sent through it, and its port. The limiter's
    scripts are loaded first (not through it), so a test that counts `EVALSHA`s on the wire does
    not also count one refused with `NOSCRIPT` when it happens to be the first on a fresh Redis."""
    client = Redis.from_url(URL)
    for script in (ADMIT, SETTLE, LOAD):
        client.script_load(script)
    client.close()
    tap = _Tap()
    server = await asyncio.start_server(tap.serve, "127.0.0.1", 0)
    yield tap, server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


class PrivateRedis:
    """A `redis-server` of the test's own on a free port, that the test may stop."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._start()

    def _start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_sync(self._answers, what=f"redis-server on {self.port}")

    def restart(self) -> None:
        """Stopped and started again on its port, without its data (no persistence)."""
        self.stop()
        self._start()

    def _answers(self) -> bool:
        try:
            with Redis.from_url(self.url) as client:
                return bool(client.ping())
        except RedisConnectionError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _log_to_stdout_afterwards() -> Iterator[None]:
    """After each test, point structlog back at the session's stdout: a gateway started under
    `capfd` (the `logs` fixture) left it writing to capfd's file, closed once the test ends, and
    later tests outside a gateway (the ledger writer's) would log into it. Torn down last, so
    after capfd has given stdout back."""
    yield
    configure_logging("info")


MakeKey = Callable[..., Awaitable[dict[str, Any]]]


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


async def keyed_gateway(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, **options: Any
) -> GatewayHandle:
    """`options`: the gateway's settings; `provider`, settings of the one provider `up`."""
    monkeypatch.setenv(ADMIN_ENV, ADMIN)
    auth = {"mode": "keys", "admin_key_env": ADMIN_ENV, **options.pop("auth", {})}
    providers = provider_table({"up": up}, common=options.pop("provider", None))
    return await start_gateway(providers=providers, catalog=CATALOG, auth=auth, **options)


@pytest.fixture
async def gw(start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch) -> GatewayHandle:
    return await keyed_gateway(start_gateway, up, monkeypatch)


@pytest.fixture(params=["local", "redis"])
async def either_limiter(
    request: pytest.FixtureRequest,
    start_gateway: StartGateway,
    up: ReplayUpstream,
    monkeypatch: pytest.MonkeyPatch,
    private_redis: PrivateRedis,
) -> GatewayHandle:
    """A gateway in keys mode, once with the in-process limiter and once with Redis's."""
    redis = {"redis": {"url": private_redis.url, "key_prefix": "e"}} if request.param == "redis" else {}
    return await keyed_gateway(start_gateway, up, monkeypatch, **redis)


async def new_secret(gw: GatewayHandle, **options: Any) -> str:
    """The secret of a key made by the admin with `options` (access.md's fields)."""
    response = await gw.client.post("/api/v1/keys", json={"name": "k", **options}, headers=bearer(ADMIN))
    assert response.status_code == 201, response.text
    secret: str = response.json()["secret"]
    return secret


@pytest.fixture
def make_key(gw: GatewayHandle) -> MakeKey:
    async def make(**options: Any) -> dict[str, Any]:
        response = await gw.client.post("/api/v1/keys", json={"name": "k", **options}, headers=bearer(ADMIN))
        assert response.status_code == 201, response.text
        key: dict[str, Any] = response.json()
        return key

    return make
