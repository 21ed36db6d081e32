"""Leases of admissions (`app.access.lease`) against the real Redis on this machine: two limiters
are two processes. A lease spares Redis the admissions it holds, counts in full in Redis until its
unused part is given back, and never makes another process refuse a request that fits the limit:
that process waits for the lease to end instead."""

from __future__ import annotations

import asyncio
import time

from redis import Redis

from app.access.lease import LEASE_MIN, LEASE_S
from app.access.limiter import Ask
from app.access.redis_limiter import RedisLimiter
from app.settings import RedisSettings
from tests.access.test_redis_limiter import URL, _Tap


def _ask(request_id: str, rpm: int = 1000) -> Ask:
    return Ask(key_id="k1", request_id=request_id, period="total", rpm=rpm, tpm=10**6, tokens=100)


async def _early_in_a_second() -> None:
    """A lease ends with its second of the window (Redis's clock: this machine's): start where it
    has at least `LEASE_S` to live, so the test's admissions all meet the same lease."""
    into = time.time() % 1
    if into > 1 - LEASE_S - 0.2:
        await asyncio.sleep(1.02 - into)


def _window(prefix: str) -> dict[bytes, bytes]:
    client = Redis.from_url(URL)
    try:
        return dict(client.hgetall(f"{prefix}:lim:{{k1}}:window"))  # type: ignore[arg-type]
    finally:
        client.close()


async def test_a_lease_admits_without_redis_and_gives_back_what_it_did_not_use(
    prefix: str, tap: tuple[_Tap, int]
) -> None:
    wire, port = tap
    limiter = RedisLimiter(RedisSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix=prefix), lambda *_: None)
    try:
        await _early_in_a_second()
        first = await limiter.admit(_ask("r1"))
        assert first.refused is None
        # the admission took a lease of LEASE_MIN: Redis counts all of them, and says so
        window = _window(prefix)
        assert (window[b"R"], window[b"T"]) == (b"%d" % LEASE_MIN, b"%d" % (100 * LEASE_MIN))
        assert first.remaining_requests == 1000 - 1  # Redis's remaining plus what the lease holds
        for n in range(2, LEASE_MIN + 1):
            verdict = await limiter.admit(_ask(f"r{n}"))
            assert (verdict.refused, verdict.second) == (None, first.second)
            assert verdict.remaining_requests == 1000 - n
        admissions = b"".join(wire.writes).count(limiter.admit_script.sha.encode())
        assert admissions == 1, "the lease's other admissions never reached Redis"

        await limiter.admit(_ask("beyond"))  # the lease is used up: Redis again, and a new lease
        assert b"".join(wire.writes).count(limiter.admit_script.sha.encode()) == 2
        await limiter.drain()  # gives the new lease back: Redis counts what was admitted, no more
        window = _window(prefix)
        assert (window[b"R"], window[b"T"]) == (b"%d" % (LEASE_MIN + 1), b"%d" % (100 * (LEASE_MIN + 1)))
        lease = Redis.from_url(URL)
        assert lease.hlen(f"{prefix}:lim:{{k1}}:lease") == 0
        lease.close()
    finally:
        await limiter.close()


async def test_admissions_that_arrive_while_a_lease_is_asked_for_wait_for_it(
    prefix: str, tap: tuple[_Tap, int]
) -> None:
    """`LEASE_MIN` admissions of one key at once, before it has a lease: the first asks Redis for
    a lease, the others wait for it and take from it, so one admission reaches Redis (each used
    to send its own while the lease was on its way). Near a limit, where Redis grants no lease,
    the waiters then ask for themselves, and every admission is counted exactly."""
    wire, port = tap
    limiter = RedisLimiter(RedisSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix=prefix), lambda *_: None)
    try:
        await _early_in_a_second()
        verdicts = await asyncio.gather(*(limiter.admit(_ask(f"r{n}")) for n in range(LEASE_MIN)))
        assert [v.refused for v in verdicts] == [None] * LEASE_MIN
        assert sorted(v.remaining_requests for v in verdicts) == list(range(1000 - LEASE_MIN, 1000))
        assert b"".join(wire.writes).count(limiter.admit_script.sha.encode()) == 1

        # rpm 20 (a lease needs 4 x LEASE_MIN left): no lease, so the waiters each go to Redis
        near = await asyncio.gather(*(limiter.admit(_ask(f"n{n}", rpm=20)) for n in range(4)))
        assert [v.refused for v in near] == [None] * 4
        assert b"".join(wire.writes).count(limiter.admit_script.sha.encode()) == 1 + 4
        await limiter.drain()
        window = _window(prefix)
        assert window[b"R"] == b"%d" % (LEASE_MIN + 4)
    finally:
        await limiter.close()


