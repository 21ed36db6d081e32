"""A model list is read as an answer is (`providers.lenient_json`): a leading byte-order mark or a
byte that is no UTF-8 in some model's description made the health probe's list a "malformed
response", a failed probe that takes the provider's backends out while its answers read fine."""

from __future__ import annotations

from decimal import Decimal

from providers.model_prices import listed_ids, read_model_list

BOM = b"\xef\xbb\xbf"
LIST = b'{"data":[{"id":"m-1","description":"caf\xe9","pricing":{"input":"1.5","output":"2"}}]}'


def test_a_model_list_after_a_bom_or_with_bytes_that_are_no_utf8_is_read() -> None:
    for body in (BOM + LIST.replace(b"\xe9", b"e"), LIST):
        assert listed_ids(body) == frozenset({"m-1"})
        listing = read_model_list(body)
        assert [(p.model, p.input, p.output) for p in listing.priced] == [("m-1", Decimal("1.5"), Decimal(2))]
