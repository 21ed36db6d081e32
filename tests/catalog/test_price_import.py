"""`switchyard catalog import`: a provider's listed prices (`GET /models`) read exactly in either
convention (`providers.model_prices`), compared with the catalog files' prices in effect, and
proposed as `[[prices]]` rows to review; appended to a catalog file, `catalog sync` makes them
effective-dated rows like any other edit (cost.md: "imported the same way, as a reviewed diff")."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest

from app import cli_price_import
from app.cli_price_import import Collision, propose, toml_rows
from app.settings import settings_from_mapping
from catalog.files import parse_catalog, validate_catalog
from devtools.mock_http import Reply
from providers.model_prices import ListedPrice, read_model_list
from tests.support.cli import cli_env, query, run_cli, write_config
from tests.support.upstream import ReplayUpstream, reply_json

WHEN = "2026-12-06T12:00:00Z"


def listing(*entries: dict[str, Any]) -> bytes:
    return msgspec.json.encode({"object": "list", "data": list(entries)})


def test_both_conventions_are_read_exactly() -> None:
    body = (
        b'{"data": ['
        b'{"id": "per-token", "pricing": {"prompt": "0.0000003", "completion": 0.0000012, "input_cache_read": "3e-8"}},'
        b'{"id": "per-million", "pricing": {"input": 1, "output": 2.5, "cache_write": "0.3125", "reasoning": "4"}},'
        b'{"id": "no-pricing"},'
        b'{"id": "half", "pricing": {"input": "1"}},'
        b'{"id": "words", "pricing": {"input": "cheap", "output": "1"}},'
        b'{"id": "negative", "pricing": {"prompt": "-0.000001", "completion": "0"}},'
        b'{"id": "too-fine", "pricing": {"prompt": "0.00000000000000001", "completion": "0"}}'
        b"]}"
    )
    found = read_model_list(body)
    assert found.priced == [
        ListedPrice("per-token", Decimal("0.3"), Decimal("1.2"), cache_read=Decimal("0.03")),
        ListedPrice("per-million", Decimal(1), Decimal("2.5"), cache_write=Decimal("0.3125"), reasoning=Decimal(4)),
    ]
    assert found.unpriced == ["no-pricing", "half"]
    assert found.unreadable == [
        ("words", "pricing.input: not a plain non-negative number: 'cheap'"),
        ("negative", "pricing.prompt: not a plain non-negative number: '-0.000001'"),
        ("too-fine", "pricing.prompt: 1E-11 per million is finer than 10 decimal places"),
    ]
    assert read_model_list(b'[{"id": "bare", "pricing": {"input": "1", "output": "2"}}]').priced[0].model == "bare"


def test_rates_a_catalog_price_cannot_hold_and_odd_entries_are_unreadable_not_fatal() -> None:
    """Sync refused `1e20` (NUMERIC(20, 10)); `1e1000000` aborted the whole import (decimal
    Overflow); a 33-digit rate was rounded to 28 digits, now kept exactly and refused for its
    places; `1_5` was 15; one `null` entry rejected the whole list."""
    body = (
        b'{"data": [null, {"object": "model"},'
        b'{"id": "big", "pricing": {"input": "1e20", "output": "1"}},'
        b'{"id": "huge", "pricing": {"input": 1e1000000, "output": 1}},'
        b'{"id": "digits", "pricing": {"prompt": "0.123456789012345678901234567890123", "completion": "0"}},'
        b'{"id": "underscore", "pricing": {"input": "1_5", "output": "1"}},'
        b'{"id": "minus-zero", "pricing": {"input": "-0", "output": "1"}},'
        b'{"id": "ok", "pricing": {"input": "9999999999.9999999999", "output": 0}}'
        b"]}"
    )
    found = read_model_list(body)
    assert found.priced == [ListedPrice("ok", Decimal("9999999999.9999999999"), Decimal(0))]
    assert found.unreadable == [
        ("data[0]", "Expected `object`, got `null`"),
        ("data[1]", "Object missing required field `id`"),
        ("big", "pricing.input: '1e20' is more than a catalog price holds"),
        ("huge", "pricing.input: out of range: '1E+1000000'"),
        ("digits", "pricing.prompt: 123456.789012345678901234567890123 per million is finer than 10 decimal places"),
        ("underscore", "pricing.input: not a plain non-negative number: '1_5'"),
        ("minus-zero", "pricing.input: not a plain non-negative number: '-0'"),
    ]


CATALOG_TEXT = """
[models."m-1"]
context_window = 1000
max_output = 100
deployments = [{provider = "p", upstream_model = "up-a"}, {provider = "p", upstream_model = "up-b"}]

[models."m-2"]
context_window = 1000
max_output = 100
deployments = [{provider = "p", upstream_model = "up-c"}]

[models."rocket\U0001f680"]
context_window = 1000
max_output = 100
deployments = [{provider = "p", upstream_model = "up-r"}]

