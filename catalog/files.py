"""Catalog TOML files: read, validate and merge them into one `CatalogFile`.

The files are reviewed by people, so every error names the file and the key path the reviewer
must fix (`catalog/models.toml: prices[2].input: ...`). Money is written as strings and becomes
`Decimal`; a float is refused because `0.1` in TOML is already not one tenth. A price must fit the
`prices` columns exactly (at most 10 decimal places): a value the database would round could never
compare equal on the next sync, and every sync would add a row.
"""

from __future__ import annotations

import json
import tomllib
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, time
from decimal import Decimal, InvalidOperation
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct

from catalog.tables import PRICE_PRECISION, PRICE_SCALE

# `completions`: the model's deployments take raw prompts on `/completions` (POST /v1/completions)
Capability = Literal["tools", "vision", "reasoning", "structured_output", "audio", "documents", "completions"]
MONEY_KEYS = ("input", "output", "cache_read", "cache_write", "reasoning")

_T = TypeVar("_T")

INT32 = 2**31 - 1  # the columns are INTEGER: a 32-bit integer on PostgreSQL
PositiveInt = Annotated[int, Meta(gt=0, le=INT32)]
Name = Annotated[str, Meta(min_length=1, max_length=200)]
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def control(char: str) -> bool:
    """What no stored name holds (a catalog name, a key's name and owner): C0/C1 controls and lone
    surrogates (a NUL PostgreSQL's text refuses: a sync, a start-up, failed on a database error
    naming no key, where SQLite took it); line and paragraph separators (a new line in a table);
    the bidirectional embeddings, overrides and isolates, which reorder the columns of `keys list`
    and `usage` around them (the joiners a script or an emoji needs are kept). The report's filters
    refuse the controls too (`catalog.usage_query`)."""
    return unicodedata.category(char) in ("Cc", "Cs", "Zl", "Zp") or char in _BIDI


