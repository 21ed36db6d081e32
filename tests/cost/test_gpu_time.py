"""Local GPU cost (cost.md): a provider with `gpu_hour_usd` prices its requests by their share of its
busy time (`cost_source: amortized`).

The tracker's arithmetic is checked exactly on a laid-out timeline (a clock passed to its public
constructor); the gateway's is checked end to end with two overlapping requests against a slow
loopback upstream, against the timeline the ledger itself measured.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from app.pipeline.gpu_time import BusyTimeTracker, GpuTicket
from app.settings import ConfigError, settings_from_mapping
from tests.support.catalog import catalog_toml, model, price
from tests.support.client import complete, stream
from tests.support.gateway import StartGateway, provider_table
from tests.support.replies import answer as cloud_answer
from tests.support.replies import error, stream_answer
from tests.support.upstream import ReplayUpstream, reply_json
from tests.support.waiting import wait_until

SECOND = 1_000_000_000


class Timeline:
    """A clock the test moves by hand, in whole seconds."""

    def __init__(self) -> None:
        self.now = 0

    def at(self, seconds: int) -> Timeline:
        self.now = seconds * SECOND
        return self

    def __call__(self) -> int:
        return self.now


def test_busy_time_is_divided_among_the_requests_in_flight() -> None:
    clock = Timeline()
    tracker = BusyTimeTracker(Decimal("2.50"), clock)
    tickets: dict[str, GpuTicket] = {}
    # A 0..30 s, B 10..20 s, C 16..31 s; idle 31..40 s; D 40..45 s alone.
    tickets["A"] = tracker.start()
    clock.at(10)
    tickets["B"] = tracker.start()
    clock.at(16)
    tickets["C"] = tracker.start()
    assert tracker.in_flight == 3
    clock.at(20)
    tickets["B"].stop()
    clock.at(30)
    tickets["A"].stop()
    assert tickets["C"].cost_usd() is None  # still in flight
    clock.at(31)
    tickets["C"].stop()
    tickets["C"].stop()  # idempotent: a ticket is charged once
    clock.at(40)
    tickets["D"] = tracker.start()
    clock.at(45)
    tickets["D"].stop()
    assert tracker.in_flight == 0

    # Segments: 0-10 A alone (10 s); 10-16 A,B (3 s each); 16-20 A,B,C (4/3 s each);
    # 20-30 A,C (5 s each); 30-31 C alone (1 s). At 2.50 USD/h = 1/1440 USD per second:
    # A = 10 + 3 + 4/3 + 5 = 58/3 s  -> 58/4320  = 0.013425925925925925|925...
    # B = 3 + 4/3          = 13/3 s  -> 13/4320  = 0.003009259259259259|259...
    # C = 4/3 + 5 + 1      = 22/3 s  -> 22/4320  = 0.005092592592592592|592...
    # D = 5 s                        ->  5/1440  = 0.003472222222222222|222...
    costs = {name: ticket.cost_usd() for name, ticket in tickets.items()}
    assert costs == {
        "A": Decimal("0.013425925925925926"),
        "B": Decimal("0.003009259259259259"),
        "C": Decimal("0.005092592592592593"),
        "D": Decimal("0.003472222222222222"),
    }
    assert {name: ticket.share_ns for name, ticket in tickets.items()} == {
        "A": Fraction(58 * SECOND, 3),
        "B": Fraction(13 * SECOND, 3),
        "C": Fraction(22 * SECOND, 3),
        "D": 5 * SECOND,
    }
    # Every busy second is charged exactly once: 36 busy seconds, to within the 18-place rounding.
    busy = Decimal(36) * Decimal("2.50") / 3600
    assert abs(sum(c for c in costs.values() if c is not None) - busy) <= Decimal("2E-18")


def test_gpu_hour_usd_is_an_exact_decimal_for_your_own_servers() -> None:
    def settings(kind: str, value: object) -> object:
        providers = {"gpu": {"kind": kind, "base_url": "http://127.0.0.1:9/v1", "gpu_hour_usd": value}}
        return settings_from_mapping({"providers": providers}, base_dir=Path("."), source="config.toml")

    settings("local", "2.50")
    settings("openai_compatible", "0")
    for kind, value, message in [
        ("local", 2.5, "providers.gpu.gpu_hour_usd: Expected `str | null`, got `float`"),
        ("local", "-1", "providers.gpu.gpu_hour_usd: Expected `str` matching regex"),
        ("local", "1e3", "providers.gpu.gpu_hour_usd: Expected `str` matching regex"),
        ("fastrun", "2.50", "providers.gpu.gpu_hour_usd: only for a provider whose GPUs you run"),
    ]:
        with pytest.raises(ConfigError) as caught:
            settings(kind, value)
        assert message in str(caught.value)


RATE = Decimal("36")  # USD per GPU hour: 0.01 USD per busy second
CATALOG = catalog_toml(
    model("gpu-model", ("gpu", "up-gpu")),
    prices=[price("gpu", "gpu-model", "0.10", "0.40"), price("cloud", "gpu-model", "0.60", "2.40")],
)
TOLERANCE_S = Decimal("0.010")  # the ledger's clock brackets the tracker's: routing before, accounting after


def answer(text: str, input_tokens: int, output_tokens: int, delay_s: float) -> object:
    body = {
        "id": "chatcmpl-gpu",
        "object": "chat.completion",
        "created": 1764460800,
        "model": "up-gpu",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens},
    }
    return reply_json(200, body, first_byte_delay_s=delay_s)


async def test_two_overlapping_requests_share_the_gpu_time(start_gateway: StartGateway) -> None:
    async with ReplayUpstream(models=["up-gpu"]) as upstream:
        providers = provider_table({"gpu": upstream}, gpu={"kind": "local", "gpu_hour_usd": "36"})
        gw = await start_gateway(providers=providers, catalog=CATALOG)
        upstream.enqueue(answer("long", 100, 50, delay_s=1.2))
        upstream.enqueue(answer("short", 10, 5, delay_s=0.5))
        first = asyncio.create_task(complete(gw, "gpu-model"))
        await wait_until(lambda: len(upstream.requests) == 1, within=5.0, what="the long request upstream")
        second = await complete(gw, "gpu-model")
        long, short = (await first).json(parse_float=Decimal), second.json(parse_float=Decimal)

    assert (long["cost_source"], short["cost_source"]) == ("amortized", "amortized")
    rows = {row["request_id"]: row for row in await gw.ledger_rows()}
    a, b = rows[long["id"]], rows[short["id"]]
    assert Decimal(a["cost_usd"]) == long["cost_usd"]
    assert Decimal(b["cost_usd"]) == short["cost_usd"]
    assert (a["cost_source"], b["cost_source"]) == ("amortized", "amortized")
    # The catalog's estimate for the same usage is kept beside the amortized cost.
    assert Decimal(a["estimated_cost_usd"]) == (100 * Decimal("0.10") + 50 * Decimal("0.40")) / 1_000_000
    assert Decimal(b["estimated_cost_usd"]) == (10 * Decimal("0.10") + 5 * Decimal("0.40")) / 1_000_000

    # The short request ran entirely inside the long one: it was one of two in flight throughout,
    # so it pays half its own time; the long one pays the rest of the busy time.
    a0, a1, b0, b1 = (instant(row[key]) for row in (a, b) for key in ("started_at", "finished_at"))
    assert a0 < b0
    assert b1 < a1
    per_second = RATE / 3600
    overlap, busy = seconds(b1 - b0), seconds(a1 - a0)
    assert overlap > Decimal("0.45")
    assert busy > Decimal("1.15")
    expected_b = overlap / 2 * per_second
    expected_a = (busy - overlap / 2) * per_second
    assert abs(Decimal(b["cost_usd"]) - expected_b) <= TOLERANCE_S * per_second, (b["cost_usd"], expected_b)
    assert abs(Decimal(a["cost_usd"]) - expected_a) <= TOLERANCE_S * per_second, (a["cost_usd"], expected_a)
    # Both rows at the ledger's full 18 places, exactly as the response said.
    assert Decimal(a["cost_usd"]).as_tuple().exponent >= -18

    # The GPU-cost report sums exactly these rows: 165 tokens; the hosted price on the same tokens is
    # 110 x 0.60 + 55 x 2.40 = 198 per 1e6 = 0.000198 USD, 1.2 USD per million.
    report = (await gw.client.get("/api/v1/catalog/gpu-cost")).json()
    amortized = Decimal(a["cost_usd"]) + Decimal(b["cost_usd"])
    per_mtok = (amortized * 1_000_000 / 165).quantize(Decimal("1E-10"))
    assert report["rows"] == [
        {
            "provider": "gpu",
            "model": "gpu-model",
            "requests": 2,
            "tokens": 165,
            "amortized_usd": format(amortized.normalize(), "f"),
            "usd_per_mtok": format(per_mtok.normalize(), "f"),
            "hosted": [
                {
                    "provider": "cloud",
                    "input_usd_per_mtok": "0.6",
                    "output_usd_per_mtok": "2.4",
                    "same_usage_usd": "0.000198",
                    "usd_per_mtok": "1.2",
                }
            ],
        }
    ]


def instant(value: str | datetime) -> datetime:
    """A ledger timestamp as read back by raw SQL (SQLite gives its stored text)."""
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def seconds(delta: timedelta) -> Decimal:
    return Decimal(delta.days * 86400 + delta.seconds) + Decimal(delta.microseconds) / 1_000_000


FAILOVER_CATALOG = catalog_toml(
    model("m", ("gpu", "up-gpu", 100), ("cloud", "up-cloud", 50)),
    prices=[price("gpu", "m", "0", "0"), price("cloud", "m", "1.00", "2.00")],
)


async def test_streams_errors_and_failover_on_a_gpu_provider(start_gateway: StartGateway) -> None:
    async with ReplayUpstream(models=["up-gpu"]) as gpu, ReplayUpstream(models=["up-cloud"]) as cloud:
        providers = provider_table({"gpu": gpu, "cloud": cloud}, gpu={"kind": "local", "gpu_hour_usd": "36"})
        gw = await start_gateway(providers=providers, catalog=FAILOVER_CATALOG)
        # A stream: the cost in its last frame is the amortized one, and the ledger's.
        gpu.enqueue(stream_answer("streamed", chunk_delay_s=0.05))
        _, frames = await stream(gw, "m")
        streamed = frames[-1][1]["response"]
        # A client error from the GPU: no answer, but the GPU time it held is still charged.
        gpu.enqueue(error(400, "invalid_request_error", first_byte_delay_s=0.1))
        rejected = await complete(gw, "m")
        assert rejected.status_code == 400
        # An upstream error that fails over: the cloud serves it, at the catalog's price.
        gpu.enqueue(error(503))
        cloud.enqueue(cloud_answer("from the cloud"))
        failed_over = (await complete(gw, "m")).json(parse_float=Decimal)

    rows = await gw.ledger_rows()
    by_id = {row["request_id"]: row for row in rows}
    row = by_id[streamed["id"]]
    assert (row["cost_source"], streamed["cost_source"]) == ("amortized", "amortized")
    assert Decimal(row["cost_usd"]) == streamed["cost_usd"] > 0
    assert Decimal(row["estimated_cost_usd"]) == 0  # the GPU's own catalog row says 0 per token

    row = by_id[failed_over["id"]]
    assert (row["provider"], row["attempts"], row["cost_source"]) == ("cloud", 2, "estimated")
    assert Decimal(row["cost_usd"]) == failed_over["cost_usd"] == (3 * Decimal("1.00") + 1 * Decimal("2.00")) / 10**6

    (row,) = [r for r in rows if r["status"] == "error"]
    assert (row["provider"], row["cost_source"], row["input_tokens"]) == ("gpu", "amortized", None)
    per_second = RATE / 3600
    held = Decimal(str(row["latency_ms"])) / 1000
    assert Decimal("0.1") * per_second <= Decimal(row["cost_usd"]) <= held * per_second
