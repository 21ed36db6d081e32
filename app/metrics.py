"""What the gateway counts, accumulated in plain dicts on the request path.

Counters and histograms are dicts keyed by label tuples: an update is a dict lookup and an
addition, with no lock (everything runs on one event loop). prometheus_client's own `Counter` and
`Histogram` take a threading lock per observation and look labels up under another; counting one
request (its six series, seven since) through them measured 15 µs, `request_done` here 1.7 to 2.0 µs. The client
library does what it is good at instead: the exposition (`app.exposition`, a collector that reads
these dicts and the live backend state when `/metrics` is scraped).

`series()` flattens everything into Prometheus samples, `(name, label values) -> value`: the
form each worker shares with the others through Redis (`app.routing.cluster`) and the one the
collector sums them in. A histogram's samples are `<name>_bucket` (cumulative, the `le` value
last among the labels) and `<name>_sum`; its count is the `+Inf` bucket.

Seconds are `time.perf_counter()` differences. Cost is summed as `Decimal` here, but exposed (and
summed over workers) as a float: for dashboards; the ledger is the exact record.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from decimal import Decimal
from typing import Protocol

from app.context import RequestContext
from app.pipeline.events import Cost, Outcome
from app.routing.router import Router
from providers.events import Usage

Series = tuple[str, tuple[str, ...]]  # a sample's name and its label values
# What a finished request leaves to count: started, stream, model, provider, status, the error's
# status code, finished, first content, usage, cost. Not its `Outcome`, whose message (the whole
# answer, its log probabilities) and error (its traceback, and the frames' locals) stayed alive
# until the 256th request or the next scrape: a few hundred agent answers of megabytes each.
_Done = tuple[float, bool, str | None, str | None, str, int | None, float, float | None, Usage | None, Cost]
LEDGER_PENDING = "switchyard_ledger_rows_pending"
LEDGER_OLDEST = "switchyard_ledger_oldest_pending_seconds"
LEDGER_WRITABLE = "switchyard_ledger_journal_writable"
# How the workers' values of a series combine (`merged`): the oldest pending row is the oldest of
# any worker's, the journal writable only when every worker's is; everything else is summed.
_COMBINE = {LEDGER_OLDEST: max, LEDGER_WRITABLE: min}


class LedgerGauges(Protocol):
    """What the ledger writer tells about rows not yet in the database (`catalog.ledger.LedgerWriter`)."""

    @property
    def pending(self) -> int: ...

    @property
    def state(self) -> str: ...

    def oldest_pending_s(self) -> float: ...


def merged(total: dict[Series, float], series: Series, value: float) -> None:
    """`value`, one worker's, into `total`, the workers' combined (`_COMBINE`, else summed)."""
    held = total.get(series)
    if held is None:
        total[series] = value
    else:
        combine = _COMBINE.get(series[0])
        total[series] = held + value if combine is None else combine(held, value)


PENDING_LIMIT = 256  # finished requests noted before they are counted (`_Done`: not their Outcome)
SUMMED_GAUGES = ("switchyard_backend_in_flight", "switchyard_backend_queued")
_ZERO = Decimal(0)
TOKEN_BUCKETS = ("input", "output", "reasoning", "cache_read", "cache_write")

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TOKENS_PER_SECOND = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0)


_CODES = {code: (str(code),) for code in range(400, 600)}  # an error's status as its label
_DONE = {"ok": ("200",), "cancelled": ("499",), "error": ("500",)}  # no error: the row's status (`error`: a bug)


def refused(metrics: Metrics, status_code: int) -> None:
    """A request refused before routing (the edge's one place for them, `app.edge.rejection`)."""
    metrics.responses.inc(_CODES.get(status_code, (str(status_code),)))


class Counter:
    __slots__ = ("help", "labels", "name", "values")

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self.help = help_text
        self.labels = labels
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, key: tuple[str, ...], amount: float = 1) -> None:
        self.values[key] = self.values.get(key, 0) + amount

    def series(self) -> Iterator[tuple[Series, float]]:
        name = self.name
        for key, value in self.values.items():
            yield (name, key), value


