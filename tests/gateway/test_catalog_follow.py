"""A running gateway follows the SQL catalog (`app.catalog_watch`): a price changed by
`switchyard catalog sync` while it serves prices the requests that start once it is in effect
(`catalog.sync.CHANGE_LEAD` after the sync), with the new row's id in the ledger, and the ones
before it at the old row; a backend that stays keeps its live state; a new deployment is routed to."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

import app.catalog_watch
from app.routing.router import Router
from app.service import Service, prepare_database
from app.settings import Settings, settings_from_mapping
from catalog.database import open_engine
from catalog.migrate import schema_ready, upgrade_async
from catalog.saved_snapshot import read_saved_snapshot
from catalog.sync import CHANGE_LEAD
from tests.catalog.conftest import PG_ADMIN_DSN, PgDatabases
from tests.gateway.conftest import CATALOG, CHAT_1, primary_cost, providers_for
from tests.gateway.test_json_completions import chat_response
from tests.support.catalog import catalog_toml, model, price
from tests.support.cli import run_cli
from tests.support.client import post, user
from tests.support.gateway import StartGateway
from tests.support.tcp_proxy import TcpProxy
from tests.support.upstream import ReplayUpstream, reply_json
from tests.support.waiting import wait_until

CHANGED = catalog_toml(
    CHAT_1,
    model("vision-1", ("primary", "org/vision-1", 10), ("secondary", "vision-1-hosted", 5), capabilities=["vision"]),
    prices=[
        price("primary", "chat-1", "0.70", "0.40", cache_read="0.025"),  # input 0.10 → 0.70
        price("secondary", "chat-1", "1.00", "2.00"),
    ],
)


def sync_changed(tmp_path: Path, url: str, added: int = 1) -> None:
    """`switchyard catalog sync` of `CHANGED` on the database `url`: `added` prices added."""
    (tmp_path / "catalog" / "test.toml").write_text(CHANGED)
    config = tmp_path / "sync.toml"
    config.write_text(f'[database]\nurl = "{url}"\n[catalog]\nfiles = ["catalog/*.toml"]\n')
    synced = run_cli(tmp_path, "catalog", "sync", "--config", str(config))
    assert synced.returncode == 0, synced.stderr
    assert f'"prices_added":{added}' in synced.stdout.replace(" ", "")


def vision_on_secondary(router: Router | None) -> bool:
    """Whether the router follows `CHANGED`: vision-1's new deployment on secondary."""
    assert router is not None
    vision = router.snapshot.resolve("vision-1")
    return vision is not None and vision.deployments[-1].provider == "secondary"


async def test_a_price_synced_while_serving_prices_the_next_requests(
    start_gateway: StartGateway,
    primary: ReplayUpstream,
    secondary: ReplayUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(app.catalog_watch, "CATALOG_POLL_S", 0.05)
    gw = await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG)
    usage = {"prompt_tokens": 100, "completion_tokens": 50}
    primary.set_default(reply_json(200, chat_response({"content": "ok"}, "stop", usage)))
    before = await post(gw, {"model": "chat", "messages": [user("hi")]})
    assert before.json(parse_float=Decimal)["cost_usd"] == primary_cost(100, 50) == Decimal("0.00003")
    assert gw.service.router is not None
    kept = gw.service.router.backends(gw.service.router.snapshot.resolve("chat-1"))[0]  # type: ignore[arg-type]
    kept.state.cool_down(0.0, 1e12, "failure")  # live state that must survive the reload

    sync_changed(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'switchyard.db'}")
    router = gw.service.router
    await wait_until(lambda: vision_on_secondary(router), within=5.0)
    vision = router.backends(router.snapshot.resolve("vision-1"))  # type: ignore[arg-type]
    assert [b.name for b in vision] == ["primary", "secondary"]  # the new deployment is routed to
    chat = router.backends(router.snapshot.resolve("chat-1"))  # type: ignore[arg-type]
    assert chat[0] is kept  # the same backend, still cooled down
    assert kept.state.cooling_until == 1e12
    kept.state.cooling_until = 0.0
    changed = router.snapshot.price_at("primary", "chat-1", datetime.max.replace(tzinfo=UTC))
    assert changed is not None
    assert changed.effective_from > datetime.now(UTC)  # not yet: loaded before it takes effect
    early = await post(gw, {"model": "chat", "messages": [user("hi")]})
    assert early.json(parse_float=Decimal)["cost_usd"] == Decimal("0.00003")
    await asyncio.sleep((changed.effective_from - datetime.now(UTC)).total_seconds() + 0.01)
    after = await post(gw, {"model": "chat", "messages": [user("hi")]})
    assert after.json(parse_float=Decimal)["cost_usd"] == Decimal("0.00009")  # (100 * 0.70 + 50 * 0.40) per million
    rows = await gw.ledger_rows()
    assert [Decimal(row["cost_usd"]) for row in rows] == [Decimal("0.00003")] * 2 + [Decimal("0.00009")]
    assert [row["price_id"] for row in rows] == [1, 1, 3]  # the new row (3) once in effect, not before


