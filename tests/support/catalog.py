"""The catalog file a test's gateway reads, built from a few parameters.

`catalog_toml(model(...), ..., prices=[price(...), ...])` renders the TOML an operator would write
(`catalog/*.toml`), so the gateway under test loads it through the real file path. A model is its
id, its deployments as `(provider, upstream_model)` or `(provider, upstream_model, priority)`,
and whatever differs from a small plain model (8192-token window, 1024 output, no aliases or
capabilities, not default). Money stays a string, written exactly as given.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Deployment = tuple[str, str] | tuple[str, str, int]


@dataclass(frozen=True)
class Model:
    id: str
    deployments: tuple[Deployment, ...]
    context_window: int
    max_output: int
    aliases: Sequence[str]
    capabilities: Sequence[str]
    default: bool


@dataclass(frozen=True)
class Price:
    provider: str
    model: str
    input: str
    output: str
    cache_read: str | None
    effective_from: str


def model(
    id: str,
    *deployments: Deployment,
    context_window: int = 8192,
    max_output: int = 1024,
    aliases: Sequence[str] = (),
    capabilities: Sequence[str] = (),
    default: bool = False,
) -> Model:
    return Model(id, deployments, context_window, max_output, aliases, capabilities, default)


def price(
    provider: str,
    model: str,
    input: str,
    output: str,
    *,
    cache_read: str | None = None,
    effective_from: str = "2026-01-01",
) -> Price:
    """Rates in USD per million tokens, as decimal strings (`"0.10"`)."""
    return Price(provider, model, input, output, cache_read, effective_from)


def _quoted(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def _list(values: Sequence[str]) -> str:
    return "[" + ", ".join(map(_quoted, values)) + "]"


def _model_lines(spec: Model) -> list[str]:
    table = f"models.{_quoted(spec.id)}"
    lines = [f"[{table}]"]
    if spec.aliases:
        lines.append(f"aliases = {_list(spec.aliases)}")
    lines += [f"context_window = {spec.context_window}", f"max_output = {spec.max_output}"]
    if spec.capabilities:
        lines.append(f"capabilities = {_list(spec.capabilities)}")
    if spec.default:
        lines.append("default = true")
    for provider, upstream_model, *priority in spec.deployments:
        lines += ["", f"[[{table}.deployments]]", f"provider = {_quoted(provider)}"]
        lines.append(f"upstream_model = {_quoted(upstream_model)}")
        lines += [f"priority = {p}" for p in priority]
    return [*lines, ""]


def _price_lines(spec: Price) -> list[str]:
    lines = ["[[prices]]", f"provider = {_quoted(spec.provider)}", f"model = {_quoted(spec.model)}"]
    lines += [f"effective_from = {spec.effective_from}", f"input = {_quoted(spec.input)}"]
    lines.append(f"output = {_quoted(spec.output)}")
    if spec.cache_read is not None:
        lines.append(f"cache_read = {_quoted(spec.cache_read)}")
    return [*lines, ""]


def catalog_toml(*models: Model, prices: Iterable[Price] = ()) -> str:
    """The catalog file's text: the models in order, then the prices in order."""
    lines = [line for spec in models for line in _model_lines(spec)]
    lines += [line for spec in prices for line in _price_lines(spec)]
    return "\n".join(lines)