class DecimalCounter:
    """Sums `Decimal` amounts: exact within the process, and cheaper per request than converting
    each one to a float; the samples (and so the exposition and the cross-worker sums) are floats."""

    __slots__ = ("help", "labels", "name", "values")

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self.help = help_text
        self.labels = labels
        self.values: dict[tuple[str, ...], Decimal] = {}

    def add(self, key: tuple[str, ...], amount: Decimal) -> None:
        self.values[key] = self.values.get(key, _ZERO) + amount

    def series(self) -> Iterator[tuple[Series, float]]:
        name = self.name
        for key, value in self.values.items():
            yield (name, key), float(value)


class RowCounter:
    """A counter whose last label takes a fixed set of values (`columns`), kept as one row per
    tuple of the other labels: one lookup counts every column."""

    __slots__ = ("columns", "help", "labels", "name", "values")

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...], columns: tuple[str, ...]) -> None:
        self.name = name
        self.help = help_text
        self.labels = labels
        self.columns = columns
        self.values: dict[tuple[str, ...], list[float]] = {}

    def add(self, key: tuple[str, ...], counts: tuple[float, ...]) -> None:
        row = self.values.get(key)
        if row is None:
            row = self.values[key] = [0.0] * len(self.columns)
        for index, count in enumerate(counts):
            row[index] += count

    def series(self) -> Iterator[tuple[Series, float]]:
        name, columns = self.name, self.columns
        for key, row in self.values.items():
            for column, value in zip(columns, row, strict=True):
                yield (name, (*key, column)), value


class Histogram:
    """Per label tuple, a count per bucket (not cumulative; the last bucket is `+Inf`), then the sum."""

    __slots__ = ("bounds", "help", "labels", "les", "name", "values")

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...], bounds: tuple[float, ...]) -> None:
        self.name = name
        self.help = help_text
        self.labels = labels
        self.bounds = bounds
        self.les = (*(repr(float(bound)) for bound in bounds), "+Inf")  # the `le` label values
        self.values: dict[tuple[str, ...], list[float]] = {}

    def observe(self, key: tuple[str, ...], value: float) -> None:
        row = self.values.get(key)
        if row is None:
            row = self.values[key] = [0.0] * (len(self.bounds) + 2)
        row[bisect_left(self.bounds, value)] += 1  # the first bound >= value: `le` is inclusive
        row[-1] += value

    def series(self) -> Iterator[tuple[Series, float]]:
        bucket, total = f"{self.name}_bucket", f"{self.name}_sum"
        for key, row in self.values.items():
            cumulative = 0.0
            for le, count in zip(self.les, row, strict=False):
                cumulative += count
                yield (bucket, (*key, le)), cumulative
            yield (total, key), row[-1]


