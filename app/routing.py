"""Routing: from a request's `model` and `provider` pin to an ordered list of backends.

A *backend* is one deployment: a configured provider serving one upstream model (providers.md).
Resolution order:
1. `model` names a catalog id or alias (unknown → 400 `model`); no `model` means the default:
   the catalog model marked `default` that has a ready backend, preferring the one whose best ready
   deployment has the highest priority (none → 503);
2. a `provider` pin must name a configured provider (else 400 `provider`) that serves the model
   (else 400 `provider`);
3. backends are ordered by deployment priority, then provider priority, both higher first.
   Backends whose provider is not ready (its key variable unset) are left out; when nothing is
   left, 503.

The router reads an immutable in-memory catalog snapshot; the request path never queries SQL.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.errors import InvalidRequest, NoBackendAvailable
from catalog.snapshot import CatalogSnapshot, ModelEntry
from providers.adapter import Provider
from providers.config import ProviderConfig


class ProviderRuntime:
    """One configured provider: its adapter and whether it may take traffic."""

    __slots__ = ("adapter", "config", "disabled_reason")

    def __init__(self, config: ProviderConfig, adapter: Provider, *, disabled_reason: str | None = None) -> None:
        self.config = config
        self.adapter = adapter
        self.disabled_reason = disabled_reason

    @property
    def ready(self) -> bool:
        return self.disabled_reason is None


class Backend:
    __slots__ = ("priority", "provider", "upstream_model")

    def __init__(self, provider: ProviderRuntime, upstream_model: str, priority: int) -> None:
        self.provider = provider
        self.upstream_model = upstream_model
        self.priority = priority

    @property
    def name(self) -> str:
        return self.provider.config.name


class Route:
    __slots__ = ("backends", "model")

    def __init__(self, model: ModelEntry, backends: list[Backend]) -> None:
        self.model = model
        self.backends = backends


class Router:
    def __init__(self, snapshot: CatalogSnapshot, providers: Mapping[str, ProviderRuntime]) -> None:
        self.snapshot = snapshot
        self.providers = providers

    def resolve_model(self, name: str | None) -> ModelEntry:
        if name is None:
            return self._default_model()
        entry = self.snapshot.resolve(name)
        if entry is None:
            raise InvalidRequest(f"model: unknown model '{name}'", param="model")
        return entry

    def route(self, model: ModelEntry, pin: str | None) -> Route:
        if pin is not None and pin not in self.providers:
            raise InvalidRequest(f"provider: unknown provider '{pin}'", param="provider")
        candidates = self.backends(model, pin)
        if pin is not None and not candidates and not any(d.provider == pin for d in model.deployments):
            raise InvalidRequest(f"provider: provider '{pin}' does not serve model '{model.id}'", param="provider")
        ready = [backend for backend in candidates if backend.provider.ready]
        if not ready:
            raise NoBackendAvailable("no backend is available for this model")
        return Route(model, ready)

    def backends(self, model: ModelEntry, pin: str | None = None) -> list[Backend]:
        found = [
            Backend(self.providers[d.provider], d.upstream_model, d.priority)
            for d in model.deployments
            if d.provider in self.providers and (pin is None or d.provider == pin)
        ]
        found.sort(key=lambda b: (b.priority, b.provider.config.priority), reverse=True)
        return found

    def _default_model(self) -> ModelEntry:
        best: tuple[tuple[int, int], ModelEntry] | None = None
        for entry in self.snapshot.default_models():
            ready = [b for b in self.backends(entry) if b.provider.ready]
            if not ready:
                continue
            rank = (ready[0].priority, ready[0].provider.config.priority)
            if best is None or rank > best[0]:
                best = (rank, entry)
        if best is None:
            raise NoBackendAvailable("no backend is available for this model")
        return best[1]
