"""`switchyard catalog import`: a provider's listed prices (`GET /models`) read exactly in either
convention (`providers.model_prices`), compared with the catalog files' prices in effect, and
proposed as `[[prices]]` rows to review; appended to a catalog file, `catalog sync` makes them
effective-dated rows like any other edit (cost.md: "imported the same way, as a reviewed diff")."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest

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
        ("words", "pricing.input: not a number: 'cheap'"),
        ("negative", "pricing.prompt: not a finite, non-negative number: '-0.000001'"),
        ("too-fine", "pricing.prompt: 1E-11 per million is finer than 10 decimal places"),
    ]
    assert read_model_list(b'[{"id": "bare", "pricing": {"input": "1", "output": "2"}}]').priced[0].model == "bare"
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
        "unreadable: broken (pricing.prompt: not a number: 'free')\n"
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
