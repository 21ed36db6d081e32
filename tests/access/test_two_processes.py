"""Two real `switchyard serve` processes on one PostgreSQL database and one Redis: limits hold across
them (access.md). Keys are made with the CLI against the same database; the upstream is a loopback
server in the test's event loop that holds each answer for a while, so every admission of a burst
is decided before the first request settles.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from redis import Redis

from tests.access.conftest import ADMIN, PrivateRedis, bearer
from tests.support.catalog import catalog_toml, model, price
from tests.support.cli import Process, cli_env, processes, request_lines, run_cli
from tests.support.client import COMPLETIONS, body
from tests.support.ports import free_port
from tests.support.replies import answer, error
from tests.support.upstream import ReplayUpstream, played
from tests.support.waiting import wait_until

PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"
CATALOG = catalog_toml(
    model("chat", ("up", "up-chat"), max_output=1000, default=True),
    prices=[price("up", "chat", "1", "2")],
)
HOLD_S = 4.0


class PeakUpstream(ReplayUpstream):
    """Also records the most answers it was ever writing at once."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = 0
        count = self.server._count_streams

        def counting(change: int) -> None:
            count(change)
            self.peak = max(self.peak, self.server.active_streams)

        self.server._count_streams = counting  # type: ignore[method-assign]


class Pair:
    """Two gateways, their config directory and the database URL."""

    def __init__(self, tmp_path: Path, urls: list[str], database: str, started: list[Process]) -> None:
        self.tmp_path, self.urls, self.database, self.started = tmp_path, urls, database, started

    def cli(self, *args: str) -> str:
        result = run_cli(self.tmp_path, *args, "--config", str(self.tmp_path / "config.toml"), env=_env())
        assert result.returncode == 0, result.stderr
        return result.stdout

    def key(self, *options: str) -> dict[str, Any]:
        created: dict[str, Any] = json.loads(self.cli("keys", "create", "--name", "t", *options, "--format", "json"))
        return created

    async def ledger(self, key_id: str) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.database.replace("+asyncpg", ""))
        try:
            return await conn.fetch("SELECT * FROM ledger WHERE api_key_id = $1", key_id)
        finally:
            await conn.close()


def _env() -> dict[str, str]:
    return cli_env(SWITCHYARD_TEST_ADMIN_KEY=ADMIN)


@pytest.fixture
def prefix() -> Iterator[str]:
    client = Redis.from_url("redis://127.0.0.1:6379/0")
    assert client.ping()
    prefix = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
async def database() -> AsyncIterator[str]:
    name = f"switchyard_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(PG_ADMIN_DSN)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
    finally:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def up() -> AsyncIterator[PeakUpstream]:
    async with PeakUpstream() as upstream:
        yield upstream


@pytest.fixture
async def pair(tmp_path: Path, up: PeakUpstream, database: str, prefix: str) -> AsyncIterator[Pair]:
    async with _pair(tmp_path, up, database, "redis://127.0.0.1:6379/0", prefix) as pair:
        yield pair


@pytest.fixture
async def private_pair(
    tmp_path: Path, up: PeakUpstream, database: str, private_redis: PrivateRedis
) -> AsyncIterator[Pair]:
    """The two processes on a `redis-server` of the test's own, which it may stop."""
    async with _pair(tmp_path, up, database, private_redis.url, "t") as pair:
        yield pair


@pytest.fixture
async def pair_without_redis(tmp_path: Path, up: PeakUpstream, database: str) -> AsyncIterator[Pair]:
    """The two processes with no `[redis]`: allowed while no key has limits."""
    async with _pair(tmp_path, up, database, None, "") as pair:
        yield pair


