"""Background health probes: the only way a backend comes back after its breaker opened or its
provider was disabled.

Every `interval` seconds each provider is probed once (`Provider.probe`: `local` tries `/health`,
then `/v1/models`; hosted kinds `/models`, with the key), each on a loop of its own, so a provider
whose probe hangs to the probe's read timeout delays its own next probe, not the others'
(they were gathered in one round, which every provider waited out). The result applies to all of that
provider's backends: a failed probe takes them out of rotation, a successful one closes open
breakers and re-enables a provider that was disabled for a refused key (a probe that itself gets
401 keeps it disabled; a disabled provider is probed on `/models` with the key only, never on an
unauthenticated `/health`) — or for an exhausted balance, but only once `quota_recheck_s` has passed:
a hosted `/models` answers 200 with an empty balance too, and the balance endpoints of the hosts
(primalabs `/credits`) have no documented shape to read it from. A provider whose key variable is unset is never
probed: nothing can change until the operator sets it and restarts. For `local` providers the
server's own queue depth is read from its `/metrics` in the same round; a round that reads none
(a failed probe, `/metrics` failing or without the gauge) sets it to 0, so a depth read once is not
kept against the backend for ever after.

fastrun's and primalabs' `/models` list the models that can serve right now (providers.md): a
backend whose upstream model the list leaves out is out of rotation (`unlisted` in
`GET /api/v1/models`) until a list names it again; an upstream answering "model does not exist"
would otherwise be the client's 400 with no failover. A failed probe, and a backend leaving the
list, wake the requests queued on it (`BackendState.evict`): they go elsewhere or answer 503 now.

Logged once per change, never per round: `probe_failed` when a provider's probe starts failing,
`probe_recovered` when it passes again, `provider_enabled`, `breaker_closed`, `backend_unlisted`
and `backend_listed` (`source="probe"`).

Every worker probes for itself; what a probe changes (a provider re-enabled, a breaker closed) is
announced through the provider's publisher (`app.routing.cluster`), so the other workers follow at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from app.metrics import Metrics
from app.routing.failover import disable_provider
from app.routing.router import Backend, ProviderRuntime, Router
from providers.errors import Failure
from providers.model_prices import plain_model
from providers.openai_stream import SECRET_MIN


class HealthMonitor:
    def __init__(
        self, router: Router, interval: float, log: Any, metrics: Metrics, quota_recheck_s: float = 300.0
    ) -> None:
        self.router = router
        self.metrics = metrics
        self.interval = interval
        self.quota_recheck_s = quota_recheck_s
        self.log = log
        self._task: asyncio.Task[None] | None = None
        self._failing_since: dict[str, float] = {}  # provider -> loop time of its first failed probe
        self._probes: dict[str, int] = {}  # provider -> probes done
        self._first: asyncio.Future[None] | None = None  # the round a readiness check started
        self._unmatched: set[str] = set()  # providers whose model list names none of their models

    @property
    def rounds(self) -> int:
        """How many probes every probed provider has had (0 with none to probe)."""
        return min((self._probes.get(name, 0) for name in self._probed()), default=0)

    def _probed(self) -> list[str]:
        return [name for name, runtime in self.router.providers.items() if not runtime.state.key_missing]

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._first is not None:
            self._first.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._first
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        providers = self.router.providers
        await asyncio.gather(*(self._every(providers[name]) for name in self._probed()))

    async def _every(self, runtime: ProviderRuntime) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self._probe(runtime)

    async def first_round(self, wait: float) -> None:
        """Before the first probe round has ended: one round, shared by every caller (each
        readiness check used to start its own against the upstreams), waited for at most `wait`
        seconds (a probe that hangs has 10 s; an orchestrator's readiness check, often 1 s)."""
        if self.rounds:
            return
        if self._first is None:
            self._first = asyncio.ensure_future(self.probe_all())
            self._first.add_done_callback(self._first_done)
        await asyncio.wait({self._first}, timeout=wait)

    def _first_done(self, round_: asyncio.Future[None]) -> None:
        """A first round that did not end (a bug, a stop): the next readiness check starts another."""
        if round_.cancelled() or round_.exception() is not None:
            if not round_.cancelled():
                self.log.error("probe_round_failed", exc_info=round_.exception())
            self._first = None

    async def probe_all(self) -> None:
        providers = self.router.providers
        await asyncio.gather(*(self._probe(providers[name]) for name in self._probed()))

    async def _probe(self, runtime: ProviderRuntime) -> None:
        error: Exception | None = None
        listed: frozenset[str] | None = None
        try:
            failure, listed = await runtime.adapter.probe_report(keyed=runtime.state.disabled_reason is not None)
            if failure == Failure.LOCAL.value:  # the gateway's own descriptors ran out: says nothing of the upstream
                self.log.warning("probe_skipped", provider=runtime.config.name, reason=failure)
                self._probes[runtime.config.name] = self._probes.get(runtime.config.name, 0) + 1  # a round all the same
                return
            ok = failure is None
            depth = await runtime.adapter.queue_depth() if ok and runtime.config.kind == "local" else None
        except Exception as exc:  # a bug, not an unreachable upstream (the adapter answers why)
            ok, depth, error, failure = False, None, exc, None
        now = asyncio.get_running_loop().time()
        name = runtime.config.name
        self._log_transition(name, ok, now, error, failure)
        self.metrics.probes.inc((name, "ok" if ok else "failed"))
        if ok:
            self._reenable(runtime, now)
        elif failure == "401":
            self._refused(runtime, now)
        listed = self._matched(runtime, listed)
        for backend in self.router.backends_of(name):
            self._apply(backend, ok, listed, depth)
        self._probes[name] = self._probes.get(name, 0) + 1

    def _reenable(self, runtime: ProviderRuntime, now: float) -> None:
        state = runtime.state
        if state.disabled_reason is not None and state.may_reenable(now, self.quota_recheck_s):
            self.log.warning(
                "provider_enabled", provider=runtime.config.name, was=state.disabled_reason, source="probe"
            )
            state.enable()
            if runtime.publisher is not None:
                runtime.publisher.provider_enabled(runtime)

    def _refused(self, runtime: ProviderRuntime, now: float) -> None:
        """A probe the upstream answered 401 (the probe with the key, or a server started with one):
        the key is refused, as when a request gets 401 (providers.md: disable, log loudly), not
        merely a failed probe; the first keyed probe that passes brings it back."""
        if runtime.state.ready:
            disable_provider(runtime, "auth: probe got 401", now, self.metrics, self.log, status=401, source="probe")

    def _apply(self, backend: Backend, ok: bool, listed: frozenset[str] | None, depth: float | None) -> None:
        """One probe round's result on one backend: its breaker, queue depth, listing and queue."""
        was_open = backend.state.breaker_open
        backend.state.probe_result(ok)
        if was_open and not backend.state.breaker_open:
            names = {"provider": backend.name, "model": backend.model_id, "upstream_model": backend.upstream_model}
            self.log.info("breaker_closed", **names, source="probe")
            if backend.provider.publisher is not None:
                backend.provider.publisher.breaker_changed(backend)
        backend.state.queue_depth = depth or 0.0  # none read this round: not the last one read, kept forever
        if ok:
            self._listing(backend, listed)
        else:
            backend.state.evict()

    def _matched(self, runtime: ProviderRuntime, listed: frozenset[str] | None) -> frozenset[str] | None:
        """The list's ids as `plain_model` names, or None when it names none of the provider's upstream
        models: ids in another form than the catalog's (`Alpha/Chat-1`, `models/x`, aliases) would
        take every backend out, so such a list says nothing, logged once (`model_list_unmatched`,
        an error, with some of its ids) until a list matches again."""
        if listed is None:
            return None
        name = runtime.config.name
        names = frozenset(plain_model(entry) for entry in listed)
        if any(plain_model(backend.upstream_model) in names for backend in self.router.backends_of(name)):
            self._unmatched.discard(name)
            return names
        if name not in self._unmatched:
            self._unmatched.add(name)
            key = runtime.config.api_key
            shown = [
                entry[:64] for entry in sorted(listed)[:5] if not (key and len(key) >= SECRET_MIN and key in entry)
            ]
            self.log.error("model_list_unmatched", provider=name, listed=shown, source="probe")
        return None

    def _listing(self, backend: Backend, listed: frozenset[str] | None) -> None:
        """Out of rotation while its provider's model list leaves its upstream model out (no list,
        an empty one or one `_matched` set aside takes nothing out); logged when that changes."""
        unlisted = listed is not None and plain_model(backend.upstream_model) not in listed
        if unlisted == backend.state.unlisted:
            return
        backend.state.unlisted = unlisted
        names = {"provider": backend.name, "model": backend.model_id, "upstream_model": backend.upstream_model}
        if unlisted:
            backend.state.evict()
            self.log.warning("backend_unlisted", **names, source="probe")
        else:
            self.log.info("backend_listed", **names, source="probe")

    def _log_transition(self, provider: str, ok: bool, now: float, error: Exception | None, cause: str | None) -> None:
        """`probe_failed` (with its `cause`: the upstream's status or the transport error's class)
        when a provider's probes start failing, `probe_recovered` when they pass again: one line
        per change, not one per round."""
        since = self._failing_since.get(provider)
        if ok and since is not None:
            del self._failing_since[provider]
            self.log.warning("probe_recovered", provider=provider, failing_s=round(now - since, 3))
        elif not ok and since is None:
            self._failing_since[provider] = now
            if error is None:
                self.log.warning("probe_failed", provider=provider, cause=cause, error=None)
            else:
                self.log.error("probe_failed", provider=provider, error=type(error).__name__, exc_info=error)