[[prices]]
provider = "p"
model = "m-2"
effective_from = 2026-01-01T00:00:00Z
input = "1"
output = "2"
cache_read = "0.1"
"""


def test_proposals_keep_unlisted_buckets_refuse_conflicts_and_write_valid_toml() -> None:
    """A model listed at two prices (two upstream models, or one id twice) got two rows at one
    instant, which sync refused; an unlisted cache-read rate was proposed as none; an emoji in a
    model id and a year before 1000 made TOML the file could not hold."""
    catalog = validate_catalog([("c.toml", parse_catalog(CATALOG_TEXT, "c.toml"))])
    listed = read_model_list(
        listing(
            {"id": "up-a", "pricing": {"input": "1", "output": "1"}},
            {"id": "up-b", "pricing": {"input": "2", "output": "2"}},
            {"id": "up-c", "pricing": {"input": "1.5", "output": "2"}},
            {"id": "up-c", "pricing": {"input": "1.5", "output": "2"}},  # listed twice, alike: one row
            {"id": "up-r", "pricing": {"input": "3", "output": "4"}},
        )
    )
    when = datetime(2026, 12, 6, 12, tzinfo=UTC)
    rows, summary = propose(catalog, "p", listed, when)
    assert summary == [
        "p: 1 changed, 1 new, 0 unchanged",
        "! m-1: listed at 2 different prices (up-a, up-b): no row",
        "~ m-2 (up-c): input 1 -> 1.5",
        "+ rocket\U0001f680 (up-r): input 3, output 4",
    ]
    assert [(row.model, row.input, row.cache_read) for row in rows] == [
        ("m-2", Decimal("1.5"), Decimal("0.1")),  # the cache-read rate the list does not give is kept
        ("rocket\U0001f680", Decimal(3), None),
    ]
    early = datetime(999, 1, 1, tzinfo=UTC)
    text = toml_rows("p", [msgspec.structs.replace(row, effective_from=early) for row in rows], early)
    merged = validate_catalog([("c.toml", parse_catalog(CATALOG_TEXT + text, "c.toml"))])
    assert [(p.model, p.effective_from.year, p.input) for p in merged.prices[1:]] == [
        ("m-2", 999, Decimal("1.5")),
        ("rocket\U0001f680", 999, Decimal(3)),
    ]
    with pytest.raises(Collision):  # the files price m-2 from that very instant already
        propose(catalog, "p", listed, datetime(2026, 1, 1, tzinfo=UTC))


def test_a_list_naming_models_in_another_case_or_with_models_prefix_is_matched_as_the_probe_matches_it() -> None:
    """The health probe compares a list's ids with the catalog's case aside and without a
    `models/` prefix; import compared them exactly, so such a list proposed nothing and called
    every model unmatched. What stays unmatched is named as each side spells it."""
    catalog = validate_catalog([("c.toml", parse_catalog(CATALOG_TEXT, "c.toml"))])
    listed = read_model_list(
        listing(
            {"id": "models/UP-C", "pricing": {"input": "1.5", "output": "2"}},
            {"id": "Up-R", "pricing": {"input": "3", "output": "4"}},
            {"id": "Other-Model", "pricing": {"input": "1", "output": "1"}},
        )
    )
    rows, summary = propose(catalog, "p", listed, datetime(2026, 12, 6, 12, tzinfo=UTC))
    assert summary == [
        "p: 1 changed, 1 new, 0 unchanged",
        "~ m-2 (models/UP-C): input 1 -> 1.5",
        "+ rocket\U0001f680 (Up-R): input 3, output 4",
        "not in the catalog here (listed with prices, no catalog model deployed on them): Other-Model",
        "no price listed for (their catalog prices stay): up-a, up-b",
    ]
    assert [(row.model, row.input) for row in rows] == [("m-2", Decimal("1.5")), ("rocket\U0001f680", Decimal(3))]


async def test_a_list_that_trickles_past_the_limit_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's 10 s bound each read: a provider sending a byte every 0.5 s kept it forever."""
    monkeypatch.setattr(cli_price_import, "LIST_TIMEOUT_S", 0.5)
    async with ReplayUpstream() as upstream:
        chunks = [b'{"data": [', *[b" "] * 20, b"]}"]
        upstream.enqueue(Reply(chunks=chunks, chunk_delay_s=0.1, chunked=True), path="/v1/models")
        settings = settings_from_mapping(
            {"providers": {"p": {"kind": "local", "base_url": upstream.url}}}, base_dir=Path("."), source="t"
        )
        began = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await cli_price_import._fetch(settings, "p")
        assert asyncio.get_running_loop().time() - began < 1.5
    with pytest.raises(msgspec.ValidationError):
        read_model_list(b'{"models": []}')