async def test_a_lease_asked_for_as_redis_second_ends_is_asked_for_again_by_one_waiter(
    prefix: str, tap: tuple[_Tap, int]
) -> None:
    """Redis grants no lease in the last 10 ms of a second, and says so (life -1). Asked for then,
    with others of the key waiting for it, the first waiter to go on asks again, in the new
    second, and the rest take from the lease it brings: two admissions on the wire, not one per
    waiter (about thirty at every second's end under load, before)."""
    wire, port = tap
    second = int(time.time()) * 1_000_000
    times = iter([second + 995_000])  # Redis's clock at the first admission; the next second's after

    def clock() -> int:
        return next(times, second + 1_100_000)

    settings = RedisSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix=prefix)
    limiter = RedisLimiter(settings, lambda *_: None, clock=clock)
    sha = limiter.admit_script.sha.encode()
    try:
        await limiter.spend("k0", "total")  # connected: only the first admission's answer is held back below
        wire.answering.clear()
        asker = asyncio.create_task(limiter.admit(_ask("r0")))
        while sha not in b"".join(wire.writes):
            wire.written.clear()
            await wire.written.wait()
        waiters = [asyncio.create_task(limiter.admit(_ask(f"w{n}"))) for n in range(4)]
        await asyncio.sleep(0.01)  # they wait for the asker's lease
        wire.answering.set()
        verdicts = await asyncio.gather(asker, *waiters)
        assert [v.refused for v in verdicts] == [None] * 5
        assert [v.second for v in verdicts] == [second // 1_000_000] + [second // 1_000_000 + 1] * 4
        assert b"".join(wire.writes).count(sha) == 2, wire.writes
        await limiter.drain()  # the lease's unused part goes back
        window = _window(prefix)
        assert (window[b"R"], window[b"T"]) == (b"5", b"500")
    finally:
        wire.answering.set()
        await limiter.close()


async def test_an_admission_whose_caller_went_away_keeps_its_lease_and_settles_to_nothing(
    prefix: str, tap: tuple[_Tap, int]
) -> None:
    """The request asking for a lease is cancelled (its client went away) with its admission on
    the wire, while another request of the key waits for that lease. Redis counts the admission
    and its lease all the same: the answer is taken when it comes, the lease serves the waiter
    (no second admission), and the cancelled request's own reservation settles to nothing, so
    Redis ends with exactly the waiter's request and tokens once the lease is given back."""
    wire, port = tap
    limiter = RedisLimiter(RedisSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix=prefix), lambda *_: None)
    try:
        await limiter.spend("k0", "total")  # connected: only the admission's answer is held back below
        await _early_in_a_second()
        wire.answering.clear()
        asker = asyncio.create_task(limiter.admit(_ask("gone")))
        sha = limiter.admit_script.sha.encode()
        while sha not in b"".join(wire.writes):  # its admission is on the wire, its answer held
            wire.written.clear()
            await wire.written.wait()
        waiter = asyncio.create_task(limiter.admit(_ask("stays")))
        await asyncio.sleep(0.01)  # it waits for the lease
        asker.cancel()
        await asyncio.sleep(0.01)
        wire.answering.set()
        verdict = await waiter
        assert verdict.refused is None
        assert asker.cancelled()
        assert b"".join(wire.writes).count(sha) == 1
        await limiter.drain()  # the cancelled request's settlement and the lease's unused part
        window = _window(prefix)
        assert (window[b"R"], window[b"T"]) == (b"2", b"100")  # both admitted; only the waiter's tokens held
    finally:
        await limiter.close()