class CatalogFileError(Exception):
    """A catalog file that cannot be used; the message names the file and the key."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DeploymentSpec(Struct, frozen=True, forbid_unknown_fields=True):
    provider: Name
    upstream_model: Name
    priority: Annotated[int, Meta(ge=-INT32 - 1, le=INT32)] = 0


class ModelSpec(Struct, frozen=True):
    id: str
    context_window: int
    max_output: int
    aliases: tuple[str, ...] = ()
    capabilities: frozenset[str] = frozenset()
    default: bool = False
    deployments: tuple[DeploymentSpec, ...] = ()


class PriceSpec(Struct, frozen=True):
    """USD per million tokens from `effective_from` (aware, UTC) on; None = no rate for the bucket."""

    provider: str
    model: str
    effective_from: datetime
    input: Decimal | None = None
    output: Decimal | None = None
    cache_read: Decimal | None = None
    cache_write: Decimal | None = None
    reasoning: Decimal | None = None


class CatalogFile(Struct, frozen=True):
    models: tuple[ModelSpec, ...] = ()
    prices: tuple[PriceSpec, ...] = ()


class _RawModel(Struct, forbid_unknown_fields=True):
    context_window: PositiveInt
    max_output: PositiveInt
    aliases: list[Name] = []
    capabilities: list[Capability] = []
    default: bool = False
    deployments: list[DeploymentSpec] = []


class _RawPrice(Struct, forbid_unknown_fields=True):
    provider: Name
    model: Name
    effective_from: Any  # a TOML date or datetime; checked by `_effective_from`
    input: str
    output: str
    cache_read: str | None = None
    cache_write: str | None = None
    reasoning: str | None = None


class _RawFile(Struct, forbid_unknown_fields=True):
    models: dict[str, dict[str, Any]] = {}
    prices: list[dict[str, Any]] = []


def _convert(value: object, kind: type[_T], where: str, path: str) -> _T:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        text = str(exc)
        message, _, at = text.partition(" - at `$")
        key = path + at.rstrip("`") if at else path
        last = key.rsplit(".", 1)[-1]
        if last in MONEY_KEYS and "got `float`" in message:
            message = 'money is written as a string, e.g. "0.10" (a float is not exact)'
        raise CatalogFileError(f"{where}: {key.lstrip('.') or '$'}: {message}") from None


def _money(text: str | None, where: str) -> Decimal | None:
    if text is None:
        return None
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise CatalogFileError(f"{where}: not a decimal number: {text!r}") from None
    if not value.is_finite() or value < 0:
        raise CatalogFileError(f"{where}: must be a finite, non-negative decimal, got {text!r}")
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -PRICE_SCALE:
        raise CatalogFileError(f"{where}: at most {PRICE_SCALE} decimal places, got {text!r}")
    if value.adjusted() >= PRICE_PRECISION - PRICE_SCALE:
        raise CatalogFileError(f"{where}: too large: {text!r}")
    return value


def _effective_from(value: object, where: str) -> datetime:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        try:
            return value.astimezone(UTC)
        except OverflowError:  # the offset moves it out of the years 1 to 9999
            raise CatalogFileError(f"{where}: out of range: {value.isoformat()}") from None
    if isinstance(value, date):
        return datetime.combine(value, time(0), tzinfo=UTC)
    raise CatalogFileError(f"{where}: expected a TOML date or datetime, got {type(value).__name__}")


def _parse_model(model_id: str, raw: dict[str, Any], where: str) -> ModelSpec:
    path = f"models.{json.dumps(model_id, ensure_ascii=not model_id.isprintable())}"  # a control shown escaped
    if not model_id or len(model_id) > 200:
        raise CatalogFileError(f"{where}: {path}: a model id has 1 to 200 characters")
    _plain(model_id, f"{where}: {path}")
    spec = _convert(raw, _RawModel, where, path)
    for index, alias in enumerate(spec.aliases):
        _plain(alias, f"{where}: {path}.aliases[{index}]")
    for index, deployment in enumerate(spec.deployments):
        _plain(deployment.provider, f"{where}: {path}.deployments[{index}].provider")
        _plain(deployment.upstream_model, f"{where}: {path}.deployments[{index}].upstream_model")
    return ModelSpec(
        id=model_id,
        context_window=spec.context_window,
        max_output=spec.max_output,
        aliases=tuple(spec.aliases),
        capabilities=frozenset(spec.capabilities),
        default=spec.default,
        deployments=tuple(spec.deployments),
    )


def _plain(name: str, where: str) -> None:
    if any(control(char) for char in name):
        raise CatalogFileError(f"{where}: must not hold a control character")


def _parse_price(index: int, raw: dict[str, Any], where: str) -> PriceSpec:
    path = f"prices[{index}]"
    spec = _convert(raw, _RawPrice, where, path)
    _plain(spec.provider, f"{where}: {path}.provider")
    _plain(spec.model, f"{where}: {path}.model")
    amounts = {key: _money(getattr(spec, key), f"{where}: {path}.{key}") for key in MONEY_KEYS}
    return PriceSpec(
        provider=spec.provider,
        model=spec.model,
        effective_from=_effective_from(spec.effective_from, f"{where}: {path}.effective_from"),
        **amounts,
    )


def parse_catalog(text: str, where: str) -> CatalogFile:
    """One file's text, parsed but not yet cross-checked (see `validate_catalog`)."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogFileError(f"{where}: invalid TOML: {exc}") from None
    raw = _convert(document, _RawFile, where, "")
    models = tuple(_parse_model(model_id, body, where) for model_id, body in raw.models.items())
    prices = tuple(_parse_price(index, body, where) for index, body in enumerate(raw.prices))
    return CatalogFile(models=models, prices=prices)


def _check_models(parts: Sequence[tuple[str, CatalogFile]]) -> dict[str, str]:
    """Model ids and aliases are one namespace; returns every model id with the file defining it."""
    origin: dict[str, str] = {}
    for where, part in parts:
        for model in part.models:
            if model.id in origin:
                raise CatalogFileError(f'{where}: models."{model.id}": also defined in {origin[model.id]}')
            origin[model.id] = where
    owner: dict[str, str] = {}
    for where, part in parts:
        for model in part.models:
            for index, alias in enumerate(model.aliases):
                path = f'{where}: models."{model.id}".aliases[{index}]'
                if alias in origin:
                    raise CatalogFileError(f'{path}: "{alias}" is a model id')
                if alias in owner:
                    raise CatalogFileError(f'{path}: "{alias}" is already an alias of "{owner[alias]}"')
                owner[alias] = model.id
            _check_deployments(model, where)
    return origin


def _check_deployments(model: ModelSpec, where: str) -> None:
    seen: set[tuple[str, str]] = set()
    for index, deployment in enumerate(model.deployments):
        key = (deployment.provider, deployment.upstream_model)
        if key in seen:
            raise CatalogFileError(
                f'{where}: models."{model.id}".deployments[{index}]: provider "{key[0]}" already '
                f'serves this model as "{key[1]}"'
            )
        seen.add(key)


