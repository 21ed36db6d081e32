"""Usage → five disjoint buckets, and the upstream's billed cost as an exact Decimal."""

from __future__ import annotations

from decimal import Decimal

import msgspec
import pytest

from catalog.exact import COST_SCALE
from providers.events import Usage, UsageReport
from providers.usage import LEDGER_SCALE, OpenAIUsage, openai_buckets, openai_cost, openai_report

# as the adapters decode it: a field of a chunk decoded with `strict=False` (providers/openai_chat.py)
_decoder = msgspec.json.Decoder(OpenAIUsage, strict=False)


def decode_openai_usage(raw: str) -> OpenAIUsage:
    return _decoder.decode(raw)


def buckets(raw: str) -> Usage:
    return openai_buckets(decode_openai_usage(raw))


def test_every_detail_is_subtracted_out() -> None:
    raw = (
        '{"prompt_tokens":500,"completion_tokens":120,"total_tokens":620,'
        '"prompt_tokens_details":{"cached_tokens":300,"cache_write_tokens":150},'
        '"completion_tokens_details":{"reasoning_tokens":100}}'
    )
    assert buckets(raw) == Usage(
        input_tokens=50, output_tokens=20, reasoning_tokens=100, cache_read_tokens=300, cache_write_tokens=150
    )


@pytest.mark.parametrize(
    "details",
    [
        "",
        ',"prompt_tokens_details":null,"completion_tokens_details":null',
        ',"prompt_tokens_details":{},"completion_tokens_details":{}',
        ',"prompt_tokens_details":{"cached_tokens":null},"completion_tokens_details":{"reasoning_tokens":null}',
    ],
)
def test_missing_null_and_empty_details_are_zero(details: str) -> None:
    raw = '{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15' + details + "}"
    assert buckets(raw) == Usage(input_tokens=12, output_tokens=3)


def test_deepseek_cache_hit_tokens() -> None:
    raw = '{"prompt_tokens":100,"completion_tokens":5,"prompt_cache_hit_tokens":60,"prompt_cache_miss_tokens":40}'
    assert buckets(raw) == Usage(input_tokens=40, output_tokens=5, cache_read_tokens=60)


def test_cached_tokens_win_over_deepseek_field() -> None:
    raw = (
        '{"prompt_tokens":100,"completion_tokens":5,"prompt_cache_hit_tokens":60,'
        '"prompt_tokens_details":{"cached_tokens":10}}'
    )
    assert buckets(raw) == Usage(input_tokens=90, output_tokens=5, cache_read_tokens=10)


def test_details_are_clamped_into_the_totals() -> None:
    raw = (
        '{"prompt_tokens":10,"completion_tokens":4,'
        '"prompt_tokens_details":{"cached_tokens":25,"cache_write_tokens":5},'
        '"completion_tokens_details":{"reasoning_tokens":9}}'
    )
    assert buckets(raw) == Usage(input_tokens=0, output_tokens=0, reasoning_tokens=4, cache_read_tokens=10)
    raw = (
        '{"prompt_tokens":10,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":-3},'
        '"completion_tokens_details":{"reasoning_tokens":-1}}'
    )
    assert buckets(raw) == Usage(input_tokens=10, output_tokens=4)
    raw = '{"prompt_tokens":8,"prompt_tokens_details":{"cached_tokens":6,"cache_write_tokens":5}}'
    assert buckets(raw) == Usage(input_tokens=0, cache_read_tokens=6, cache_write_tokens=2)


def test_missing_totals_and_lenient_numbers() -> None:
    assert buckets("{}") == Usage()
    assert buckets('{"prompt_tokens":null,"completion_tokens":7.0}') == Usage(output_tokens=7)


def test_cost_is_exact_decimal() -> None:
    usage = decode_openai_usage('{"prompt_tokens":42,"completion_tokens":17,"cost":0.000123456789012345}')
    assert str(openai_cost(usage)) == "0.000123456789012345"
    assert openai_cost(decode_openai_usage('{"cost":1e-7}')) == Decimal("1E-7")
    assert openai_cost(decode_openai_usage('{"cost":0}')) == Decimal(0)


@pytest.mark.parametrize(
    ("reported", "kept"),
    [
        ("0.000123456789012345678", "0.000123456789012346"),  # the answer said 21 places, the ledger 18
        ("0.1234567890123456785", "0.123456789012345678"),  # half to even
        ("1e-20", "0"),
        ("100.0000000000000000005", "100"),
    ],
)
def test_a_cost_past_the_ledgers_places_is_rounded_once_to_them(reported: str, kept: str) -> None:
    assert LEDGER_SCALE == COST_SCALE
    assert str(openai_cost(decode_openai_usage(f'{{"cost":{reported}}}'))) == kept


def test_cost_in_usd_ticks() -> None:
    usage = decode_openai_usage('{"prompt_tokens":3,"completion_tokens":1,"cost_in_usd_ticks":1234567}')
    assert openai_cost(usage) == Decimal("0.0001234567")
    assert openai_cost(decode_openai_usage('{"cost_in_usd_ticks":10000000000}')) == Decimal(1)
    both = decode_openai_usage('{"cost":0.5,"cost_in_usd_ticks":1}')
    assert openai_cost(both) == Decimal("0.5")


def test_no_cost_reported() -> None:
    assert openai_cost(decode_openai_usage('{"prompt_tokens":1}')) is None
    assert openai_cost(decode_openai_usage('{"cost":null}')) is None


def test_a_negative_cost_is_no_bill() -> None:
    """No bill is negative: the catalog's estimate prices such a request, as one with no cost."""
    assert openai_cost(decode_openai_usage('{"cost":-1}')) is None
    assert openai_cost(decode_openai_usage('{"cost":-0.000001}')) is None
    assert openai_cost(decode_openai_usage('{"cost_in_usd_ticks":-5}')) is None
    assert openai_cost(decode_openai_usage('{"cost":-1,"cost_in_usd_ticks":5}')) == Decimal("5E-10")


def test_report_joins_buckets_and_cost() -> None:
    usage = decode_openai_usage('{"prompt_tokens":5,"completion_tokens":2,"cost":0.25}')
    assert openai_report(usage) == UsageReport(usage=Usage(input_tokens=5, output_tokens=2), cost_usd=Decimal("0.25"))
