"""`JSONPrefix`: which tool-argument fragments the Anthropic door may still stream (RFC 8259)."""

from __future__ import annotations

import json
import random

import pytest

from app.edge.json_prefix import JSONPrefix


def _document(rng: random.Random, depth: int = 0) -> object:
    roll = rng.random()
    if depth > 3 or roll < 0.3:
        return rng.choice(
            [0, -1, 1.5, -2.25e-7, 1e300, True, False, None, "x", 'é\n\t"\\/\u0001', "\U0001f600", 10**20]
        )
    if roll < 0.6:
        return [_document(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{rng.randint(0, 99)}é": _document(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def test_every_json_object_streams_whole_in_any_fragments() -> None:
    rng = random.Random(7)  # noqa: S311 - reproducible test data, not secrets
    for _ in range(2000):
        text = json.dumps(
            {"k": _document(rng)},
            ensure_ascii=rng.random() < 0.5,
            indent=rng.choice([None, 1]),
            separators=rng.choice([None, (",", ":")]),
        )
        prefix, sent, at = JSONPrefix(), "", 0
        while at < len(text):
            size = rng.randint(1, 6)
            taken = prefix.take(text[at : at + size])
            assert taken is not None, (text, at)
            sent, at = sent + taken, at + size
        assert sent == text
        assert prefix.take(" \n") == " \n"
        assert prefix.take("x") is None  # nothing but blanks after the object


@pytest.mark.parametrize(
    ("fragments", "taken"),
    [
        (["  ", "\n{", '"a": 1}'], ["", "  \n{", '"a": 1}']),  # blanks held until the object opens
        ([" ", "[1]"], ["", None]),
        (['"x"'], [None]),
        (["{'q': 1}"], [None]),
        (['{"a": 1', ",}"], ['{"a": 1', None]),
        (['{"a": ', "True}"], ['{"a": ', None]),
        (['{"a": 0', "1}"], ['{"a": 0', None]),
        (['{"a": "x', "\ny", '"}'], ['{"a": "x', None, None]),  # and nothing after the break
        (['{"a": "\\', "x"], ['{"a": "\\', None]),
        (['{"a": "\\u12', "g4"], ['{"a": "\\u12', None]),
        (['{"a": 1.', "}"], ['{"a": 1.', None]),
        (['{"a": 1e', "+}"], ['{"a": 1e', None]),
        (['{"a": -', "x"], ['{"a": -', None]),
        (['{"a": tr', "ux"], ['{"a": tr', None]),
        (['{"a": [1, ', "]}"], ['{"a": [1, ', None]),
        (['{"a" ', "1}"], ['{"a" ', None]),
        (['{"a": 1 ', '"b": 2}'], ['{"a": 1 ', None]),
        (['{"a": 1]'], [None]),
        (['{"a": 1}', "}"], ['{"a": 1}', None]),
        # a surrogate escape is half of a pair, high then low, or jiter refuses the document
        (['{"a": "\\ud83d', '\\ude00"}'], ['{"a": "\\ud83d', '\\ude00"}']),
        (['{"a": "\\ud800', '"}'], ['{"a": "\\ud800', None]),
        (['{"a": "\\ud83d', "\\u0041"], ['{"a": "\\ud83d', None]),
        (['{"a": "\\ud83d', "\\ud83d"], ['{"a": "\\ud83d', None]),
        (['{"a": "\\udc00"}'], [None]),
        (['{"a": [1e-5, -0.0, 2E+3, {}]', ', "b": null}'], ['{"a": [1e-5, -0.0, 2E+3, {}]', ', "b": null}']),
    ],
)
def test_fragments_after_the_first_that_breaks_the_grammar_are_refused(
    fragments: list[str], taken: list[str | None]
) -> None:
    prefix = JSONPrefix()
    assert [prefix.take(fragment) for fragment in fragments] == taken