@asynccontextmanager
async def _pair(tmp_path: Path, up: PeakUpstream, database: str, redis: str | None, prefix: str) -> AsyncIterator[Pair]:
    (tmp_path / "models.toml").write_text(CATALOG)
    shared = "" if redis is None else f'[redis]\nurl = "{redis}"\nkey_prefix = "{prefix}"\n'
    (tmp_path / "config.toml").write_text(f"""
[server]
replicas = 2

[database]
url = "{database}"

[auth]
mode = "keys"
admin_key_env = "SWITCHYARD_TEST_ADMIN_KEY"

{shared}
[catalog]
files = ["models.toml"]

[providers.up]
kind = "openai_compatible"
base_url = "{up.url}"
max_concurrency = 400
""")
    with processes() as started:
        pair = Pair(tmp_path, [], database, started)
        pair.cli("db", "upgrade")
        for name in ("a", "b"):
            port = free_port()
            args = ["serve", "--config", str(tmp_path / "config.toml"), "--port", str(port)]
            started.append(Process(tmp_path, name, args, _env()))
            pair.urls.append(f"http://127.0.0.1:{port}")
        async with httpx.AsyncClient(timeout=2.0) as client:
            for url, process in zip(pair.urls, started, strict=True):
                await wait_until(_answers(client, url, process), within=30.0, what=f"{url} up")
        yield pair