async def test_a_database_connection_that_stopped_answering_does_not_stop_the_watch(
    start_gateway: StartGateway,
    primary: ReplayUpstream,
    secondary: ReplayUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read on a connection that never answers again (not closed: a flow a firewall forgot)
    held the watch for good, so no later sync was ever loaded. It gives up after
    `CATALOG_READ_S`, and the next poll reads through a new connection."""
    monkeypatch.setattr(app.catalog_watch, "CATALOG_POLL_S", 0.05)
    monkeypatch.setattr(app.catalog_watch, "CATALOG_READ_S", 0.5)
    databases = PgDatabases()
    url = await databases.create()
    await upgrade_async(url)
    try:
        with TcpProxy(5432) as proxy:
            proxied = url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
            gw = await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG, database_url=proxied)
            proxy.stall()  # the pool's connections; new ones flow
            await asyncio.sleep(0.5)  # a poll is waiting on one of them
            sync_changed(tmp_path, url)  # straight to the database, not through the stalled way
            await wait_until(lambda: vision_on_secondary(gw.service.router), within=10.0)
    finally:
        await databases.drop_all()


def test_a_changed_price_waits_longer_than_the_watch_polls() -> None:
    """Every process has polled the catalog once before a change applies (`catalog.sync`)."""
    assert CHANGE_LEAD.total_seconds() > app.catalog_watch.CATALOG_POLL_S


async def test_an_empty_catalog_is_not_taken_in_place_of_the_one_in_use(
    start_gateway: StartGateway,
    primary: ReplayUpstream,
    secondary: ReplayUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The database dropped and made again while serving (`switchyard db upgrade` on the new, empty
    one: the operator audit): the watch took its empty catalog and every request was a 400 `unknown
    model`, which clients do not retry, until a `catalog sync`. The catalog in use stands, the log
    says why once, and the next sync is taken."""
    monkeypatch.setattr(app.catalog_watch, "CATALOG_POLL_S", 0.05)
    databases = PgDatabases()
    url = await databases.create()
    await upgrade_async(url)
    try:
        gw = await start_gateway(providers=providers_for(primary, secondary), catalog=CATALOG, database_url=url)
        primary.set_default(reply_json(200, chat_response({"content": "ok"}, "stop", {"prompt_tokens": 1})))
        name = make_url(url).database
        admin = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        await upgrade_async(url)
        logged: list[str] = []

        def refused() -> bool:
            lines = capfd.readouterr().out.splitlines()  # `catalog_reload_failed` too, before the upgrade
            logged.extend(line for line in lines if '"catalog_reload_refused"' in line or '"catalog_reloaded"' in line)
            return bool(logged)

        await wait_until(refused, within=5.0, what="the empty catalog refused")
        await asyncio.sleep(0.5)  # ten more polls of the empty catalog
        refused()
        assert [json.loads(line)["event"] for line in logged] == ["catalog_reload_refused"]
        response = await post(gw, {"model": "chat", "messages": [user("hi")]})
        assert response.status_code == 200, response.text
        sync_changed(tmp_path, url, added=2)  # both prices: the database is new
        await wait_until(lambda: vision_on_secondary(gw.service.router), within=5.0)
    finally:
        await databases.drop_all()


async def test_a_process_started_on_an_emptied_catalog_keeps_the_saved_one(
    primary: ReplayUpstream, secondary: ReplayUpstream, tmp_path: Path
) -> None:
    """The database made again and not synced (the watch's case above), then a process starts
    without preparing the database (a worker of `serve --workers` replaced after a crash, or
    SIGHUP's rolling restart): it took the empty catalog, answered every request 400 `unknown
    model`, and saved it over the copy, which a later start without the database then used."""
    (tmp_path / "catalog").mkdir()
    (tmp_path / "catalog" / "test.toml").write_text(CATALOG)

    def settings(name: str) -> Settings:
        raw = {
            "database": {"url": f"sqlite+aiosqlite:///{tmp_path / name}"},
            "catalog": {"files": ["catalog/*.toml"]},
            "providers": providers_for(primary, secondary),
        }
        return settings_from_mapping(raw, base_dir=tmp_path, source="test")

    synced, emptied = settings("synced.db"), settings("emptied.db")
    for config, prepare in ((synced, True), (emptied, False)):
        service, engine = Service(config, prepare=prepare), open_engine(config.database.url)
        if prepare:
            assert await prepare_database(config, engine) is True
        else:
            await schema_ready(config.database.url, migrate=True)  # `db upgrade`: no catalog
        snapshot = await service._load_snapshot(engine)
        await engine.dispose()
        assert "chat-1" in {entry.id for entry in snapshot.models}
    saved = read_saved_snapshot(synced.journal_dir)
    assert saved is not None
    assert "chat-1" in {entry.id for entry in saved.models}