class Metrics:
    def __init__(self) -> None:
        self._pending: list[_Done] = []  # finished requests not counted yet
        self.ledger: LedgerGauges | None = None  # the service's ledger writer, once it runs
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
        self.probes = Counter(
            "switchyard_probes_total", "Health probes by provider and outcome.", ("provider", "outcome")
        )
        self.disabled = Counter(
            "switchyard_provider_disabled_total", "Providers taken out of rotation.", ("provider", "reason")
        )
        self.tokens = RowCounter(
            "switchyard_tokens_total",
            "Tokens by model, provider and usage bucket (requests whose usage is known).",
            ("model", "provider", "bucket"),
            TOKEN_BUCKETS,
        )
        self.cost = DecimalCounter(
            "switchyard_cost_usd_total",
            "Cost in USD by model, provider and source (a float for dashboards; the ledger is exact).",
            ("model", "provider", "source"),
        )
        self.responses = Counter(
            "switchyard_responses_total",
            "Requests by the HTTP status of their answer: completions by their ledger row (200; the error's"
            " status, in a stream too; 499 cancelled; 500 a bug), and every other request answered with an error.",
            ("code",),
        )
        self.limits_local = Counter(
            "switchyard_limits_local_total",
            "Admissions of limited API keys decided by this process alone: Redis unreachable, [auth] fail_open.",
            (),
        )
        self.limits_local.values[()] = 0  # a sample from the start: `increase()` sees the first outage's
        pair = ("model", "provider")
        self.duration = Histogram(
            "switchyard_request_duration_seconds", "Time from request to its last byte.", pair, SECONDS
        )
        self.first_token = Histogram(
            "switchyard_time_to_first_token_seconds", "Time from request to its first content.", pair, SECONDS
        )
        self.speed = Histogram(
            "switchyard_output_tokens_per_second",
            "Output and reasoning tokens over the time from first content to the end.",
            pair,
            TOKENS_PER_SECOND,
        )

    def counters(self) -> list[Counter | DecimalCounter | RowCounter]:
        return [
            self.requests,
            self.attempts,
            self.retries,
            self.failovers,
            self.cooldowns,
            self.breaker_trips,
            self.probes,
            self.disabled,
            self.tokens,
            self.cost,
            self.limits_local,
            self.responses,
        ]

    def histograms(self) -> list[Histogram]:
        return [self.duration, self.first_token, self.speed]

    def request_done(self, ctx: RequestContext, outcome: Outcome) -> None:
        """Note one finished request (the pipeline calls this once per request, on the event loop).

        Only an append here: the requests are counted in batches (`_count_pending`) when the
        numbers are read (`samples`) or `PENDING_LIMIT` wait, a tight loop over a few hundred
        requests being cheaper than the same work spread between them."""
        error = outcome.error
        self._pending.append(
            (
                ctx.started,
                ctx.stream,
                outcome.model,
                outcome.provider,
                outcome.status,
                None if error is None else error.status_code,
                outcome.finished,
                outcome.first_content,
                outcome.usage,
                outcome.cost,
            )
        )
        if len(self._pending) >= PENDING_LIMIT:
            self._count_pending()

    def _count_pending(self) -> None:
        pending, self._pending = self._pending, []
        for done in pending:
            self._count(*done)

    def _count(
        self,
        started: float,
        stream: bool,
        model: str | None,
        provider: str | None,
        status: str,
        error_status: int | None,
        finished: float,
        first: float | None,
        usage: Usage | None,
        cost: Cost,
    ) -> None:
        """First content and speed only for a stream: a whole answer's content comes at its end."""
        model, provider = model or "", provider or ""
        self.requests.inc((model, provider, status))
        self.responses.inc(_CODES.get(error_status, ("500",)) if error_status is not None else _DONE[status])
        key = (model, provider)
        self.duration.observe(key, finished - started)
        if first is not None and stream:
            self.first_token.observe(key, first - started)
        if usage is not None:
            output, reasoning = usage.output_tokens, usage.reasoning_tokens
            counts = (usage.input_tokens, output, reasoning, usage.cache_read_tokens, usage.cache_write_tokens)
            self.tokens.add(key, counts)
            generated = output + reasoning
            if first is not None and stream and generated > 0 and finished > first:
                self.speed.observe(key, generated / (finished - first))
        if cost.usd is not None and cost.source is not None:
            self.cost.add((model, provider, cost.source), cost.usd)

    def samples(self) -> dict[Series, float]:
        """This process's counters and histograms as Prometheus samples."""
        self._count_pending()
        found: dict[Series, float] = {}
        for counter in self.counters():
            found.update(counter.series())
        for histogram in self.histograms():
            found.update(histogram.series())
        return found

    def series(self, router: Router) -> dict[Series, float]:
        """`samples()`, this process's share of the summed gauges and its ledger's: what it shares
        with the other workers."""
        found = self.samples()
        for backend in router.all_backends():
            key = (backend.name, backend.model_id, backend.upstream_model)
            found[(SUMMED_GAUGES[0], key)] = backend.held
            found[(SUMMED_GAUGES[1], key)] = backend.waiting
        found.update(self.ledger_series())
        return found

    def ledger_series(self) -> dict[Series, float]:
        """This process's ledger gauges (none before its writer runs): rows not yet in the database,
        the age of the oldest, and whether its journal can be written."""
        ledger = self.ledger
        if ledger is None:
            return {}
        return {
            (LEDGER_PENDING, ()): ledger.pending,
            (LEDGER_OLDEST, ()): round(ledger.oldest_pending_s(), 3),
            (LEDGER_WRITABLE, ()): int(ledger.state != "unwritable"),
        }
