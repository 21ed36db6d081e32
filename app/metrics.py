"""Prometheus metrics, rendered by hand in the text exposition format (no client library).

Counters are dicts keyed by label tuples, incremented on the request path (a dict update, no
locks: everything runs on one event loop). Backend gauges are not stored at all: `render` reads
them from the live backend state when `/metrics` is scraped, so they can never drift.

With several workers a scrape reaches one of them, so `render` can add the other workers' numbers
(`remote`, collected by `app.routing.cluster` from what each worker writes as its `series`): counters and
the in-flight/queued gauges are summed; the state gauges need no sum, the state being shared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from app.context import RequestContext
from app.pipeline.events import Outcome
from app.routing.router import Router

Series = tuple[str, tuple[str, ...]]  # a metric's name and its label values
SUMMED_GAUGES = ("switchyard_backend_in_flight", "switchyard_backend_queued")


class Counter:
    __slots__ = ("help", "labels", "name", "values")

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self.help = help_text
        self.labels = labels
        self.values: dict[tuple[str, ...], int] = {}

    def inc(self, key: tuple[str, ...], amount: int = 1) -> None:
        self.values[key] = self.values.get(key, 0) + amount

    def render(self, remote: Mapping[Series, float]) -> Iterable[str]:
        values: dict[tuple[str, ...], float] = dict(self.values)
        for (name, key), value in remote.items():
            if name == self.name:
                values[key] = values.get(key, 0) + value
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for key, value in sorted(values.items()):
            yield f"{self.name}{{{_labels(self.labels, key)}}} {_number(value)}"


class Metrics:
    def __init__(self) -> None:
        self.requests = Counter(
            "switchyard_requests_total",
            "Completed requests by model, provider and status.",
            ("model", "provider", "status"),
        )
        self.attempts = Counter(
            "switchyard_attempts_total", "Upstream attempts by provider and outcome.", ("provider", "outcome")
        )
        self.retries = Counter("switchyard_retries_total", "Attempts after the first one of a request.", ("model",))
        self.failovers = Counter(
            "switchyard_failovers_total",
            "Requests answered by a backend other than their first choice.",
            ("model", "provider"),
        )
        self.cooldowns = Counter("switchyard_cooldowns_total", "Backend cool-downs started.", ("provider", "reason"))
        self.breaker_trips = Counter("switchyard_breaker_trips_total", "Backend breakers opened.", ("provider",))
        self.disabled = Counter(
            "switchyard_provider_disabled_total", "Providers taken out of rotation.", ("provider", "reason")
        )

    def counters(self) -> list[Counter]:
        return [
            self.requests,
            self.attempts,
            self.retries,
            self.failovers,
            self.cooldowns,
            self.breaker_trips,
            self.disabled,
        ]

    def request_done(self, ctx: RequestContext, outcome: Outcome) -> None:
        """Count one finished request (the pipeline calls this once per request)."""
        self.requests.inc((outcome.model or "", outcome.provider or "", outcome.status))

    def series(self, router: Router) -> dict[Series, float]:
        """This process's counters and its share of the summed gauges, for the other workers."""
        found: dict[Series, float] = {
            (counter.name, key): value for counter in self.counters() for key, value in counter.values.items()
        }
        for backend in router.all_backends():
            key = (backend.name, backend.model_id, backend.upstream_model)
            found[(SUMMED_GAUGES[0], key)] = backend.state.in_flight
            found[(SUMMED_GAUGES[1], key)] = backend.state.queued
        return found

    def render(self, router: Router, now: float, remote: Mapping[Series, float] | None = None) -> str:
        """The exposition text: this process's numbers plus `remote` (the other workers' sums)."""
        remote = remote or {}
        lines: list[str] = []
        for counter in self.counters():
            lines.extend(counter.render(remote))
        lines.extend(_backend_gauges(router, now, remote))
        return "\n".join(lines) + "\n"


_GAUGES = (
    ("switchyard_backend_ready", "1 when the backend is in rotation (provider enabled, healthy, not cooling)."),
    ("switchyard_backend_in_flight", "Requests in flight to the backend."),
    ("switchyard_backend_queued", "Requests waiting for a slot on the backend."),
    ("switchyard_backend_limit", "The backend's concurrency limit."),
    ("switchyard_backend_cooling_seconds", "Seconds until the backend's cool-down ends (0 when not cooling)."),
    ("switchyard_backend_breaker_open", "1 when the error-rate breaker is open."),
    ("switchyard_backend_upstream_queue_depth", "The upstream server's own queue, from its /metrics."),
)


def _backend_gauges(router: Router, now: float, remote: Mapping[Series, float]) -> Iterable[str]:
    rows = []
    for backend in router.all_backends():
        state = backend.state
        key = (backend.name, backend.model_id, backend.upstream_model)
        labels = _labels(("provider", "model", "upstream_model"), key)
        values = (
            int(backend.ready(now)),
            _number(state.in_flight + remote.get((SUMMED_GAUGES[0], key), 0)),
            _number(state.queued + remote.get((SUMMED_GAUGES[1], key), 0)),
            state.limit,
            round(max(0.0, state.cooling_until - now), 3),
            int(state.breaker_open),
            state.queue_depth,
        )
        rows.append((labels, values))
    for index, (name, help_text) in enumerate(_GAUGES):
        yield f"# HELP {name} {help_text}"
        yield f"# TYPE {name} gauge"
        for labels, values in rows:
            yield f"{name}{{{labels}}} {values[index]}"


def _number(value: float) -> str:
    """Counts summed from several workers come back as floats; print whole numbers as integers."""
    return str(int(value)) if float(value).is_integer() else str(value)


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    return ",".join(f'{name}="{_escape(value)}"' for name, value in zip(names, values, strict=True))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
