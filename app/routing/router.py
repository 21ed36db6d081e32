"""Routing: from a request's `model` and `provider` pin to the backends that may serve it.

A *backend* is one deployment: a configured provider serving one upstream model (providers.md).
The router builds every backend (with its live state, `app.routing.state`) once from the catalog
snapshot and the configured providers. Resolution:
1. `model` names a catalog id or alias (unknown → 400 `model`); no `model` means the default:
   the catalog model marked `default` that has a ready backend, preferring the one whose best ready
   deployment has the highest priority (none → 503);
   A model with no backend on a configured provider (none configured) is a 503 with
   `Retry-After: UNCONFIGURED_RETRY_S` (api.md: with `Retry-After`): a deployment synced into the
   catalog is in use within the catalog watch's poll (`app.catalog_watch.CATALOG_POLL_S`), the
   soonest anything could change.
2. a `provider` pin must name a configured provider (else 400 `provider`) that serves the model
   (else 400 `provider`);
3. the route is every backend of the model on a configured provider, in priority order
   (deployment, then provider); which of them are eligible right now, and in what load order,
   is the failover loop's business (`app.routing.failover`).

The request path never queries SQL: the snapshot is immutable and in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from app.errors import InvalidRequest, NoBackendAvailable, clip
from app.routing.state import BackendState, ProviderState
from app.settings import ProviderPolicy
from catalog.snapshot import CatalogSnapshot, ModelEntry
from providers.adapter import Provider
from providers.config import ProviderConfig

UNCONFIGURED_RETRY_S = 5.0  # app.catalog_watch.CATALOG_POLL_S (tests/routing check they agree)


class StatePublisher(Protocol):
    """Tells the other workers and replicas about a state change (`app.routing.cluster.ClusterLink`).

    Each method reads the state it names from the object it is given, and returns at once: the
    write happens in the background, never on the request path.
    """

    def cooled(self, backend: Backend) -> None: ...

    def breaker_changed(self, backend: Backend) -> None: ...

    def provider_disabled(self, provider: ProviderRuntime) -> None: ...

    def provider_enabled(self, provider: ProviderRuntime) -> None: ...


class ProviderRuntime:
    """One configured provider: its adapter, its policy, whether it may take traffic, and where
    changes to that state are announced (`publisher`; None when one process is all there is)."""

    __slots__ = ("adapter", "backends", "config", "policy", "publisher", "state")

    def __init__(
        self,
        config: ProviderConfig,
        adapter: Provider,
        policy: ProviderPolicy,
        *,
        key_missing: bool = False,
        publisher: StatePublisher | None = None,
    ) -> None:
        self.config = config
        self.adapter = adapter
        self.policy = policy
        self.state = ProviderState(config.name, key_missing=key_missing)
        self.publisher = publisher
        self.backends: list[BackendState] = []  # its upstream models' states (`Router.replace_snapshot`)


class Backend:
    """One catalog model's deployment on a provider. Its `state` (capacity, queue, cool-down,
    breaker) is the upstream model's on that provider: providers.md's backend is "a provider
    serving one upstream model", so two catalog models deployed to the same one share it
    (`Router.replace_snapshot`). `held` and `waiting` count this deployment's own requests (the
    per-model in-flight and queued gauges, which sum to the state's)."""

    __slots__ = ("held", "model_id", "priority", "provider", "state", "upstream_model", "waiting")

    def __init__(
        self, provider: ProviderRuntime, model_id: str, upstream_model: str, priority: int, state: BackendState
    ) -> None:
        self.provider = provider
        self.model_id = model_id
        self.upstream_model = upstream_model
        self.priority = priority
        self.state = state
        self.held = 0  # slots of `state` this deployment's requests hold
        self.waiting = 0  # its requests queued for one

    def release(self) -> None:
        self.held -= 1
        self.state.release()

    @property
    def name(self) -> str:
        return self.provider.config.name

    def ready(self, now: float) -> bool:
        return self.provider.state.ready and self.state.healthy(now)

    def up(self) -> bool:
        """In rotation but for a cool-down, which ends by itself: what readiness counts. Every
        replica shares the upstreams, so one 429 that cools them all would take every replica out
        of its load balancer at once, for a balancer's 503 instead of the gateway's own with its
        `Retry-After`; a failed probe, an open breaker, a disabled provider or an unlisted model
        is the trouble readiness is for."""
        return self.provider.state.ready and not self.state.broken


def report_unconfigured(router: Router, log: Any) -> None:
    for provider, models in sorted(router.unconfigured().items()):
        reason = "not in the config: its deployments are never routed to"
        log.warning("catalog_provider_unknown", provider=provider, models=models, reason=reason)


def new_state(provider: ProviderRuntime) -> BackendState:
    policy = provider.policy
    return BackendState(
        limit=policy.max_concurrency,
        max_queue=policy.max_queue,
        window=policy.breaker_window,
        min_samples=policy.breaker_min_samples,
        ratio=policy.breaker_error_ratio,
    )


class Route:
    """A model's backends for one request, and their providers' names (`names`: kept by the router
    per model, not made per request)."""

    __slots__ = ("backends", "model", "names")

    def __init__(self, model: ModelEntry, backends: list[Backend], names: tuple[str, ...]) -> None:
        self.model = model
        self.backends = backends
        self.names = names


BackendKey = tuple[str, str, str]  # provider, model id, upstream model