async def test_import_proposes_the_changed_and_new_prices_and_sync_makes_them_rows(tmp_path: Path) -> None:
    async with ReplayUpstream() as upstream:
        config = write_config(tmp_path, upstream_port=upstream.port)
        assert run_cli(tmp_path, "catalog", "sync", "--config", str(config)).returncode == 0
        # the catalog: tiny on local (1.5 / 3), hosted-model on hosted as hosted-upstream (0.25 / 0.75)
        answer = listing(
            {"id": "hosted-upstream", "pricing": {"prompt": "0.0000003", "completion": "0.0000012"}},
            {"id": "elsewhere", "pricing": {"prompt": "0.000001", "completion": "0.000002"}},
            {"id": "broken", "pricing": {"prompt": "free", "completion": "0"}},
        )
        upstream.enqueue(reply_json(200, msgspec.json.decode(answer)), repeat=3, path="/v1/models")
        env = cli_env(SWITCHYARD_TEST_HOSTED_KEY="hk-secret")
        args = ["catalog", "import", "hosted", "--effective-from", WHEN, "--config", str(config)]
        proposed = await asyncio.to_thread(run_cli, tmp_path, *args, env=env)
        astray = await asyncio.to_thread(run_cli, tmp_path, *args, "--write", "extra.toml", env=env)
        written = await asyncio.to_thread(run_cli, tmp_path, *args, "--write", "models.toml", env=env)
        sent = upstream.requests  # a reply queued for the path: recorded as a request
    assert proposed.returncode == 0, proposed.stderr
    rows = (
        "\n# from hosted's /models at 2026-12-06T12:00:00Z (`switchyard catalog import`): review, then `catalog sync`\n"
        '\n[[prices]]\nprovider = "hosted"\nmodel = "hosted-model"\neffective_from = 2026-12-06T12:00:00Z\n'
        'input = "0.3"\noutput = "1.2"\n'
    )
    assert proposed.stdout == rows
    assert proposed.stderr == (
        "hosted: 1 changed, 0 new, 0 unchanged\n"
        "~ hosted-model (hosted-upstream): input 0.25 -> 0.3, output 0.75 -> 1.2\n"
        "not in the catalog here (listed with prices, no catalog model deployed on them): elsewhere\n"
        "unreadable: broken (pricing.prompt: not a plain non-negative number: 'free')\n"
    )
    assert [(r.method, r.path, r.headers["authorization"]) for r in sent] == [
        ("GET", "/v1/models", "Bearer hk-secret")
    ] * 3
    assert (written.returncode, written.stdout) == (0, "")
    assert written.stderr.endswith("switchyard: appended to models.toml\n")  # a catalog file: no warning
    assert (tmp_path / "models.toml").read_text().endswith(rows)
    warning = "switchyard: warning: extra.toml is not among [catalog] files: `catalog sync` will not read it\n"
    assert (astray.returncode, astray.stderr.endswith(warning), (tmp_path / "extra.toml").read_text()) == (
        0,
        True,
        rows,
    )

    synced = run_cli(tmp_path, "catalog", "sync", "--config", str(config))
    assert synced.returncode == 0, synced.stderr
    assert '"prices_added":1,"prices_unchanged":2' in synced.stdout.replace(" ", "")
    prices = query(
        tmp_path / "switchyard.db",
        "SELECT effective_from, input, output FROM prices"
        " WHERE provider = 'hosted' AND model_id = 'hosted-model' ORDER BY effective_from",
    )
    assert [(Decimal(str(i)), Decimal(str(o))) for _, i, o in prices] == [
        (Decimal("0.25"), Decimal("0.75")),
        (Decimal("0.3"), Decimal("1.2")),
    ]
    assert str(prices[-1][0]).startswith("2026-12-06 12:00:00")


async def test_unchanged_prices_propose_nothing(tmp_path: Path) -> None:
    async with ReplayUpstream() as upstream:
        config = write_config(tmp_path, upstream_port=upstream.port)
        body = listing({"id": "tiny-upstream", "pricing": {"input": "1.50", "output": 3}})
        upstream.enqueue(reply_json(200, msgspec.json.decode(body)), path="/v1/models")
        args = ["catalog", "import", "local", "--effective-from", WHEN, "--config", str(config)]
        result = await asyncio.to_thread(run_cli, tmp_path, *args)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "local: 0 changed, 0 new, 1 unchanged\n")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("nosuch",), 2, "switchyard: 'nosuch': no such provider in the config\n"),
        (
            ("local", "--effective-from", "soon"),
            2,
            "switchyard: --effective-from: 'soon' is not an ISO 8601 date-time\n",
        ),
        (("hosted",), 1, "switchyard: providers.hosted: key variable SWITCHYARD_TEST_HOSTED_KEY is unset\n"),
        (("local",), 1, "switchyard: cannot reach local: ConnectionRefusedError\n"),
    ],
)
def test_bad_usage_and_an_unreachable_provider(tmp_path: Path, args: tuple[str, ...], code: int, message: str) -> None:
    config = write_config(tmp_path)  # providers at port 9: nothing listens
    result = run_cli(tmp_path, "catalog", "import", *args, "--config", str(config))
    assert (result.returncode, result.stdout, result.stderr) == (code, "", message)
