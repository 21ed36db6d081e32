"""The running service's parts, built from `Settings` in the app's lifespan and closed there.

`Service.start()` opens the database engine, brings the schema and catalog up to date when the
settings ask for it, loads the catalog snapshot (and follows its changes: `app.catalog_watch`),
builds one upstream HTTP client shared by every adapter, and starts the ledger writer over its
journal (`catalog.journal`: opened first, so rows a killed process left are replayed). With the
database unreachable it still starts: migrations and sync are skipped with a warning, the catalog
comes from the copy saved beside the journal at the last successful load
(`catalog.saved_snapshot`), and rows wait in the journal. `stop()` is bounded (`LEDGER_CLOSE_S`,
`ENGINE_DISPOSE_S`), so SIGTERM during an outage exits promptly and leaves the unwritten rows in
the journal for the next start. With `[redis]` configured it also links this process to the other
workers and replicas (`app.routing.cluster`) before the first request. With `[auth] mode = "keys"`
it loads every API key into memory and builds the access gate (`app.access`). Nothing here runs
at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.access.gate import AccessGate
from app.access.keyring import KeyRing
from app.access.resp import RespError
from app.catalog_watch import EMPTY, CatalogWatch
from app.exposition import GatewayCollector
from app.logging import LineWriter, get_logger
from app.metrics import SUMMED_GAUGES, Metrics
from app.pipeline.gpu_time import GpuTime
from app.pipeline.pipeline import Pipeline
from app.routing.cluster import ClusterLink
from app.routing.health import HealthMonitor
from app.routing.router import ProviderRuntime, Router, report_unconfigured
from app.settings import Settings, gpu_hour_rates, key_missing, provider_configs, provider_policy
from catalog.database import database_unreachable, open_engine
from catalog.files import load_catalog
from catalog.journal import Journal
from catalog.ledger import LedgerWriter
from catalog.migrate import schema_ready
from catalog.outages import statement_timed_out
from catalog.records import LedgerRecord
from catalog.saved_snapshot import read_saved_snapshot, save_snapshot
from catalog.snapshot import CatalogSnapshot, load_snapshot
from catalog.sync import sync_catalog
from providers.adapter import Provider, UpstreamClient, make_client

_GC_YOUNG_THRESHOLD = 20_000
LEDGER_CLOSE_S = 5.0  # at shutdown the ledger writes what it can this long; the rest stays in the journal
ENGINE_DISPOSE_S = 2.0  # closing pooled connections to a database that is gone must not hang the exit
READY_CHECK_S = 2.0  # a database slower than this to answer `SELECT 1` is not ready
READY_REDIS_S = 0.5  # a limiter's Redis slower than this to take a write is `unavailable` in /readyz
REMOTE_METRICS_S = 1.0  # a scrape waits this long for the other workers' numbers, then takes the last read


class Service:
    def __init__(self, settings: Settings, *, prepare: bool = True, log_writer: LineWriter | None = None) -> None:
        self.settings = settings
        self.log_writer = log_writer
        self.prepare = prepare
        self.log: Any = get_logger("switchyard")
        self.engine: AsyncEngine | None = None
        self.client: httpx.AsyncClient | None = None
        self.ledger: LedgerWriter | None = None
        self.router: Router | None = None
        self.pipeline: Pipeline | None = None
        self.metrics = Metrics()
        self.registry = CollectorRegistry(auto_describe=False)  # this service's own, never the global one
        self.collector: GatewayCollector | None = None
        self.health: HealthMonitor | None = None
        self.cluster: ClusterLink | None = None
        self._journal_task: asyncio.Task[None] | None = None
        self.access: AccessGate | None = None
        self.catalog_watch: CatalogWatch | None = None

    async def start(self) -> None:
        settings = self.settings
        journal = self._open_journal()
        self.engine = open_engine(settings.database.url)
        if self.prepare:
            await prepare_database(settings, self.engine)
        snapshot = await self._load_snapshot(self.engine)
        self.client = make_client()
        if settings.redis is not None:
            self.cluster = ClusterLink(settings.redis, self.metrics, self.log)
        runtimes = self._provider_runtimes(self.client)
        self.router = Router(snapshot, runtimes)
        self.collector = GatewayCollector(self.metrics, self.router, asyncio.get_running_loop().time)
        self.registry.register(self.collector)
        if self.cluster is not None:
            await self.cluster.start(self.router)
        record = self._start_ledger(self.engine, journal)
        self.metrics.ledger = self.ledger
        if settings.auth.mode == "keys":
            keyring = KeyRing(self.engine, settings.auth, settings.redis, self.log, settings.journal_dir)
            await keyring.start()
            self.access = AccessGate(settings, self.engine, keyring, self.log, self.metrics.limits_local)
        routing = settings.routing
        self.pipeline = Pipeline(
            self.router,
            record,
            self.log,
            self.metrics,
            routing.probe_interval_s,
            GpuTime(gpu_hour_rates(settings)),
            self.access,
            self.log_writer,
            routing.quota_recheck_s,
        )
        self.health = HealthMonitor(
            self.router, routing.probe_interval_s, self.log, self.metrics, routing.quota_recheck_s
        )
        self.health.start()
        self.catalog_watch = CatalogWatch(self.engine, self.router, settings.journal_dir, self.log)
        self.catalog_watch.start()
        if self.log_writer is not None:
            self.log_writer.flush_every(0.2)
        self.log.info("started", providers=sorted(runtimes), models=len(snapshot.models))
        report_unconfigured(self.router, self.log)
        tune_gc()

    def _provider_runtimes(self, client: UpstreamClient) -> dict[str, ProviderRuntime]:
        """Each configured provider's adapter and routing state, warning of what will not work as
        configured: a provider whose key variable is unset (disabled), and a request deadline that
        cuts before the provider's own first-byte timeout (its backend is never timed out)."""
        settings = self.settings
        runtimes = {}
        for config in provider_configs(settings):
            missing = key_missing(settings, config.name)
            if missing:
                env = settings.providers[config.name].api_key_env
                self.log.warning("provider_disabled", provider=config.name, reason=f"key variable {env} is unset")
            head_s = min(config.timeouts.first_byte, config.timeouts.total)
            if settings.routing.request_deadline_s < head_s:  # the deadline cuts first: never a timeout
                self.log.warning(
                    "request_deadline_before_timeouts",
                    provider=config.name,
                    request_deadline_s=settings.routing.request_deadline_s,
                    first_byte=head_s,
                    detail="a backend that never answers is never timed out, cooled down or failed over from",
                )
            policy = provider_policy(settings, config.name)
            runtimes[config.name] = ProviderRuntime(
                config, Provider(config, client), policy, key_missing=missing, publisher=self.cluster
            )
        return runtimes

    def _start_ledger(self, engine: AsyncEngine, journal: Journal | None) -> Callable[[LedgerRecord, bytes], None]:
        """Start the ledger writer (and the journal's task); what the pipeline calls with each row:
        the writer's `submit`, or a discard with `[ledger] enabled = false`."""
        ledger = self.settings.ledger
        self.ledger = LedgerWriter(
            engine,
            journal=journal,
            required=ledger.enabled and ledger.required,
            max_queue=ledger.queue_size,
            batch_size=ledger.batch_size,
            flush_interval=ledger.flush_interval_s,
            idle=not ledger.enabled,
        )
        self.ledger.start()
        if journal is not None:
            self._journal_task = asyncio.get_running_loop().create_task(journal.run(), name="ledger-journal")
        if not ledger.enabled:
            self.log.warning("ledger_disabled", reason="[ledger] enabled = false: requests are not recorded")
            return _discard
        return self.ledger.submit

    async def stop(self) -> None:
        try:
            await self._stop()
        finally:
            if self.log_writer is not None:
                # Last, so the shutdown's own warnings (rows left pending, a store or engine that
                # would not close) are written; a log that can no longer be written (stdout closed:
                # a pipe whose reader is gone) must not fail the shutdown.
                with contextlib.suppress(OSError, ValueError):
                    self.log_writer.stop()

    async def _stop(self) -> None:
        if self.health is not None:
            await self.health.stop()
        if self.catalog_watch is not None:
            await self.catalog_watch.stop()
        if self.access is not None:
            await self.access.keyring.stop()
            await self.access.close()
        if self.cluster is not None:
            await self.cluster.stop()
        if self._journal_task is not None:
            self._journal_task.cancel()
            await asyncio.gather(self._journal_task, return_exceptions=True)
        if self.ledger is not None:
            await self.ledger.close(LEDGER_CLOSE_S)
        if self.client is not None:
            await self.client.aclose()
        if self.engine is not None:
            try:
                await asyncio.wait_for(self.engine.dispose(), ENGINE_DISPOSE_S)
            except TimeoutError:
                self.log.warning("database_dispose_timed_out", seconds=ENGINE_DISPOSE_S)

    @property
    def recording(self) -> bool:
        """Whether requests may be served: their ledger rows can be journaled, or need not be
        (`[ledger] required = false`, or the ledger is off). Read by the edge per request."""
        return self.ledger is None or self.ledger.accepting

    @property
    def ledger_state(self) -> str:
        """`/readyz`'s `ledger`: `ok`, `behind`, `unwritable` (`LedgerWriter.state`) or `disabled`."""
        if self.ledger is None or not self.settings.ledger.enabled:
            return "disabled"
        return self.ledger.state

    def _open_journal(self) -> Journal | None:
        """The ledger's journal (None with `[ledger] enabled = false`), opened before anything
        else: the rows a previous process left are adopted now and replayed by the writer. A
        journal that cannot be opened is reported and the service still starts (refusing
        traffic while `[ledger] required`)."""
        ledger = self.settings.ledger
        if not ledger.enabled:
            return None
        journal = Journal(self.settings.journal_dir, fsync_interval=ledger.fsync_interval_s)
        adopted = journal.open()
        if adopted:
            self.log.info("ledger_journal_replay", rows=adopted, directory=str(journal.directory))
        if journal.broken and ledger.required:
            self.log.error("ledger_journal_required", reason="requests are refused until the journal can be written")
        return journal

    async def _load_snapshot(self, engine: AsyncEngine) -> CatalogSnapshot:
        """The catalog from SQL, saved beside the journal; the saved copy when the database
        cannot be reached (and none when there is no copy: the error stands), or when its catalog
        is empty and the copy's is not (`app.catalog_watch`: a database made again, not synced)."""
        directory = self.settings.journal_dir
        try:
            snapshot = await load_snapshot(engine)
        except Exception as exc:
            if not database_unreachable(exc):
                raise
            saved = read_saved_snapshot(directory)
            if saved is None:
                message = f"the database is unreachable and no catalog snapshot was saved in {directory}"
                raise RuntimeError(message) from exc
            self.log.warning("catalog_from_saved_snapshot", error=type(exc).__name__, directory=str(directory))
            return saved
        if not snapshot.models and (saved := read_saved_snapshot(directory)) is not None and saved.models:
            self.log.warning("catalog_reload_refused", models=0, detail=EMPTY)  # a worker's start: as the watch
            return saved
        try:
            save_snapshot(snapshot, directory)
        except OSError as exc:
            self.log.warning("catalog_snapshot_not_saved", error=type(exc).__name__, directory=str(directory))
        return snapshot

    async def render_metrics(self) -> bytes:
        """`/metrics`: this process's numbers, plus the other live workers' when Redis is configured.

        The collector reads `remote` while `generate_latest` runs: one synchronous call on the
        event loop, so no other scrape can change it meanwhile. While Redis does not answer it
        keeps the other workers' counters and histograms as last read (dropped, the sums fell and
        rose from one scrape to the next, whichever worker answered, which Prometheus takes for
        counter resets), but not their in-flight and queued gauges, which would stand still. A
        scrape waits `REMOTE_METRICS_S` at most for them (the read goes on, for the next scrape)."""
        assert self.collector is not None
        remote = own = None
        if self.cluster is not None:
            with contextlib.suppress(TimeoutError):  # a stalled Redis held a scrape 5 s (its socket timeout)
                async with asyncio.timeout(REMOTE_METRICS_S):
                    own = await self.cluster.share_now()  # first: a later scrape elsewhere reads them
                    remote = await self.cluster.remote_series()
        self.collector.own = own
        if remote is not None:
            self.collector.remote = remote
        elif self.collector.remote:
            kept = self.collector.remote
            self.collector.remote = {series: value for series, value in kept.items() if series[0] not in SUMMED_GAUGES}
        return generate_latest(self.registry)

    async def database_ready(self) -> bool:
        """`/readyz`'s database check: a `SELECT 1` answered within `READY_CHECK_S`. A pooled
        connection the server ended (a restart, a failover, `pg_terminate_backend`) is dropped and
        the check tried once more: it said "not ready" to the first probe after every such event,
        on every replica at once, with the database answering."""
        if self.engine is None:
            return False
        try:
            async with asyncio.timeout(READY_CHECK_S):
                for retry in (False, True):
                    try:
                        async with self.engine.connect() as conn:
                            await conn.execute(text("SELECT 1"))
                        return True
                    except DBAPIError as exc:
                        if retry or not exc.connection_invalidated:
                            raise
        except Exception:
            return False
        return False

    async def limits_state(self) -> str | None:
        """`/readyz`'s `limits`, with Redis's limiter (keys mode and `[redis]`): `ok` when it answers
        a write within `READY_REDIS_S` (every admission writes: a Redis that answers `PING` but refuses
        writes, a read-only replica after a failover or one out of memory under `noeviction`, gave
        limited keys 503 while this said `ok`); else `unavailable` (limited keys get 503) or `local` (each
        process enforces its share: `fail_open`). Not a condition of readiness: every replica shares
        the one Redis, and keys without limits are served as ever. Checked beside the database and
        briefly, so that a hung Redis does not make a probe of a second or more time out (and every
        replica unready at once)."""
        shared = self.access.shared if self.access is not None else None
        if shared is None:
            return None
        try:
            async with asyncio.timeout(READY_REDIS_S):
                try:
                    await shared.redis.call("SET", f"{shared.prefix}:ready", "1", "PX", "60000")
                except RespError as exc:  # an ACL that keeps the user to the limiter's own keys: it answers
                    if not str(exc).startswith("NOPERM"):
                        raise
                    await shared.redis.call("PING")
        except (RespError, TimeoutError):
            return "local" if self.settings.auth.fail_open else "unavailable"
        return "ok"


