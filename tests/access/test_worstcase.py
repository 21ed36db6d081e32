"""The worst-case cost a budget reserves (`app.access.worstcase`), in whole nano-dollars rounded up,
against the same arithmetic done by hand in `Decimal`."""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal

import pytest

from app.access.worstcase import worst_cost_nano


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
    assert worst_cost_nano(tokens_in, tokens_out, (rate_in, rate_out)) == nano
