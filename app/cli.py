"""The `switchyard` console script (config.md): serve, db upgrade/downgrade, catalog sync, mock-upstream.

Exit codes: 0 success, 2 bad usage or invalid configuration (the message names the key), 1 anything
else. `serve` prepares the database once in the parent process (migrations on the embedded SQLite
default, catalog sync) and then starts the workers, which only read; so N workers never race each
other on the schema or the catalog.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from app.settings import ConfigError, Settings, find_config, load_settings
from catalog.database import open_engine
from catalog.files import CatalogFileError, load_catalog
from catalog.migrate import downgrade, upgrade, upgrade_async
from catalog.sync import sync_catalog


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description="A unified completion API gateway.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the service")
    _config_option(serve)
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--workers", type=int)

    db = commands.add_parser("db", help="database schema").add_subparsers(dest="db_command", required=True)
    _config_option(db.add_parser("upgrade", help="apply Alembic migrations"))
    down = db.add_parser("downgrade", help="revert Alembic migrations")
    _config_option(down)
    down.add_argument("revision", help="target revision, e.g. base or -1")

    catalog = commands.add_parser("catalog", help="the SQL price catalog").add_subparsers(
        dest="catalog_command", required=True
    )
    _config_option(catalog.add_parser("sync", help="load catalog files into SQL (idempotent)"))

    commands.add_parser("mock-upstream", help="a scripted OpenAI-compatible upstream", add_help=False)
    return parser


def _config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config file (default: $SWITCHYARD_CONFIG, ./config.toml, bundled example)")


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["mock-upstream"]:
        from devtools import mock_upstream

        return mock_upstream.main(args_list[1:])
    try:
        args = _parser().parse_args(args_list)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        return _dispatch(args)
    except (ConfigError, CatalogFileError) as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 1
    except Exception as exc:
        print(f"switchyard: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    if args.command == "serve":
        return _serve(args, settings)
    if args.command == "db":
        if args.db_command == "upgrade":
            upgrade(settings.database.url)
        else:
            downgrade(settings.database.url, args.revision)
        return 0
    report = asyncio.run(_sync(settings))
    print(msgspec.json.encode(report).decode())
    return 0


async def _sync(settings: Settings) -> object:
    """Like `serve`, bring the embedded SQLite schema up to date first (`auto_migrate`)."""
    catalog = load_catalog(settings.catalog.files, Path(settings.base_dir))
    if settings.migrate_on_start:
        await upgrade_async(settings.database.url)
    engine = open_engine(settings.database.url)
    try:
        return await sync_catalog(engine, catalog)
    finally:
        await engine.dispose()


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from app.application import create_app
    from app.edge.connection import protocol_factory
    from app.service import prepare_database

    server = settings.server
    host = args.host or server.host
    port = args.port if args.port is not None else server.port
    workers = args.workers or server.workers
    settings = msgspec.structs.replace(settings, server=msgspec.structs.replace(server, workers=workers))

    async def prepare() -> None:
        engine = open_engine(settings.database.url)
        try:
            await prepare_database(settings, engine)
        finally:
            await engine.dispose()

    asyncio.run(prepare())
    # No `server: uvicorn` header: it names our stack to every client, and uvicorn checks each
    # response header against two regular expressions (≈ 2 % of the instructions per request).
    # `http`: uvicorn's httptools protocol with head/body deadlines and header limits.
    common = {
        "host": host,
        "port": port,
        "log_level": "warning",
        "access_log": server.access_log,
        "server_header": False,
        "http": protocol_factory(server),
    }
    try:
        if workers == 1:
            uvicorn.run(create_app(settings, prepare=False), **common)  # type: ignore[arg-type]
            return 0
        os.environ["SWITCHYARD_CONFIG"] = str(find_config(args.config).resolve())
        os.environ["SWITCHYARD_WORKERS"] = str(workers)  # each worker enforces its share of the limits
        uvicorn.run("app.application:create_app_from_env", factory=True, workers=workers, **common)  # type: ignore[arg-type]
    except SystemExit as exc:  # uvicorn exits 1 or 3 when it cannot bind or start up; config.md says 1
        return 1 if exc.code else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