def _check_prices(parts: Sequence[tuple[str, CatalogFile]], models: dict[str, str]) -> None:
    seen: dict[tuple[str, str, datetime], str] = {}
    for where, part in parts:
        for index, price in enumerate(part.prices):
            path = f"{where}: prices[{index}]"
            if price.model not in models:
                raise CatalogFileError(f'{path}.model: unknown model "{price.model}" (use the model id)')
            key = (price.provider, price.model, price.effective_from)
            if key in seen:
                raise CatalogFileError(
                    f"{path}: a price for ({price.provider}, {price.model}) from "
                    f"{price.effective_from.isoformat()} is already given at {seen[key]}"
                )
            seen[key] = path


def validate_catalog(parts: Sequence[tuple[str, CatalogFile]]) -> CatalogFile:
    """Cross-check parsed files (named by their display path) and merge them into one catalog."""
    models = _check_models(parts)
    _check_prices(parts, models)
    return CatalogFile(
        models=tuple(model for _, part in parts for model in part.models),
        prices=tuple(price for _, part in parts for price in part.prices),
    )


def expand_patterns(patterns: Iterable[str], base_dir: Path, config: str = "") -> list[Path]:
    """Files matched by glob `patterns` (relative ones are relative to `base_dir`), sorted, unique.

    A pattern that matches nothing is an error: it is almost always a typo in the config, which
    the error names (`config`: its path) as every other error about a setting does.
    """
    option = _files_option(config)
    found: dict[Path, None] = {}
    for pattern in patterns:
        anchor, relative = (
            (Path("/"), pattern.lstrip("/"))
            if Path(pattern).is_absolute()
            else (
                base_dir,
                pattern,
            )
        )
        try:
            matches = sorted(path for path in anchor.glob(relative) if path.is_file())
        except (ValueError, IndexError):  # pathlib refuses '', '.', '**a' as patterns
            raise CatalogFileError(f"{option}: {pattern!r} is not a file name or glob pattern") from None
        if not matches:
            raise CatalogFileError(f"{option}: {pattern!r} matches no file under {anchor}")
        found.update(dict.fromkeys(path.resolve() for path in matches))
    return list(found)


def _display(path: Path, base_dir: Path) -> str:
    try:
        return str(path.relative_to(base_dir.resolve()))
    except ValueError:
        return str(path)


def _files_option(config: str) -> str:
    """The option errors about the catalog's patterns name: `catalog.files`, after its config file."""
    return f"{config}: catalog.files" if config else "catalog.files"


def load_catalog(patterns: Sequence[str] | None, base_dir: Path, config: str = "") -> CatalogFile:
    """Read, validate and merge every catalog file the `patterns` name; None (`[catalog] files`
    absent) is the catalog bundled with the package (`load_bundled_catalog`). `config`: the
    config file the patterns come from, named by an error about them."""
    if patterns is None:
        return load_bundled_catalog()
    parts: list[tuple[str, CatalogFile]] = []
    for path in expand_patterns(patterns, base_dir, config):
        where = _display(path, base_dir)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CatalogFileError(f"{where}: cannot read: {exc}") from None
        parts.append((where, parse_catalog(text, where)))
    if not any(part.models for _, part in parts):  # as `files = []`: a sync would remove every model
        named = ", ".join(where for where, _ in parts)
        option = _files_option(config)
        raise CatalogFileError(f"{option}: {named} define no model: a sync would empty the catalog")
    return validate_catalog(parts)


def load_bundled_catalog() -> CatalogFile:
    """The `*.toml` files shipped in this package, read as package resources: they are found
    wherever the package is installed, whatever directory the config file is in."""
    entries = [entry for entry in resources.files("catalog").iterdir() if entry.name.endswith(".toml")]
    parts: list[tuple[str, CatalogFile]] = []
    for entry in sorted(entries, key=lambda entry: entry.name):
        where = f"catalog/{entry.name}"
        parts.append((where, parse_catalog(entry.read_text(encoding="utf-8"), where)))
    return validate_catalog(parts)


def default_catalog_path() -> Path:
    """The catalog shipped with the package (`catalog/models.toml`)."""
    return Path(__file__).resolve().parent / "models.toml"
