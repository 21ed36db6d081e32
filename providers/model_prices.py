"""The prices a provider's model list carries (`GET {base_url}/models`), per million tokens, for
`switchyard catalog import` (cost.md: "provider model lists that carry prices (primalabs
`/models`) can be imported the same way, as a reviewed diff").

No provider publishes one schema for this, so two conventions are read, per entry of `data` (or of
a bare list), each entry named by `id`:

- `pricing.prompt` / `pricing.completion`, with `input_cache_read`, `input_cache_write` and
  `internal_reasoning` where given: USD **per token** (OpenRouter's list, which serverless hosts
  such as primalabs follow), multiplied by 1,000,000;
- `pricing.input` / `pricing.output`, with `cache_read`, `cache_write` and `reasoning`: USD **per
  million tokens**.

A rate is a JSON number or a decimal string, read exactly (`Decimal` from the JSON text, never a
float). An entry with no input or no output rate is listed as unpriced; one with a rate that is not
a finite, non-negative number, or finer than the catalog keeps (10 decimal places per million), as
unreadable, with the reason: the import proposes nothing it would have to round.
"""

from __future__ import annotations

import decimal
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import msgspec
from msgspec import Struct

from providers.lenient_json import lenient_json, scrubbed

PER_TOKEN = {
    "input": "prompt",
    "output": "completion",
    "cache_read": "input_cache_read",
    "cache_write": "input_cache_write",
    "reasoning": "internal_reasoning",
}
PER_MILLION = {bucket: bucket for bucket in PER_TOKEN}
SCALE = 10  # the catalog's decimal places per million tokens (catalog.tables.PRICE_SCALE)
MAX_RATE = Decimal(10) ** 10  # the catalog's NUMERIC(20, 10) holds less (catalog.tables.PRICE_PRECISION)
_MILLION = Decimal(1_000_000)
_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # no sign, no `_`
_EXACT = decimal.Context(prec=60, traps=[decimal.InvalidOperation, decimal.Overflow, decimal.Inexact])


class ListedPrice(Struct, frozen=True):
    """One listed model's rates, USD per million tokens (None: the list gives no rate)."""

    model: str
    input: Decimal
    output: Decimal
    cache_read: Decimal | None = None
    cache_write: Decimal | None = None
    reasoning: Decimal | None = None


class ModelList(Struct, frozen=True):
    priced: list[ListedPrice]
    unpriced: list[str]
    unreadable: list[tuple[str, str]]  # (model, why)


class _Entry(Struct):
    id: str
    pricing: dict[str, Any] | None = None


class _Listing(Struct):
    data: list[Any]


_decode_listing = msgspec.json.Decoder(_Listing | list[Any], float_hook=Decimal)


_decode_ids = msgspec.json.Decoder(_Listing | list[Any])


def plain_model(model: str) -> str:
    """A model name as a provider's list and the catalog are compared (the health probe's model
    list, `catalog import`): case aside, without a `models/` prefix."""
    return model.lower().removeprefix("models/")


def _decoded(decoder: msgspec.json.Decoder[Any], body: bytes, parse_float: Callable[[str], Any] = float) -> Any:
    """`body` decoded, or read as an answer is when msgspec refuses it (a leading byte-order mark, a
    byte that is no UTF-8, a lone surrogate escape: `providers.lenient_json`); the `DecodeError` when
    it is no JSON that way either. A list is one of those too: a probe that could not read it failed."""
    try:
        return decoder.decode(body)
    except msgspec.DecodeError:
        value = lenient_json(body, parse_float)
        if value is None:
            raise
        return msgspec.convert(scrubbed(value), decoder.type)


def listed_ids(body: bytes) -> frozenset[str]:
    """The ids a model list names (`{"data": [...]}` or a bare list; an entry without a string
    `id` is skipped, as `read_model_list` skips it); `msgspec.DecodeError` / `ValidationError` for
    a body that is no model list (the health probe's reading of fastrun's and primalabs' lists)."""
    listing = _decoded(_decode_ids, body)
    entries = listing.data if isinstance(listing, _Listing) else listing
    return frozenset(entry["id"] for entry in entries if isinstance(entry, dict) and isinstance(entry.get("id"), str))


def read_model_list(body: bytes) -> ModelList:
    """The list's rates; `msgspec.DecodeError` / `ValidationError` for a body that is no model list."""
    listing = _decoded(_decode_listing, body, Decimal)
    entries = listing.data if isinstance(listing, _Listing) else listing
    found = ModelList([], [], [])
    for index, raw in enumerate(entries):
        try:
            entry = msgspec.convert(raw, _Entry)
        except msgspec.ValidationError as exc:  # one odd entry does not reject the others
            found.unreadable.append((f"data[{index}]", str(exc)))
            continue
        try:
            price = _price(entry)
        except ValueError as exc:
            found.unreadable.append((entry.id, str(exc)))
            continue
        if price is None:
            found.unpriced.append(entry.id)
        else:
            found.priced.append(price)
    return found


def _price(entry: _Entry) -> ListedPrice | None:
    pricing = entry.pricing or {}
    names, factor = (PER_TOKEN, _MILLION) if "prompt" in pricing else (PER_MILLION, Decimal(1))
    rates = {bucket: _rate(pricing.get(key), factor, key) for bucket, key in names.items()}
    input_rate, output_rate = rates.pop("input"), rates.pop("output")
    if input_rate is None or output_rate is None:
        return None
    return ListedPrice(entry.id, input_rate, output_rate, **rates)


def _rate(value: Any, factor: Decimal, key: str) -> Decimal | None:
    """`value` per million tokens, exactly, within what a catalog price holds; ValueError saying why not."""
    if value is None or value == "":
        return None
    shown = f"{str(value)[:40]!r}"
    text = value.strip() if isinstance(value, str) else value
    plain = isinstance(text, Decimal | int) and not isinstance(text, bool)
    if not plain and not (isinstance(text, str) and _NUMBER.fullmatch(text)):  # Decimal() takes '1_5', '-0'
        raise ValueError(f"pricing.{key}: not a plain non-negative number: {shown}")
    try:
        with decimal.localcontext(_EXACT):
            number = Decimal(text)
            if number.is_signed() or not number.is_finite():
                raise ValueError(f"pricing.{key}: not a finite, non-negative number: {shown}")
            per_million = (number * factor).normalize()
    except decimal.DecimalException:  # more digits than can be kept exactly, or past any exponent
        raise ValueError(f"pricing.{key}: out of range: {shown}") from None
    if per_million >= MAX_RATE:
        raise ValueError(f"pricing.{key}: {shown} is more than a catalog price holds")
    if per_million.as_tuple().exponent < -SCALE:  # type: ignore[operator]
        raise ValueError(f"pricing.{key}: {per_million} per million is finer than {SCALE} decimal places")
    return per_million
