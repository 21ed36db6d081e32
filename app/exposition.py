"""`GET /metrics`: a prometheus_client collector over what `app.metrics` counted and the live
backend state, registered on the service's own `CollectorRegistry` (never the global one, so two
services in one process — the tests start several — never share numbers).

Nothing is copied into prometheus_client's metric objects on the request path: at scrape time
`collect()` reads the counters' and histograms' dicts (as samples: `Metrics.samples()`), adds the
other live workers' samples (`remote`, fetched from Redis for this scrape by `app.routing.cluster`,
or as last read while Redis does not answer: `Service.render_metrics`), and builds metric families;
the backend gauges are read from the live state then, so they never drift. In-flight and queued are
summed over workers too; the state gauges need no sum, the state being shared. A remote histogram
bucket whose `le` this process does not know (another version's bounds) is left out of the buckets
but still in `+Inf` and the sum.

The ledger gauges (rows pending, oldest pending age, journal writable) combine every live worker's
too, each worker having its own journal segment and writer: the rows pending summed, the oldest
pending row the oldest of any, the journal writable only when every worker's is (`merged`). They
were this process's own, so a scrape showed whichever worker answered (an alert on rows pending
fired or not by that).

The text is prometheus_client's `generate_latest`, served as the classic 0.0.4 text format:
the library answers a scrape that did not negotiate with that format and content type too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from app.metrics import (
    LEDGER_OLDEST,
    LEDGER_PENDING,
    LEDGER_WRITABLE,
    SUMMED_GAUGES,
    Histogram,
    Metrics,
    Series,
    merged,
)
from app.routing.router import Backend, Router

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
BACKEND_LABELS = ("provider", "model", "upstream_model")

_GAUGES: tuple[tuple[str, str, Callable[[Backend, float], float]], ...] = (
    (
        "switchyard_backend_ready",
        "1 when the backend is in rotation (provider enabled, healthy, not cooling).",
        lambda backend, now: int(backend.ready(now)),
    ),
    ("switchyard_backend_in_flight", "This model's requests in flight to the backend.", lambda b, _: b.held),
    ("switchyard_backend_queued", "This model's requests waiting for a slot on the backend.", lambda b, _: b.waiting),
    (
        "switchyard_backend_limit",
        "The backend's concurrency limit (shared by the models deployed to its upstream model).",
        lambda b, _: b.state.limit,
    ),
    (
        "switchyard_backend_cooling_seconds",
        "Seconds until the backend's cool-down ends (0 when not cooling).",
        lambda backend, now: round(max(0.0, backend.state.cooling_until - now), 3),
    ),
    (
        "switchyard_backend_breaker_open",
        "1 when the error-rate breaker is open.",
        lambda backend, _: int(backend.state.breaker_open),
    ),
    (
        "switchyard_backend_probe_failed",
        "1 when the last health probe of the backend's provider failed.",
        lambda backend, _: int(backend.state.probe_failed),
    ),
    (
        "switchyard_backend_provider_disabled",
        "1 when the backend's provider is disabled (a refused key, an exhausted balance).",
        lambda backend, _: int(backend.provider.state.disabled_reason is not None),
    ),
    (
        "switchyard_backend_upstream_queue_depth",
        "The upstream server's own queue, from its /metrics.",
        lambda backend, _: backend.state.queue_depth,
    ),
)


class GatewayCollector:
    """A prometheus_client `Collector`: every Switchyard metric, built when the registry collects."""

    def __init__(self, metrics: Metrics, router: Router, clock: Callable[[], float]) -> None:
        self.metrics = metrics
        self.router = router
        self.clock = clock  # the event loop's `time()`, which backend state is kept in
        self.remote: Mapping[Series, float] = {}
        self.own: Mapping[Series, float] | None = None  # this worker's samples as shared for the scrape

    def collect(self) -> Iterator[Metric]:
        samples = dict(self.own) if self.own is not None else self.metrics.samples()
        for series, value in self.remote.items():
            samples[series] = samples.get(series, 0.0) + value
        by_name: dict[str, list[tuple[tuple[str, ...], float]]] = {}
        for (name, labels), value in samples.items():
            by_name.setdefault(name, []).append((labels, value))
        for counter in self.metrics.counters():
            family = CounterMetricFamily(counter.name, counter.help, labels=counter.labels)
            for labels, value in sorted(by_name.get(counter.name, ())):
                family.add_metric(labels, value)
            yield family
        for histogram in self.metrics.histograms():
            buckets = by_name.get(f"{histogram.name}_bucket", [])
            yield _histogram(histogram, samples, [labels[:-1] for labels, _ in buckets if labels[-1] == "+Inf"])
        yield from self._gauges()
        if self.metrics.ledger is not None:
            yield from _ledger_gauges(self.metrics.ledger_series(), self.remote)

    def _gauges(self) -> Iterator[Metric]:
        now = self.clock()
        backends = [(b, (b.name, b.model_id, b.upstream_model)) for b in self.router.all_backends()]
        for name, help_text, read in _GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=BACKEND_LABELS)
            summed = name in SUMMED_GAUGES
            for backend, labels in backends:
                value = read(backend, now)
                if summed:
                    value += self.remote.get((name, labels), 0.0)
                family.add_metric(labels, value)
            yield family


def _ledger_gauges(own: Mapping[Series, float], remote: Mapping[Series, float]) -> Iterator[Metric]:
    """The ledger writers' rows not yet in the database (in the journal or in memory) and how long
    the oldest has waited — an outage shows as both climbing — over this worker and the others."""
    combined = dict(remote)
    for series, value in own.items():
        merged(combined, series, value)
    yield GaugeMetricFamily(
        LEDGER_PENDING, "Ledger rows not yet written to the database.", value=combined[(LEDGER_PENDING, ())]
    )
    yield GaugeMetricFamily(
        LEDGER_OLDEST,
        "Seconds since the oldest unwritten ledger row's request finished (0 when none).",
        value=combined[(LEDGER_OLDEST, ())],
    )
    yield GaugeMetricFamily(
        LEDGER_WRITABLE,
        "1 when the ledger's journal can be written (a request needs it unless [ledger] required = false).",
        value=combined[(LEDGER_WRITABLE, ())],
    )


def _histogram(histogram: Histogram, samples: Mapping[Series, float], keys: list[tuple[str, ...]]) -> Metric:
    family = HistogramMetricFamily(histogram.name, histogram.help, labels=histogram.labels)
    bucket, total = f"{histogram.name}_bucket", f"{histogram.name}_sum"
    for key in sorted(keys):
        cumulative = [(le, samples.get((bucket, (*key, le)), 0.0)) for le in histogram.les]
        family.add_metric(key, cumulative, samples.get((total, key), 0.0))
    return family