def tune_gc() -> None:
    """Move everything built at start-up out of the cyclic collector's reach, and collect less often.

    A request allocates a few hundred container objects (Structs, dicts, coroutines, futures);
    with the default threshold (700) the collector ran every few requests, and each full
    collection walked every object the service holds for its lifetime — modules, the app, the
    catalog snapshot, SQLAlchemy's tables. `gc.freeze()` after start-up parks those in a
    permanent generation; a young-generation threshold of 20,000 still collects the few
    per-request cycles (exceptions with tracebacks, cancelled tasks) within a few dozen
    requests. Together +13 % throughput at 32 connections (bench/RESULTS.md).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(_GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


async def prepare_database(settings: Settings, engine: AsyncEngine) -> bool:
    """Migrate (when configured: SQLite by default) and sync the catalog files into SQL. The files
    are read first: a catalog error must not leave behind a database this start created.

    With the database unreachable both are skipped with a warning and this returns False: the
    service starts anyway (the catalog from the copy saved beside the journal, rows waiting in
    the journal) and the next start with the database up migrates and syncs."""
    catalog = (
        load_catalog(settings.catalog.files, Path(settings.base_dir), settings.source)
        if settings.catalog.sync_on_start
        else None
    )
    try:
        await schema_ready(settings.database.url, migrate=settings.migrate_on_start)
        if catalog is not None:
            await sync_catalog(engine, catalog)
    except Exception as exc:
        if not database_unreachable(exc) or statement_timed_out(exc):  # one that cancels a migration answers
            raise
        get_logger("switchyard").warning(
            "database_unreachable", error=type(exc).__name__, skipped="migrations and catalog sync"
        )
        return False
    return True


def _discard(_record: LedgerRecord, _encoded: bytes) -> None:
    """The ledger switched off (`[ledger] enabled = false`, for benchmarks only)."""
