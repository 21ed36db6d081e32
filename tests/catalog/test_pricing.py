"""Cost arithmetic (cost.md): exact Decimals, the two fallbacks, and unpriced cases."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from catalog.pricing import estimate_cost
from catalog.snapshot import PriceRow

START = datetime(2026, 1, 1, tzinfo=UTC)


def row(**rates: str) -> PriceRow:
    return PriceRow(id=7, provider="p", model="m", effective_from=START, **{k: Decimal(v) for k, v in rates.items()})


def cost(
    price: PriceRow | None,
    input_tokens: int | None = 0,
    output_tokens: int | None = 0,
    reasoning_tokens: int | None = 0,
    cache_read_tokens: int | None = 0,
    cache_write_tokens: int | None = 0,
) -> Decimal | None:
    return estimate_cost(
        price,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        reasoning_tokens=reasoning_tokens,
        cache_read_tokens=cache_read_tokens,
        cache_write_tokens=cache_write_tokens,
    )


FULL = row(input="0.50", output="1.50", cache_read="0.125", cache_write="0.625", reasoning="2.00")


def test_all_five_buckets_priced() -> None:
    # 1000·0.50 + 4000·0.125 + 100·0.625 + 200·1.50 + 50·2.00 = 1462.5 per 1e6
    assert cost(FULL, 1000, 200, 50, 4000, 100) == Decimal("0.0014625")


def test_cache_read_falls_back_to_input_and_reasoning_to_output() -> None:
    price = row(input="0.10", output="0.40")
    # 42·0.10 + 128·0.10 + 17·0.40 + 6·0.40 = 26.2 per 1e6
    assert cost(price, 42, 17, 6, 128, 0) == Decimal("0.0000262")


def test_the_api_example() -> None:
    price = row(input="0.10", output="0.40", cache_read="0.025")
    # 42·0.10 + 128·0.025 + 17·0.40 + 6·0.40 = 16.6 per 1e6
    assert cost(price, 42, 17, 6, 128, 0) == Decimal("0.0000166")


def test_zero_token_buckets_need_no_rate() -> None:
    assert cost(row(input="3"), input_tokens=1_000_000) == Decimal(3)
    assert cost(row(output="3"), output_tokens=2) == Decimal("0.000006")


@pytest.mark.parametrize(
    "usage",
    [
        {"cache_write_tokens": 1},  # no cache_write rate
        {"input_tokens": 1},  # no input rate
        {"cache_read_tokens": 1},  # no cache_read rate and no input rate to fall back to
    ],
)
def test_missing_rate_for_used_bucket_is_unpriced(usage: dict[str, int]) -> None:
    assert cost(row(output="1"), **usage) is None


def test_reasoning_without_any_output_rate_is_unpriced() -> None:
    assert cost(row(input="1"), input_tokens=5, reasoning_tokens=1) is None


def test_no_price_row_is_unpriced() -> None:
    assert cost(None, 10, 10) is None


def test_unknown_usage_is_unpriced() -> None:
    assert cost(FULL, None, 10) is None
    assert cost(FULL, 10, 10, cache_write_tokens=None) is None


def test_zero_prices_cost_exactly_zero() -> None:
    free = row(input="0", output="0", cache_read="0", cache_write="0")
    result = cost(free, 100, 100, 10, 10, 10)
    assert result == Decimal(0)
    assert result is not None
    assert not result.is_signed()


def test_full_precision_is_kept() -> None:
    assert cost(row(input="0.0000000001"), input_tokens=1) == Decimal("1E-16")
    huge = row(input="9999999999.9999999999", output="0.0000000001")
    # (123456789012·(1e10 - 1e-10) + 3·1e-10) / 1e6 = (1234567890120000000000 - 12.3456789012 + 3e-10) / 1e6
    assert cost(huge, input_tokens=123_456_789_012, output_tokens=3) == Decimal("1234567890119999.9999876543210991")


def test_negative_tokens_are_a_bug() -> None:
    with pytest.raises(ValueError, match="negative token count -1"):
        cost(FULL, input_tokens=-1)