async def test_another_process_waits_for_a_lease_rather_than_being_refused(prefix: str) -> None:
    """rpm 40: the first process's lease holds 8 (a quarter of 40, at most `LEASE_MIN` asked) and
    uses one. The second process admits the 32 Redis has left, then the 33rd: Redis would refuse it,
    but 7 of the lease are unused, so it waits for the lease's end and is admitted. The 41st is
    refused, with every process's admissions counted exactly."""
    settings = RedisSettings(url=URL, key_prefix=prefix)
    holder, other = RedisLimiter(settings, lambda *_: None), RedisLimiter(settings, lambda *_: None)
    try:
        await _early_in_a_second()
        assert (await holder.admit(_ask("h1", rpm=40))).refused is None
        client = Redis.from_url(URL)
        leases = list(client.hvals(f"{prefix}:lim:{{k1}}:lease"))
        client.close()
        assert [lease.split()[:3] for lease in leases] == [[b"7", b"700", b"0"]]  # requests, tokens, cost unused
        for n in range(32):
            assert (await other.admit(_ask(f"o{n}", rpm=40))).refused is None
        started = time.monotonic()
        waited = await other.admit(_ask("o32", rpm=40))
        assert waited.refused is None
        assert 0.005 <= time.monotonic() - started < LEASE_S + 0.2  # waited (at least 5 ms a wait) for the lease
        for n in range(33, 39):
            assert (await other.admit(_ask(f"o{n}", rpm=40))).refused is None
        refused = await other.admit(_ask("o39", rpm=40))
        assert refused.refused == "rpm"
        assert _window(prefix)[b"R"] == b"40"
    finally:
        await holder.close()
        await other.close()


async def test_settlements_of_one_second_leave_summed_in_one_item(prefix: str) -> None:
    """Without `max_concurrency` nothing is taken off the in-flight set, so the settlements of one
    second of the window travel as one item (its tokens' difference, reservations and spend summed)
    and Redis ends exactly where one settlement per request would have left it."""
    tap = _Tap()
    server = await asyncio.start_server(tap.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limiter = RedisLimiter(RedisSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix=prefix), lambda *_: None)

    def ask(request_id: str) -> Ask:
        return Ask(
            key_id="k1", request_id=request_id, period="total", rpm=1000, tpm=10**6, tokens=100, budget=10**9, cost=7000
        )

    try:
        await limiter.load_spend(ask("r0"), 0, 0)
        await _early_in_a_second()
        verdicts = [await limiter.admit(ask(f"r{n}")) for n in range(1, 4)]
        assert len({v.second for v in verdicts}) == 1  # one lease, one second
        for n, (tokens, cost) in enumerate(((40, 1000), (60, 2000), (80, 500)), start=1):
            limiter.settle(ask(f"r{n}"), verdicts[0].second, tokens=tokens, cost=cost)
        await limiter.drain()  # the lease given back and the summed settlements: one command, two items
        sent = b"".join(tap.writes)
        settle = limiter.settle_script
        assert sent.count(settle.sha.encode()) == 1
        command = sent[sent.index(settle.head(12)) :]
        assert b"$4\r\n-120\r\n$5\r\n21000\r\n$4\r\n3500\r\n$1\r\n=\r\n" in command  # 180 - 300 tokens
        unused = LEASE_MIN - 3  # the lease's requests not admitted, their tokens and reservations
        returned = b"$%d\r\n%d\r\n$%d\r\n%d\r\n$1\r\n0\r\n$1\r\n%d\r\n" % (
            len(b"%d" % (-100 * unused)),
            -100 * unused,
            len(b"%d" % (7000 * unused)),
            7000 * unused,
            unused,
        )
        assert returned in command
        client = Redis.from_url(URL)
        spend = client.hmget(f"{prefix}:lim:{{k1}}:spend:total", "s", "r")
        window = client.hmget(f"{prefix}:lim:{{k1}}:window", "R", "T")
        client.close()
        assert (spend, window) == ([b"3500", b"0"], [b"3", b"180"])
    finally:
        await limiter.close()
        server.close()
        await server.wait_closed()
