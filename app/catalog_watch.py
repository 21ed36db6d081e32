"""A running service follows the SQL catalog: `switchyard catalog sync` while it serves (or any
other change to the catalog tables) is in use within `CATALOG_POLL_S`, without a restart.

Every `CATALOG_POLL_S` the watch reads the whole catalog (models, aliases, deployments, prices: a
few hundred rows, milliseconds, off the request path). When it differs from the catalog in use,
the router routes and prices by it from then on (`Router.replace_snapshot`: backends of the
deployments that stay keep their live state) and it is saved beside the journal, the copy a start
during a database outage uses. A database that cannot be reached is skipped quietly (the ledger
reports outages); the catalog in use stands. So does one that does not answer within
`CATALOG_READ_S` (a connection that stopped answering without closing would otherwise stop the
watch for good: the read is cancelled, which drops that connection, and the next poll takes a new
one).

A catalog with no models is never taken in place of one that has some: a database dropped and made
again (`switchyard db upgrade` on an empty one) while the service ran turned every request into a
400 `unknown model`, which clients do not retry, until someone ran `catalog sync`; the catalog in
use (and its saved copy) stands, `catalog_reload_refused` says why once, and the first sync that
brings models back is taken as any change is.

A price changed in place takes effect `catalog.sync.CHANGE_LEAD` after the sync, longer than this
poll, so every process knows the new row before it applies and each request is priced at the row
in effect when it started. (`tests/gateway/test_catalog_follow.py` checks the two agree.)
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.routing.router import Router, report_unconfigured
from catalog.database import database_unreachable
from catalog.saved_snapshot import save_snapshot
from catalog.snapshot import load_snapshot

CATALOG_POLL_S = 5.0
CATALOG_READ_S = 10.0  # a few hundred rows take milliseconds (module docstring)
EMPTY = "the database's catalog has no models: the one in use stands until `switchyard catalog sync`"


class CatalogWatch:
    def __init__(self, engine: AsyncEngine, router: Router, directory: Path, log: Any) -> None:
        self._engine = engine
        self._router = router
        self._directory = directory
        self._log = log
        self._task: asyncio.Task[None] | None = None
        self._refused = False  # an empty catalog was read and not taken (logged once until it changes)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="catalog-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(CATALOG_POLL_S)
            await self.check()

    async def check(self) -> bool:
        """Load the catalog; True when it changed and is now the one in use."""
        try:
            async with asyncio.timeout(CATALOG_READ_S):
                snapshot = await load_snapshot(self._engine)
        except Exception as exc:  # TimeoutError too: a database out of reach
            if not database_unreachable(exc):
                self._log.warning("catalog_reload_failed", error=type(exc).__name__)
            return False
        if snapshot.same_as(self._router.snapshot):
            return False
        if not snapshot.models and self._router.snapshot.models:  # a database made again, not yet synced
            if not self._refused:
                self._refused = True
                self._log.warning("catalog_reload_refused", models=0, detail=EMPTY)
            return False
        self._refused = False
        self._router.replace_snapshot(snapshot)
        self._log.info("catalog_reloaded", models=len(snapshot.models), prices=len(snapshot.prices))
        report_unconfigured(self._router, self._log)
        try:
            save_snapshot(snapshot, self._directory)
        except OSError as exc:
            self._log.warning("catalog_snapshot_not_saved", error=type(exc).__name__, directory=str(self._directory))
        return True
