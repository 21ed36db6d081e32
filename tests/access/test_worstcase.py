"""The worst-case cost a budget reserves (`app.access.worstcase`), in whole nano-dollars rounded up,
against the same arithmetic done by hand in `Decimal`."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal

import msgspec
import pytest
import structlog

from app.access.gate import AccessGate, Plan, Reservation
from app.access.keyring import Entry, KeyRing
from app.access.worstcase import (
    MEDIA_ALLOWANCE,
    MESSAGE_ALLOWANCE,
    TOOL_ALLOWANCE,
    WorstRates,
    input_bounds,
    scaled,
    to_nano,
    worst_cost_nano,
    worst_rates,
)
from app.context import new_context
from app.metrics import Counter
from app.settings import Settings
from catalog.database import open_engine
from catalog.keys import KeyRecord
from catalog.snapshot import CatalogSnapshot, ModelEntry, PriceRow
from providers.types import (
    AnyRequest,
    AudioPart,
    CompletionRequest,
    DocumentPart,
    FileData,
    ImageData,
    ImagePart,
    Message,
    TextCompletionRequest,
    TextPart,
    ToolDefinition,
)


def input_bound(request: AnyRequest) -> int:
    """The input estimate alone (what `tpm` reserves): `input_bounds` without a context window."""
    return input_bounds(request, 0)[0]


@pytest.mark.parametrize(
    ("tokens_in", "tokens_out", "rates", "nano"),
    [
        (89, 1000, ("1", "2"), 2_089_000),  # $0.002089: the two-process test's request
        (24, 16, ("0.5", "1.5"), 36_000),  # 24 x 0.5 + 16 x 1.5 = 36 micro-dollars
        (1, 0, ("0.000123456789012345", "0"), 1),  # 1.23456789012345e-10 USD: rounded up to 1 nano
        (3, 7, ("0.07", "15.00"), 105_210),
        (0, 0, ("3", "3"), 0),
        (10, 10, ("1E+1", "0"), 100_000),
    ],
)
def test_worst_cost_is_the_exact_sum_rounded_up_to_a_nano_dollar(
    tokens_in: int, tokens_out: int, rates: tuple[str, str], nano: int
) -> None:
    rate_in, rate_out = Decimal(rates[0]), Decimal(rates[1])
    usd = (tokens_in * rate_in + tokens_out * rate_out) / Decimal(1_000_000)
    assert int((usd * Decimal(10**9)).to_integral_value(rounding=ROUND_CEILING)) == nano  # the hand sum
    assert worst_cost_nano(tokens_in, tokens_out, WorstRates(*scaled((rate_in, rate_out)), None, None)) == nano


@pytest.mark.parametrize(
    ("usd", "nano"),
    [
        (None, 0),
        (Decimal(-1), 0),
        (Decimal(0), 0),
        (Decimal("0.000000000000000001"), 1),  # the ledger's smallest cost still reserves a nano-dollar
        (Decimal("0.0000000015"), 2),
        (Decimal("0.000000002"), 2),
        (Decimal("12.5"), 12_500_000_000),
        (Decimal("1234567.123456789000000001"), 1_234_567_123_456_790),
    ],
)
def test_to_nano_rounds_up(usd: Decimal | None, nano: int) -> None:
    assert to_nano(usd) == nano


def test_the_input_bound_counts_every_byte_sent_and_an_allowance_per_message_tool_and_medium() -> None:
    """`input_bound`: the JSON of the messages, the system text, the tools and the schema, plus the
    allowances; each image, audio and document part (sent by URL here: few bytes) adds
    `MEDIA_ALLOWANCE`, text and tool parts nothing more."""
    image = ImagePart(data=ImageData(url="https://example.test/cat.png"))
    audio, document = AudioPart(data=FileData(url="https://x.test/a.wav")), DocumentPart(data=FileData(url="d"))
    messages = [
        Message(role="user", content=[TextPart(data="caf\u00e9"), image, audio]),
        Message(role="assistant", content=[TextPart(data="ok")]),
        Message(role="user", content=[document, image]),
    ]
    tools = [ToolDefinition(name="lookup", parameters={"type": "object"})]
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    request = CompletionRequest(messages=messages, system="Be br\u00efef.", tools=tools, schema=schema)
    expected = (
        len(msgspec.json.encode(messages))
        + MESSAGE_ALLOWANCE * 4
        + len("Be br\u00efef.".encode())
        + len(msgspec.json.encode(tools))
        + TOOL_ALLOWANCE
        + len(msgspec.json.encode(schema))
        + MEDIA_ALLOWANCE * 4
    )
    assert input_bound(request) == expected
    plain = CompletionRequest(messages=[Message(role="user", content=[TextPart(data="hi")])])
    sent = b'[{"role":"user","content":[{"kind":"text","data":"hi"}]}]'
    assert input_bound(plain) == len(sent) + 2 * MESSAGE_ALLOWANCE
    assert input_bound(TextCompletionRequest(prompt="na\u00efve")) == 6 + MESSAGE_ALLOWANCE


@pytest.mark.parametrize("scheme", ["data", "DATA", "Data"])
def test_a_data_url_in_any_case_is_inline_and_reserves_no_context_window(scheme: str) -> None:
    """A URL's scheme is case-insensitive (RFC 3986; vLLM and httpx read `DATA:` as `data:`): the
    medium is inline, its bytes counted. `DATA:` was taken for a reference and reserved the model's
    whole context window (131,072 tokens for a few bytes of image)."""
    inline = ImagePart(data=ImageData(url=f"{scheme}:image/png;base64,iVBORw0KGgo="))
    request = CompletionRequest(messages=[Message(role="user", content=[inline])])
    size = input_bound(request)
    assert input_bounds(request, 131072) == (size, size)
    fetched = ImagePart(data=ImageData(url="https://example.test/cat.png"))
    request = CompletionRequest(messages=[Message(role="user", content=[fetched])])
    assert input_bounds(request, 131072) == (input_bound(request), 131072)


def _snapshot(*prices: tuple[str, str, str, str]) -> tuple[CatalogSnapshot, ModelEntry]:
    model = ModelEntry("m", (), 1000, 100, frozenset(), True, ())
    rows = [
        PriceRow(index, provider, "m", datetime.fromisoformat(start), input=Decimal(rate_in), output=Decimal(rate_out))
        for index, (provider, start, rate_in, rate_out) in enumerate(prices)
    ]
    return CatalogSnapshot([model], rows), model


def test_worst_rates_hold_until_a_price_of_the_route_changes() -> None:
    snapshot, model = _snapshot(
        ("a", "2026-01-01T00:00:00+00:00", "1", "4"),
        ("a", "2026-06-01T00:00:00+00:00", "1.5", "4"),
        ("b", "2026-03-01T00:00:00+00:00", "0.25", "8"),
        ("b", "2026-09-01T00:00:00+00:00", "0.25", "2"),
    )
    when = datetime(2026, 4, 1, tzinfo=UTC)
    rates = worst_rates(snapshot, model, ["a", "b"], when)
    assert rates == WorstRates(
        1, 8, 1, datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 6, 1, tzinfo=UTC)
    )  # a in, b out
    assert worst_rates(snapshot, model, ["a"], when).end == datetime(2026, 6, 1, tzinfo=UTC)
    late = worst_rates(snapshot, model, ["a", "b"], datetime(2026, 10, 1, tzinfo=UTC))
    assert late == WorstRates(15, 40, 10, datetime(2026, 9, 1, tzinfo=UTC), None)  # no later price: for ever


async def test_the_gate_keeps_rates_only_while_their_prices_are_in_effect() -> None:
    """The gate's reservation (`AccessGate.reserve`, no Redis: it answers the request's tokens and
    worst-case cost) follows the price in effect at the request's start, from its first
    microsecond, while the rates it computed once are kept."""
    snapshot, model = _snapshot(
        ("a", "2026-01-01T00:00:00+00:00", "1", "4"), ("a", "2026-06-01T00:00:00+00:00", "2", "4")
    )
    settings = Settings()
    engine = open_engine("sqlite+aiosqlite://")  # never connected: the rates need no database
    log = structlog.get_logger("test")
    gate = AccessGate(settings, engine, KeyRing(engine, settings.auth, None, log), log, Counter("c", "c", ()))
    now = datetime.now(UTC)
    record = KeyRecord(
        id="k1", name="n", secret_hash="00" * 32, prefix="sy-x", created_at=now, updated_at=now, budget_usd=Decimal(100)
    )
    entry = Entry(record)
    request = CompletionRequest(messages=[Message(role="user", content=[TextPart(data="hi")])], max_tokens=16)

    plans: list[Plan] = []

    def cost(snapshot: CatalogSnapshot, when: datetime) -> int:
        ctx = msgspec.structs.replace(new_context("r", "native", stream=False, deadline=0.0), started_at=when)
        reservation = gate.reserve(entry, ctx, request, model, ("a",), snapshot)
        assert isinstance(reservation, Reservation)
        plans.append(reservation.plan)
        return reservation.cost

    # 89 input tokens at most (57 bytes of messages' JSON, an allowance per message and one more) and 16 out
    assert cost(snapshot, datetime(2026, 5, 31, 23, 59, 59, tzinfo=UTC)) == (89 * 1 + 16 * 4) * 1000
    assert cost(snapshot, datetime(2026, 5, 1, tzinfo=UTC)) == 153_000
    assert plans[1] is plans[0]  # the same rates: not computed again
    assert cost(snapshot, datetime(2026, 6, 1, tzinfo=UTC)) == (89 * 2 + 16 * 4) * 1000  # the new price
    assert cost(snapshot, datetime(2026, 5, 1, tzinfo=UTC)) == 153_000  # and back
    other, _model = _snapshot(("a", "2026-01-01T00:00:00+00:00", "3", "4"))
    assert cost(other, datetime(2026, 7, 1, tzinfo=UTC)) == (89 * 3 + 16 * 4) * 1000  # a new catalog
    await engine.dispose()
