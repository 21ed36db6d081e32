"""Catalog TOML files: parsing, exact money, and error messages that name the file and the key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from catalog.files import (
    CatalogFileError,
    DeploymentSpec,
    ModelSpec,
    PriceSpec,
    default_catalog_path,
    load_catalog,
)

MODEL = """
[models."m-1"]
aliases = ["m"]
context_window = 8192
max_output = 1024
capabilities = ["tools"]
"""


def write(base: Path, name: str, text: str) -> Path:
    path = base / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def error_of(base: Path, text: str, name: str = "catalog/models.toml") -> str:
    write(base, name, text)
    with pytest.raises(CatalogFileError) as caught:
        load_catalog(["catalog/*.toml"], base)
    return caught.value.message


def price(model: str = "m-1", **amounts: str) -> str:
    lines = [f'{key} = "{value}"' for key, value in {"input": "1", "output": "2", **amounts}.items()]
    return f'\n[[prices]]\nprovider = "p"\nmodel = "{model}"\neffective_from = 2026-01-01\n' + "\n".join(lines)


def test_parses_models_deployments_and_exact_prices(tmp_path: Path) -> None:
    text = MODEL + 'default = true\n[[models."m-1".deployments]]\nprovider = "p"\nupstream_model = "up/m"\n'
    text += price(cache_read="0.025", reasoning="0.0000000001")
    write(tmp_path, "catalog/models.toml", text)
    catalog = load_catalog(["catalog/*.toml"], tmp_path)
    assert catalog.models == (
        ModelSpec(
            id="m-1",
            context_window=8192,
            max_output=1024,
            aliases=("m",),
            capabilities=frozenset({"tools"}),
            default=True,
            deployments=(DeploymentSpec(provider="p", upstream_model="up/m", priority=0),),
        ),
    )
    assert catalog.prices == (
        PriceSpec(
            provider="p",
            model="m-1",
            effective_from=datetime(2026, 1, 1, tzinfo=UTC),
            input=Decimal("1"),
            output=Decimal("2"),
            cache_read=Decimal("0.025"),
            reasoning=Decimal("0.0000000001"),
        ),
    )


def test_effective_from_datetimes_become_utc(tmp_path: Path) -> None:
    text = MODEL
    for moment in ("2026-03-01T12:00:00+02:00", "2026-03-02T08:30:00", "2026-03-03"):
        text += f'\n[[prices]]\nprovider = "p"\nmodel = "m-1"\neffective_from = {moment}\ninput = "1"\noutput = "1"\n'
    write(tmp_path, "catalog/a.toml", text)
    starts = [p.effective_from for p in load_catalog(["catalog/*.toml"], tmp_path).prices]
    assert starts == [
        datetime(2026, 3, 1, 10, 0, tzinfo=UTC),
        datetime(2026, 3, 2, 8, 30, tzinfo=UTC),
        datetime(2026, 3, 3, tzinfo=UTC),
    ]
    assert all(start.tzinfo is UTC for start in starts)
    assert starts[0] == datetime(2026, 3, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))


def test_float_money_is_refused_naming_the_key(tmp_path: Path) -> None:
    text = MODEL + price() + price() + '\n[[prices]]\nprovider = "q"\nmodel = "m-1"\n'
    text += 'effective_from = 2026-01-01\ninput = 0.10\noutput = "1"\n'
    assert error_of(tmp_path, text) == (
        'catalog/models.toml: prices[2].input: money is written as a string, e.g. "0.10" (a float is not exact)'
    )


@pytest.mark.parametrize(
    ("amount", "message"),
    [
        ("abc", "not a decimal number: 'abc'"),
        ("-0.5", "must be a finite, non-negative decimal, got '-0.5'"),
        ("NaN", "must be a finite, non-negative decimal, got 'NaN'"),
        ("0.00000000001", "at most 10 decimal places, got '0.00000000001'"),
        ("12345678901", "too large: '12345678901'"),
    ],
)
def test_bad_amounts_name_the_key(tmp_path: Path, amount: str, message: str) -> None:
    text = MODEL + price(cache_write=amount)
    assert error_of(tmp_path, text) == f"catalog/models.toml: prices[0].cache_write: {message}"


def test_missing_output_price_is_an_error(tmp_path: Path) -> None:
    text = MODEL + '\n[[prices]]\nprovider = "p"\nmodel = "m-1"\neffective_from = 2026-01-01\ninput = "1"\n'
    assert error_of(tmp_path, text) == "catalog/models.toml: prices[0]: Object missing required field `output`"


def test_effective_from_must_be_a_date(tmp_path: Path) -> None:
    text = MODEL + '\n[[prices]]\nprovider = "p"\nmodel = "m-1"\neffective_from = "2026-01-01"\n'
    text += 'input = "1"\noutput = "1"\n'
    assert error_of(tmp_path, text) == (
        "catalog/models.toml: prices[0].effective_from: expected a TOML date or datetime, got str"
    )


def test_an_effective_from_out_of_range_in_utc_names_the_key(tmp_path: Path) -> None:
    text = MODEL + '\n[[prices]]\nprovider = "p"\nmodel = "m-1"\neffective_from = 9999-12-31T23:59:59-01:00\n'
    text += 'input = "1"\noutput = "1"\n'
    assert error_of(tmp_path, text) == (
        "catalog/models.toml: prices[0].effective_from: out of range: 9999-12-31T23:59:59-01:00"
    )


def test_a_count_past_a_32_bit_integer_names_the_key(tmp_path: Path) -> None:
    text = MODEL.replace("context_window = 8192", "context_window = 9223372036854775808")
    assert error_of(tmp_path, text) == (
        'catalog/models.toml: models."m-1".context_window: Expected `int` <= 2147483647'
    )


@pytest.mark.parametrize("pattern", ["", ".", "**a"])
def test_a_pattern_pathlib_refuses_names_the_key(tmp_path: Path, pattern: str) -> None:
    with pytest.raises(CatalogFileError) as caught:
        load_catalog([pattern], tmp_path)
    assert caught.value.message == f"catalog.files: {pattern!r} is not a file name or glob pattern"


def test_price_for_an_unknown_model(tmp_path: Path) -> None:
    assert error_of(tmp_path, MODEL + price(model="m")) == (
        'catalog/models.toml: prices[0].model: unknown model "m" (use the model id)'
    )


def test_duplicate_price_key(tmp_path: Path) -> None:
    message = error_of(tmp_path, MODEL + price() + price())
    assert message == (
        "catalog/models.toml: prices[1]: a price for (p, m-1) from 2026-01-01T00:00:00+00:00 is already "
        "given at catalog/models.toml: prices[0]"
    )


def test_alias_colliding_with_a_model_id(tmp_path: Path) -> None:
    text = MODEL + "\n[models.m]\ncontext_window = 1\nmax_output = 1\n"
    assert error_of(tmp_path, text) == 'catalog/models.toml: models."m-1".aliases[0]: "m" is a model id'


def test_alias_used_twice(tmp_path: Path) -> None:
    text = MODEL + '\n[models.other]\naliases = ["x", "m"]\ncontext_window = 1\nmax_output = 1\n'
    assert error_of(tmp_path, text) == (
        'catalog/models.toml: models."other".aliases[1]: "m" is already an alias of "m-1"'
    )


def test_unknown_capability(tmp_path: Path) -> None:
    text = '[models.x]\ncontext_window = 1\nmax_output = 1\ncapabilities = ["tools", "telepathy"]\n'
    assert error_of(tmp_path, text) == (
        "catalog/models.toml: models.\"x\".capabilities[1]: Invalid enum value 'telepathy'"
    )


def test_unknown_and_missing_model_keys(tmp_path: Path) -> None:
    text = "[models.x]\ncontext_window = 1\nmax_output = 1\ncontxt = 5\n"
    assert error_of(tmp_path, text) == 'catalog/models.toml: models."x": Object contains unknown field `contxt`'
    text = "[models.x]\nmax_output = 1\n"
    assert error_of(tmp_path, text) == (
        'catalog/models.toml: models."x": Object missing required field `context_window`'
    )
    text = "[models.x]\ncontext_window = 0\nmax_output = 1\n"
    assert error_of(tmp_path, text) == 'catalog/models.toml: models."x".context_window: Expected `int` >= 1'


def test_duplicate_deployment(tmp_path: Path) -> None:
    deployment = '\n[[models."m-1".deployments]]\nprovider = "p"\nupstream_model = "u"\npriority = {}\n'
    text = MODEL + deployment.format(1) + deployment.format(2)
    assert error_of(tmp_path, text) == (
        'catalog/models.toml: models."m-1".deployments[1]: provider "p" already serves this model as "u"'
    )


def test_invalid_toml(tmp_path: Path) -> None:
    assert error_of(tmp_path, "[models.x\n").startswith("catalog/models.toml: invalid TOML: ")


def test_files_merge_and_cross_reference(tmp_path: Path) -> None:
    write(tmp_path, "catalog/a.toml", MODEL)
    write(tmp_path, "catalog/b.toml", price())
    write(tmp_path, "extra/c.toml", "[models.z]\ncontext_window = 1\nmax_output = 1\n")
    catalog = load_catalog(["catalog/*.toml", "extra/*.toml", "catalog/a.toml"], tmp_path)
    assert [model.id for model in catalog.models] == ["m-1", "z"]
    assert [p.model for p in catalog.prices] == ["m-1"]


def test_model_defined_in_two_files(tmp_path: Path) -> None:
    write(tmp_path, "catalog/a.toml", MODEL)
    assert error_of(tmp_path, MODEL.replace('"m"', '"n"'), name="catalog/b.toml") == (
        'catalog/b.toml: models."m-1": also defined in catalog/a.toml'
    )


def test_pattern_matching_nothing(tmp_path: Path) -> None:
    with pytest.raises(CatalogFileError) as caught:
        load_catalog(["catalog/*.toml"], tmp_path)
    assert caught.value.message == f"catalog.files: 'catalog/*.toml' matches no file under {tmp_path}"


@pytest.mark.parametrize("text", ["", "# prices come later\n"])
def test_files_that_define_no_model_are_refused(tmp_path: Path, text: str) -> None:
    """Synced, they removed every model (`models_removed: 5`), and every request was an unknown model."""
    write(tmp_path, "catalog/empty.toml", text)
    with pytest.raises(CatalogFileError) as caught:
        load_catalog(["catalog/*.toml"], tmp_path)
    message = "catalog.files: catalog/empty.toml define no model: a sync would empty the catalog"
    assert caught.value.message == message


def test_absolute_pattern(tmp_path: Path) -> None:
    write(tmp_path, "x/models.toml", MODEL)
    catalog = load_catalog([str(tmp_path / "x" / "*.toml")], Path("/nonexistent"))
    assert [model.id for model in catalog.models] == ["m-1"]


def test_the_shipped_catalog_is_valid() -> None:
    catalog = load_catalog([str(default_catalog_path())], default_catalog_path().parent)
    by_id = {model.id: model for model in catalog.models}
    assert set(by_id) == {"gemma-4-31b", "qwen3-8b", "llama-3.3-70b", "qwen2.5-vl-72b", "mock-model"}
    gemma = by_id["gemma-4-31b"]
    assert gemma.default
    assert "gemma" in gemma.aliases
    assert [(d.provider, d.upstream_model, d.priority) for d in gemma.deployments] == [
        ("local", "google/gemma-4-31b-it", 100),
        ("fastrun", "google/gemma-4-31b-it", 50),
    ]
    assert "vision" in by_id["qwen2.5-vl-72b"].capabilities
    local = [p for p in catalog.prices if p.provider == "local"]
    assert {p.model for p in local} == {"gemma-4-31b", "qwen3-8b"}
    assert all(p.input == 0 and p.output == 0 for p in local)
    assert {(p.provider, p.model) for p in catalog.prices} >= {("mock", "mock-model"), ("fastrun", "gemma-4-31b")}


def test_no_patterns_is_the_bundled_catalog_read_as_a_package_resource(tmp_path: Path) -> None:
    bundled = load_catalog(None, tmp_path)  # `[catalog] files` absent; nothing under tmp_path
    assert bundled == load_catalog([str(default_catalog_path())], default_catalog_path().parent)
    assert "mock-model" in {model.id for model in bundled.models}