def _answers(client: httpx.AsyncClient, url: str, process: Process) -> Any:
    async def check() -> bool:
        if process.popen.poll() is not None:
            pytest.fail(f"exited: {process.output()}")
        try:
            return (await client.get(f"{url}/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    return check


async def _burst(pair: Pair, secret: str, count: int, **extra: Any) -> list[httpx.Response]:
    """`count` concurrent completions, alternating between the two processes."""
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
        calls = [
            client.post(f"{pair.urls[i % 2]}{COMPLETIONS}", json=body("chat", **extra), headers=bearer(secret))
            for i in range(count)
        ]
        return list(await asyncio.gather(*calls))


async def test_a_budget_is_never_overspent_by_concurrent_requests(pair: Pair, up: PeakUpstream) -> None:
    # Worst case of one request: input bound 89 (the JSON of the messages, 57 bytes, plus 16 per
    # message and 16 for the system turn) at $1/M plus max_tokens 1000 at $2/M = $0.002089.
    # $0.0842 admits 40 of them (40 x 0.002089 = 0.08356; 41 would be 0.085649).
    up.set_default(played(answer("ok"), first_byte_delay_s=HOLD_S))
    key = pair.key("--budget-usd", "0.0842", "--budget-period", "day")

    responses = await _burst(pair, key["secret"], 200, max_tokens=1000)

    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 40, statuses
    refused = [r.json()["error"] for r in responses if r.status_code == 429]
    assert len(refused) == 160
    assert {(e["type"], e["message"]) for e in refused} == {
        ("insufficient_quota", "budget exceeded: spent $0.00 of $0.0842 this day")
    }
    assert all(0 < int(r.headers["retry-after"]) <= 86_400 for r in responses if r.status_code == 429)
    await wait_until(lambda: _count(pair, key["id"], 200), within=5.0, what="200 ledger rows")
    rows = await pair.ledger(key["id"])
    total = sum((row["cost_usd"] for row in rows if row["cost_usd"] is not None), Decimal(0))
    assert total == 40 * Decimal("0.000005")  # 3 in + 1 out each
    assert total <= Decimal("0.0842")
    async with httpx.AsyncClient() as client:

        async def settled() -> bool:
            me = (await client.get(f"{pair.urls[1]}/api/v1/keys/me", headers=bearer(key["secret"]))).json()
            return (Decimal(me["spent_usd"]), Decimal(me["remaining_usd"])) == (total, Decimal("0.0842") - total)

        await wait_until(settled, what="keys/me reporting the settled spend")


async def _count(pair: Pair, key_id: str, expected: int) -> bool:
    return len(await pair.ledger(key_id)) == expected


async def test_rpm_is_exact_across_both_processes(pair: Pair, up: PeakUpstream) -> None:
    up.set_default(answer("ok"))
    key = pair.key("--rpm", "10")

    responses = await _burst(pair, key["secret"], 30)

    assert sorted(r.status_code for r in responses) == [200] * 10 + [429] * 20
    refused = [r for r in responses if r.status_code == 429]
    assert {r.json()["error"]["message"] for r in refused} == {"rate limit reached for this API key (rpm)"}
    assert all(1 <= int(r.headers["retry-after"]) <= 60 for r in refused)
    assert {r.headers["x-ratelimit-limit-requests"] for r in responses} == {"10"}
    remaining = sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in responses if r.status_code == 200)
    assert remaining == list(range(10))


async def test_rpm_is_exact_across_both_processes_with_leases(pair: Pair, up: PeakUpstream, prefix: str) -> None:
    """rpm 200: a process's admission also takes a lease of 8 (app.access.lease) while the limit
    is far; near it every admission is Redis's own. No lease lets a request past the limit:
    exactly 200 of 300 pass, in both processes. (The wait for another process's lease is tested
    against the limiter itself, tests/access/test_redis_lease.py.)"""
    up.set_default(answer("ok"))
    key = pair.key("--rpm", "200")
    into = time.time() % 1  # a lease ends with its second of the window: start where it has 250 ms to live
    if into > 0.55:
        await asyncio.sleep(1.02 - into)
    async with httpx.AsyncClient() as client:
        first = await client.post(f"{pair.urls[0]}{COMPLETIONS}", json=body("chat"), headers=bearer(key["secret"]))
    assert first.status_code == 200
    leases = Redis.from_url("redis://127.0.0.1:6379/0")
    held = [lease.split()[0] for lease in leases.hvals(f"{prefix}:lim:{{{key['id']}}}:lease")]
    leases.close()
    assert held == [b"7"]  # the first process holds the 7 its first admission did not use

    responses = [first, *await _burst(pair, key["secret"], 299)]

    assert sorted(r.status_code for r in responses) == [200] * 200 + [429] * 100
    assert {r.json()["error"]["message"] for r in responses if r.status_code == 429} == {
        "rate limit reached for this API key (rpm)"
    }
    served_by = {pair.urls[i % 2] for i, r in enumerate(responses[1:]) if r.status_code == 200}
    assert len(served_by) == 2
    await wait_until(lambda: _count(pair, key["id"], 300), within=5.0, what="300 ledger rows")


async def test_max_concurrency_holds_at_the_upstream(pair: Pair, up: PeakUpstream) -> None:
    up.set_default(played(answer("ok"), first_byte_delay_s=1.0))
    key = pair.key("--max-concurrency", "3")

    responses = await _burst(pair, key["secret"], 12)

    assert sorted(r.status_code for r in responses) == [200] * 3 + [429] * 9
    assert {r.json()["error"]["message"] for r in responses if r.status_code == 429} == {
        "rate limit reached for this API key (max_concurrency)"
    }
    assert up.peak == 3
    again = await _burst(pair, key["secret"], 3)  # the slots were given back
    assert [r.status_code for r in again] == [200] * 3


async def test_a_revocation_on_one_process_is_refused_by_the_other_within_a_second(
    pair: Pair, up: PeakUpstream
) -> None:
    up.set_default(answer("ok"))
    key = pair.key("--owner", "team-a")
    other = pair.key()
    async with httpx.AsyncClient() as client:
        for url in pair.urls:
            assert (
                await client.post(f"{url}{COMPLETIONS}", json=body("chat"), headers=bearer(key["secret"]))
            ).is_success
        revoked = await client.delete(f"{pair.urls[0]}/api/v1/keys/{key['id']}", headers=bearer(ADMIN))
        assert revoked.status_code == 200
        assert revoked.json()["revoked_at"] is not None

        admitted = {key["secret"]: 2, other["secret"]: 0}  # until the revocation arrives, a call still runs

        async def refused(url: str, secret: str) -> bool:
            response = await client.post(f"{url}{COMPLETIONS}", json=body("chat"), headers=bearer(secret))
            assert response.status_code in (200, 401), response.text
            admitted[secret] += response.status_code == 200
            return response.status_code == 401

        await wait_until(lambda: refused(pair.urls[1], key["secret"]), within=1.0, what="the other process refusing")
        assert await refused(pair.urls[0], key["secret"])
        pair.cli("keys", "revoke", other["id"])  # the CLI, on the database: announced on Redis
        for url in pair.urls:
            await wait_until(lambda url=url: refused(url, other["secret"]), within=1.0, what=f"{url} refusing")

    async def a_row_per_admitted_call(made: dict[str, Any]) -> bool:
        """A call the edge let in just before the revocation arrived, then refused by the pipeline
        (401 from `AccessGate.permit`), has a row too (it reached routing): not an admitted one."""
        rows = await pair.ledger(made["id"])
        seen[:] = [(row["status"], row["error_status"]) for row in rows]
        return len([row for row in rows if row["error_status"] != 401]) == admitted[made["secret"]]

    seen: list[tuple[str, int | None]] = []  # the last rows read, for the failure's message
    await wait_until(
        lambda: a_row_per_admitted_call(key),
        within=10.0,
        what=lambda: f"a ledger row per admitted call: {admitted[key['secret']]} admitted, rows {seen}",
    )
    assert await a_row_per_admitted_call(other)


async def test_redis_stopped_both_processes_refuse_limited_keys_and_serve_the_others(
    private_pair: Pair, up: PeakUpstream, private_redis: PrivateRedis
) -> None:
    up.set_default(answer("ok"))
    limited, plain = private_pair.key("--rpm", "100"), private_pair.key()
    async with httpx.AsyncClient(timeout=10.0) as client:

        async def post(url: str, secret: str) -> httpx.Response:
            return await client.post(f"{url}{COMPLETIONS}", json=body("chat"), headers=bearer(secret))

        for url in private_pair.urls:
            assert (await post(url, limited["secret"])).status_code == 200

        private_redis.stop()

        for url in private_pair.urls:
            refused = await post(url, limited["secret"])
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert (error["type"], error["message"]) == ("unavailable", "limits cannot be checked")
            assert (await post(url, plain["secret"])).status_code == 200
    await wait_until(lambda: _count(private_pair, limited["id"], 4), within=5.0, what="the limited key's 4 rows")
    rows = await private_pair.ledger(limited["id"])
    assert sorted(row["status"] for row in rows) == ["error", "error", "ok", "ok"]
    assert len(await private_pair.ledger(plain["id"])) == 2


async def test_a_key_expires_at_its_time_on_both_processes(pair: Pair, up: PeakUpstream) -> None:
    up.set_default(answer("ok"))
    expires = datetime.now(UTC) + timedelta(seconds=10)  # room for the CLI and four requests on a slow machine
    key = pair.key("--rpm", "100", "--expires", expires.isoformat())
    assert datetime.fromisoformat(key["expires_at"]) == expires
    async with httpx.AsyncClient(timeout=10.0) as client:

        async def status(url: str) -> int:
            response = await client.post(f"{url}{COMPLETIONS}", json=body("chat"), headers=bearer(key["secret"]))
            return response.status_code

        assert [await status(url) for url in pair.urls] == [200, 200]
        assert datetime.now(UTC) < expires  # both answered before the key expired
        await asyncio.sleep((expires - datetime.now(UTC)).total_seconds() + 0.05)
        assert [await status(url) for url in pair.urls] == [401, 401]


async def test_no_secret_in_any_table_redis_key_log_or_metric_of_either_process(
    pair: Pair, up: PeakUpstream, prefix: str
) -> None:
    """Keys made by the CLI and over HTTP, used on both processes with both headers, a wrong
    secret, `/keys/me`, then revoked: the secrets (whole, without `sy-`, and their tails) are in no
    PostgreSQL table, Redis key or value, log line or metric; the key's id is (the scan reads)."""
    up.set_default(answer("ok"))
    cli_key = pair.key("--rpm", "50", "--tpm", "100000", "--budget-usd", "1", "--budget-period", "day")
    metrics = []
    async with httpx.AsyncClient(timeout=10.0) as client:
        made = await client.post(
            f"{pair.urls[0]}/api/v1/keys", json={"name": "h", "max_concurrency": 2}, headers=bearer(ADMIN)
        )
        assert made.status_code == 201, made.text
        secrets = [cli_key["secret"], made.json()["secret"]]
        for url in pair.urls:
            for secret in secrets:
                for headers in (bearer(secret), {"x-api-key": secret}, bearer(secret + "x")):
                    await client.post(f"{url}{COMPLETIONS}", json=body("chat"), headers=headers)
                assert (await client.get(f"{url}/api/v1/keys/me", headers=bearer(secret))).status_code == 200
            metrics.append((await client.get(f"{url}/metrics")).text)
        revoked = await client.delete(f"{pair.urls[1]}/api/v1/keys/{made.json()['id']}", headers=bearer(ADMIN))
        assert revoked.status_code == 200
    pair.cli("keys", "revoke", cli_key["id"])
    await wait_until(lambda: _count(pair, cli_key["id"], 4), within=5.0, what="the CLI key's 4 rows")

    conn = await asyncpg.connect(pair.database.replace("+asyncpg", ""))
    try:
        names = await conn.fetch("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
        dumped = [str(dict(row)) for name in names for row in await conn.fetch(f'SELECT * FROM "{name[0]}"')]  # noqa: S608
    finally:
        await conn.close()
    redis = Redis.from_url("redis://127.0.0.1:6379/0")
    stored = [repr((key, redis.dump(key))) for key in redis.scan_iter(match=f"{prefix}:*")]
    redis.close()
    logs = "".join(text for process in pair.started for text in process.output())
    assert any(cli_key["id"] in row for row in dumped)
    assert any(cli_key["id"] in entry for entry in stored)
    for process in pair.started:  # each logged its 4 completions and its 2 refusals (the wrong secrets)
        assert sorted(line["status"] for line in request_lines(process.output()[0])) == ["ok"] * 4 + ["rejected"] * 2
    for needle in (*(s for secret in secrets for s in (secret, secret[3:], secret[-24:])), ADMIN):
        assert not any(needle in row for row in dumped), needle
        assert not any(needle in entry for entry in stored), needle
        assert needle not in logs
        assert not any(needle in text for text in metrics)


async def test_a_failed_or_a_cancelled_request_gives_its_reservation_back(pair: Pair, up: PeakUpstream) -> None:
    """A key whose budget, tpm and max_concurrency each hold one request's reservation and not two
    (worst case 89 + 1000 tokens, $0.002089): after an upstream failure, and after a client that
    went away mid-request, the next request passes only because the reservation was settled (to
    nothing for the failure, to its row's estimated cost for the cancellation)."""
    key = pair.key("--budget-usd", "0.003", "--budget-period", "day", "--tpm", "1100", "--max-concurrency", "1")
    url = pair.urls[0]  # one process: its own next admission sends its settlements first
    async with httpx.AsyncClient(timeout=10.0) as client:

        async def post(**options: Any) -> httpx.Response:
            return await client.post(
                f"{url}{COMPLETIONS}", json=body("chat", max_tokens=1000), headers=bearer(key["secret"]), **options
            )

        up.set_default(error(400, "invalid_request_error"))  # a failure that does not cool the backend down
        assert (await post()).status_code == 400
        up.set_default(answer("ok"))
        assert (await post()).status_code == 200

        up.set_default(played(answer("ok"), first_byte_delay_s=5.0))
        with pytest.raises(httpx.ReadTimeout):
            await post(timeout=0.5)

        async def cancelled() -> bool:
            return [row["status"] for row in await pair.ledger(key["id"])].count("cancelled") == 1

        await wait_until(cancelled, within=5.0, what="the cancelled request's row")
        up.set_default(answer("ok"))
        assert (await post()).status_code == 200
        await wait_until(lambda: _count(pair, key["id"], 4), within=5.0, what="4 ledger rows")
        me = (await client.get(f"{url}/api/v1/keys/me", headers=bearer(key["secret"]))).json()
    rows = sorted((row["status"], row["cost_usd"]) for row in await pair.ledger(key["id"]))
    # the cancelled one is charged the estimate of its prompt (README: a cancellation is not free)
    assert rows == [
        ("cancelled", Decimal("0.000005")),
        ("error", None),
        ("ok", Decimal("0.000005")),
        ("ok", Decimal("0.000005")),
    ]
    assert Decimal(me["spent_usd"]) == Decimal("0.000015")  # what the ledger says, settled in Redis


async def test_without_redis_a_change_reaches_the_other_process_within_a_second(
    pair_without_redis: Pair, up: PeakUpstream
) -> None:
    """No pub/sub: each process reads the table's watermark every 0.5 s. A key made over HTTP on one
    process is accepted by the other, and a revocation over HTTP on one, or by the CLI, is refused
    by both, each within a second."""
    pair = pair_without_redis
    up.set_default(answer("ok"))
    cli_key = pair.key()
    async with httpx.AsyncClient(timeout=10.0) as client:

        async def status(url: str, secret: str) -> int:
            response = await client.post(f"{url}{COMPLETIONS}", json=body("chat"), headers=bearer(secret))
            assert response.status_code in (200, 401), response.text
            return response.status_code

        made = await client.post(f"{pair.urls[0]}/api/v1/keys", json={"name": "h"}, headers=bearer(ADMIN))
        secret = made.json()["secret"]
        assert await status(pair.urls[0], secret) == 200  # at once where it was made
        await wait_until(lambda: _is(status(pair.urls[1], secret), 200), within=1.0, what="the other accepting it")

        revoked = await client.delete(f"{pair.urls[0]}/api/v1/keys/{made.json()['id']}", headers=bearer(ADMIN))
        assert revoked.status_code == 200
        assert await status(pair.urls[0], secret) == 401
        await wait_until(lambda: _is(status(pair.urls[1], secret), 401), within=1.0, what="the other refusing it")

        assert [await status(url, cli_key["secret"]) for url in pair.urls] == [200, 200]
        pair.cli("keys", "revoke", cli_key["id"])
        for url in pair.urls:
            await wait_until(
                lambda url=url: _is(status(url, cli_key["secret"]), 401),
                within=1.0,
                what=f"{url} refusing the CLI's revocation",
            )


async def _is(answer: Awaitable[int], expected: int) -> bool:
    return await answer == expected


async def test_a_redis_restarted_without_its_data_gets_the_reservations_in_flight_back(
    private_pair: Pair, up: PeakUpstream, private_redis: PrivateRedis
) -> None:
    """The chaos audit's case (`app.access.restore`): 30 requests in flight over both processes when
    Redis restarts without its data. The spend record loaded again from the ledger (no row of them
    yet) held none of their reservations, so the next burst was admitted against the whole budget
    again (the audit: $0.075 spent of $0.05). Each process now restores its reservations before
    the record is loaded: of 40 more, 10 pass ($0.0842 admits 40 worst cases, as above)."""
    up.set_default(played(answer("ok"), first_byte_delay_s=HOLD_S))
    key = private_pair.key("--budget-usd", "0.0842", "--budget-period", "day")
    first = asyncio.ensure_future(_burst(private_pair, key["secret"], 30, max_tokens=1000))
    await wait_until(lambda: len(up.requests) == 30, within=10.0, what="30 requests at the upstream")

    private_redis.restart()
    second = await _burst(private_pair, key["secret"], 40, max_tokens=1000)

    assert sorted(r.status_code for r in second) == [200] * 10 + [429] * 30
    assert [r.status_code for r in await first] == [200] * 30
    await wait_until(lambda: _count(private_pair, key["id"], 70), within=5.0, what="70 ledger rows")
    rows = await private_pair.ledger(key["id"])
    total = sum((row["cost_usd"] for row in rows if row["cost_usd"] is not None), Decimal(0))
    assert total == 40 * Decimal("0.000005")
    async with httpx.AsyncClient() as client:

        async def settled() -> bool:
            me = (await client.get(f"{private_pair.urls[0]}/api/v1/keys/me", headers=bearer(key["secret"]))).json()
            return Decimal(me["spent_usd"]) == total

        await wait_until(settled, what="keys/me reporting every settled cost, once")