class Router:
    def __init__(self, snapshot: CatalogSnapshot, providers: Mapping[str, ProviderRuntime]) -> None:
        self.providers = providers
        self.by_key: dict[BackendKey, Backend] = {}
        self._states: dict[tuple[str, str], BackendState] = {}  # (provider, upstream model), kept for good
        self._backends: dict[str, list[Backend]] = {}
        self._names: dict[str, tuple[str, ...]] = {}  # per model: its backends' provider names
        self.snapshot = snapshot
        self.replace_snapshot(snapshot)

    def replace_snapshot(self, snapshot: CatalogSnapshot) -> None:
        """Route by `snapshot` from now on (a catalog changed by `switchyard catalog sync` while
        serving, `app.catalog_watch`). A deployment still in it keeps its backend, live state
        (cool-down, breaker, in-flight count) and all, with the new priority; one that is gone
        takes no new requests. The state is the provider's upstream model's (`Backend`), kept
        for the router's life: a deployment that comes back, or a new model on an upstream model
        already served, finds the requests still in flight there and any cool-down or breaker."""
        kept = self.by_key
        by_key: dict[BackendKey, Backend] = {}
        backends: dict[str, list[Backend]] = {}
        for entry in snapshot.models:
            found = []
            for d in entry.deployments:
                if d.provider not in self.providers:
                    continue
                key = (d.provider, entry.id, d.upstream_model)
                backend = kept.get(key)
                if backend is None:
                    provider = self.providers[d.provider]
                    state = self._states.get((d.provider, d.upstream_model))
                    if state is None:
                        state = self._states[(d.provider, d.upstream_model)] = new_state(provider)
                        provider.backends.append(state)
                    backend = Backend(provider, entry.id, d.upstream_model, d.priority, state)
                backend.priority = d.priority
                found.append(by_key.setdefault(key, backend))
            found.sort(key=lambda b: (b.priority, b.provider.config.priority), reverse=True)
            backends[entry.id] = found
        self._names = {model: tuple(backend.name for backend in found) for model, found in backends.items()}
        self.snapshot, self._backends, self.by_key = snapshot, backends, by_key

    def unconfigured(self) -> dict[str, list[str]]:
        """The catalog's deployments on providers this config does not have, by provider: never
        routed to (a typo, or a provider removed from config.toml), reported at start and reload."""
        found: dict[str, list[str]] = {}
        for entry in self.snapshot.models:
            for d in entry.deployments:
                if d.provider not in self.providers:
                    found.setdefault(d.provider, []).append(entry.id)
        return found

    def all_backends(self) -> list[Backend]:
        return [backend for backends in self._backends.values() for backend in backends]

    def backends_of(self, provider: str) -> list[Backend]:
        return [backend for backend in self.all_backends() if backend.name == provider]

    def backends(self, model: ModelEntry) -> list[Backend]:
        return self._backends.get(model.id, [])

    def resolve_model(self, name: str | None, now: float, pin: str | None = None) -> ModelEntry:
        """The model `name` names, or the default model; with a provider `pin`, one of the default
        models it serves (an unknown pin is left to `route`, which names it)."""
        if name is None:
            return self._default_model(now, pin if pin in self.providers else None)
        entry = self.snapshot.resolve(name)
        if entry is None:
            raise InvalidRequest(f"model: unknown model '{clip(name)}'", param="model")
        return entry

    def route(self, model: ModelEntry, pin: str | None) -> Route:
        backends = self.backends(model)
        names = self._names.get(model.id, ())
        if pin is not None:
            if pin not in self.providers:
                raise InvalidRequest(f"provider: unknown provider '{clip(pin)}'", param="provider")
            backends = [b for b in backends if b.name == pin]
            if not backends:
                raise InvalidRequest(f"provider: provider '{pin}' does not serve model '{model.id}'", param="provider")
            names = (pin,)
        if not backends:
            raise NoBackendAvailable("no backend is available for this model", retry_after=UNCONFIGURED_RETRY_S)
        return Route(model, backends, names)

    def _default_model(self, now: float, pin: str | None) -> ModelEntry:
        """The default model whose best ready backend ranks highest. When none has a ready backend,
        the one whose best backend ranks highest all the same: its route then finds nothing to
        try and answers 503 with the soonest `Retry-After`, and its ledger row names a model, as
        for a request that named it. With a `pin`, only the pinned provider's backends count (a
        default model it does not serve was a 400 while another default model it serves waited)."""
        best: tuple[tuple[int, int], ModelEntry] | None = None
        fallback: tuple[tuple[int, int], ModelEntry] | None = None
        for entry in self.snapshot.default_models():
            backends = [b for b in self.backends(entry) if pin is None or b.name == pin]
            if backends:
                rank = (backends[0].priority, backends[0].provider.config.priority)
                if fallback is None or rank > fallback[0]:
                    fallback = (rank, entry)
            ready = [b for b in backends if b.ready(now)]
            if not ready:
                continue
            rank = (ready[0].priority, ready[0].provider.config.priority)
            if best is None or rank > best[0]:
                best = (rank, entry)
        chosen = best or fallback
        if chosen is None and pin is not None:  # the pin serves no default model: `route` says so
            return self._default_model(now, None)
        if chosen is None:
            raise NoBackendAvailable("no backend is available for this model", retry_after=UNCONFIGURED_RETRY_S)
        return chosen[1]
