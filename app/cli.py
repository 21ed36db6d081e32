"""The `switchyard` console script (config.md): serve, db upgrade/downgrade, catalog sync, keys
(`app.cli_keys`), usage (`app.cli_usage`), mock-upstream (and `catalog drift` / `catalog gpu-cost`,
in `app.cli_cost`).

Exit codes: 0 success, 2 bad usage or invalid configuration (the message names the key), 1 anything
else. `serve` prepares the database once in the parent process (migrations on the embedded SQLite
default, catalog sync) and then starts the workers, which only read; so N workers never race each
other on the schema or the catalog. It binds the socket itself and logs `listening` with the bound
address (`url`): with one worker once the app has started, with several once the socket listens.
A `serve` or `catalog sync` that fails before it got going removes the SQLite file it created.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec
import uvicorn
from alembic.util import CommandError

from app import cli_cost, cli_keys, cli_price_import, cli_usage
from app.logging import LineWriter, configure_logging, get_logger, route_stdlib_logging
from app.settings import ConfigError, Settings, load_settings, provider_configs, worker_config
from app.workers import Workers
from catalog.database import open_engine, sqlite_file
from catalog.files import CatalogFileError, load_catalog
from catalog.keys import list_keys
from catalog.migrate import downgrade, schema_ready, upgrade
from catalog.saved_snapshot import read_saved_keys, read_saved_snapshot
from catalog.sync import sync_catalog


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description="A unified completion API gateway.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the service")
    _config_option(serve)
    serve.add_argument("--host", help="address to listen on (default: [server] host)")
    serve.add_argument(  # the ranges of [server] port and workers
        "--port", type=_within(0, 65535), help="port to listen on, 0 for any free one (default: [server] port)"
    )
    serve.add_argument(
        "--workers",
        type=_within(1, 64),
        help="worker processes, 1 to 64 (default: [server] workers; several need [redis] for limits)",
    )

    db = commands.add_parser("db", help="database schema").add_subparsers(dest="db_command", required=True)
    _config_option(db.add_parser("upgrade", help="apply Alembic migrations"))
    down = db.add_parser("downgrade", help="revert Alembic migrations")
    _config_option(down)
    down.add_argument("revision", help="target revision, e.g. base or -1")

    catalog = commands.add_parser("catalog", help="the SQL price catalog").add_subparsers(
        dest="catalog_command", required=True
    )
    _config_option(catalog.add_parser("sync", help="load catalog files into SQL (idempotent)"))
    cli_cost.register(catalog, _config_option)
    cli_price_import.register(catalog, _config_option)

    cli_usage.add_parser(commands)
    cli_keys.add_parser(commands, _config_option)
    commands.add_parser("mock-upstream", help="a scripted OpenAI-compatible upstream", add_help=False)
    return parser


def _within(low: int, high: int) -> Callable[[str], int]:
    """An integer option in [low, high]; anything else is argparse's usage error (exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, not {value}")
        return value

    return parse


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
        code = _dispatch(args)
        sys.stdout.flush()  # here, where a reader gone is caught, not at the interpreter's exit
        return code
    except (ConfigError, CatalogFileError) as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 1
    except BrokenPipeError:  # the reader went away (`| head`): quietly, with the status of a shell tool
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush is not an error
        return 141  # 128 + SIGPIPE: not a success (`keys create`'s secret never reached anyone)
    except Exception as exc:
        print(f"switchyard: {_reason(exc)}", file=sys.stderr)
        return 1


def _reason(exc: Exception) -> str:
    """An error's type and message; for SQLAlchemy's wrapper of a driver's error, the driver's own,
    without the statement, its parameters and the "Background on this error" link."""
    orig = getattr(exc, "orig", None)
    if isinstance(orig, Exception) and type(exc).__module__ == "sqlalchemy.exc":
        return f"database error: {str(orig).strip() or type(orig).__name__}"
    return f"{type(exc).__name__}: {exc}"


def _dispatch(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    if args.command == "serve":
        return _serve(args, settings)
    if args.command == "usage":
        return cli_usage.run(args, settings)
    if args.command == "keys":
        return cli_keys.run(args, settings)
    if args.command == "db":
        if args.db_command == "upgrade":
            upgrade(settings.database.url)
            return 0
        try:
            downgrade(settings.database.url, args.revision)
        except CommandError as exc:  # a revision that does not exist, or is above the database's: bad usage
            print(f"switchyard db downgrade: {args.revision}: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "catalog" and args.catalog_command in cli_cost.COMMANDS:
        return cli_cost.run(args, settings)
    if args.command == "catalog" and args.catalog_command == cli_price_import.COMMAND:
        return cli_price_import.run(args, settings)
    with _StartGuard(settings.database.url) as guard:
        report = asyncio.run(_sync(settings))
        guard.started = True
    print(msgspec.json.encode(report).decode())
    return 0


async def _sync(settings: Settings) -> object:
    """Like `serve`, bring the embedded SQLite schema up to date first (`auto_migrate`)."""
    catalog = load_catalog(settings.catalog.files, Path(settings.base_dir), settings.source)
    await schema_ready(settings.database.url, migrate=settings.migrate_on_start)
    engine = open_engine(settings.database.url)
    try:
        return await sync_catalog(engine, catalog)
    finally:
        await engine.dispose()


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    server = settings.server
    host = args.host or server.host
    port = args.port if args.port is not None else server.port
    workers = args.workers if args.workers is not None else server.workers
    settings = msgspec.structs.replace(settings, server=msgspec.structs.replace(server, workers=workers))
    if workers > 1:
        os.environ["SWITCHYARD_CONFIG"] = worker_config(args.config)
        os.environ["SWITCHYARD_WORKERS"] = str(workers)  # each worker enforces its share of the limits
    provider_configs(settings)  # a key variable it cannot send (a control character): exit 2, before starting
    config = _uvicorn_config(settings, host, port)
    with _StartGuard(settings.database.url) as guard:
        asyncio.run(_prepare(settings))
        address = f"[{host}]" if ":" in host else host
        try:
            sock = _bind(host, port)
        except OSError as exc:  # one line: what, where, and where it was set
            given = "--host/--port" if args.host is not None or args.port is not None else "server.host, server.port"
            why = exc.strerror or str(exc)
            print(f"switchyard: cannot listen on {address}:{port}: {why} ({given})", file=sys.stderr)
            return 1
        try:
            url = f"http://{address}:{sock.getsockname()[1]}"
            if workers == 1:
                sock.set_inheritable(False)  # uvicorn's, for workers it spawns: a child process kept the port open
                single = _Server(config, url, guard)
                # uvicorn re-raises the signal it handled once it has shut down: SIGINT's default is a
                # KeyboardInterrupt, SIGTERM's killed the process (143, where config.md says 0)
                signal.signal(signal.SIGTERM, _terminated)
                with contextlib.suppress(KeyboardInterrupt):
                    single.run(sockets=[sock])
            else:
                sock.listen(config.backlog)  # connections wait in the backlog until a worker is up
                writer = _announce(url, settings)
                guard.started = True
                Workers(config, [sock], writer).run()
        except SystemExit as exc:  # uvicorn exits 1 or 3 when it cannot bind or start up; config.md says 1
            return 1 if exc.code else 0
    return 0 if guard.started else 1


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, as uvicorn's `Config.bind_socket` makes it (address reuse, inheritable
    for the workers it spawns) but raising the error: uvicorn logged it in its own format, then
    exited, so a port in use printed two lines."""
    sock = socket.socket(family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _uvicorn_config(settings: Settings, host: str, port: int) -> uvicorn.Config:
    """uvicorn's settings for `serve`. No `server: uvicorn` header: it names our stack to every
    client, and each header of a head costs (app/edge/cycle.py). No uvicorn access log: the
    canonical `request` line is the access log. `http`: uvicorn's httptools protocol with head/body
    deadlines and header limits (app/edge/connection.py). `proxy_headers=False`: uvicorn's
    middleware rewrites the scope's client and scheme from `X-Forwarded-*`, which nothing here
    reads; it was one more ASGI layer per request."""
    from app.application import create_app
    from app.edge.connection import protocol_factory

    workers = settings.server.workers
    app = create_app(settings, prepare=False) if workers == 1 else "app.application:create_app_from_env"
    if workers == 1:  # uvicorn's own lines, and the libraries', as JSON lines (the parent of several: `_announce`)
        route_stdlib_logging(settings.server.log_level)
    return uvicorn.Config(
        app,
        factory=workers > 1,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
        log_config=None,  # uvicorn's lines reach the root logger: the service's JSON lines (`app.logging`)
        access_log=False,
        server_header=False,
        proxy_headers=False,
        http=protocol_factory(settings.server),  # type: ignore[arg-type]  # a factory works as the class would
    )


async def _prepare(settings: Settings) -> None:
    """Migrate and sync the catalog once, here, before any worker starts (workers only read); with
    the database unreachable, the copies saved beside the journal must be there (catalog, keys)."""
    from app.service import prepare_database

    _check_certificates(settings)
    engine = open_engine(settings.database.url)
    directory = settings.journal_dir  # what is missing is said in one line here, not in a traceback from every worker
    try:
        reachable = await prepare_database(settings, engine)
        if not reachable and read_saved_snapshot(directory) is None:
            raise StartFailed(f"the database is unreachable and no catalog snapshot was saved in {directory}")
        if settings.auth.mode == "keys":
            keys = await list_keys(engine) if reachable else read_saved_keys(directory)
            if keys is None:
                raise StartFailed(f"the database is unreachable and no key snapshot was saved in {directory}")
            cli_keys.check_shared_limits(settings, keys)
    finally:
        await engine.dispose()


def _terminated(_signum: int, _frame: object) -> None:
    """SIGTERM outside uvicorn's own handler (before it starts, or re-raised after its shutdown)."""
    raise SystemExit(0)


def _check_certificates(settings: Settings) -> None:
    """With an `https://` provider, the CAs its connections are verified against must load (a
    file `SSL_CERT_FILE` names that is missing, or holds none, failed every hosted attempt as a
    connection failure, with cool-downs, instead of the start)."""
    import httpx

    if not any(provider.base_url.startswith("https://") for provider in settings.providers.values()):
        return
    try:
        httpx.create_ssl_context()
    except OSError as exc:  # ssl.SSLError too
        where = " ".join(
            f"{name}={os.environ[name]}" for name in ("SSL_CERT_FILE", "SSL_CERT_DIR") if name in os.environ
        )
        raise StartFailed(
            f"the CA certificates for https providers cannot be loaded ({where or 'certifi'}): {exc}"
        ) from exc


class StartFailed(Exception):
    """The service cannot start; the message says why (printed as one line, exit 1)."""


class _Server(uvicorn.Server):
    """uvicorn's server, logging `listening` (with the bound address) once the app has started;
    uvicorn's own line is plain text, below the `warning` level it runs at. It tells `guard` the
    start succeeded there and then, however `run` ends (a SIGTERM's `SystemExit` skips what follows
    it, and the guard took the run for a failed start and removed the database it had created)."""

    def __init__(self, config: uvicorn.Config, url: str, guard: _StartGuard) -> None:
        super().__init__(config)
        self.url = url
        self.guard = guard

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.guard.started = True
            get_logger("switchyard").info(f"listening on {self.url}", url=self.url)


def _announce(url: str, settings: Settings) -> LineWriter:
    """`listening`, from the parent of several workers, in the service's JSON log format; and,
    without `[redis]`, that each worker's `/metrics` is its own (README, several workers). The
    parent's log, for what it says later."""
    writer = configure_logging(settings.server.log_level)
    route_stdlib_logging(settings.server.log_level)
    log = get_logger("switchyard")
    log.info(f"listening on {url}", url=url)
    if settings.redis is None:
        log.warning(
            "metrics_per_worker",
            workers=settings.server.workers,
            detail="without [redis] each worker's /metrics is its own: a scrape reads whichever worker answers",
        )
    writer.flush()
    return writer


class _StartGuard:
    """Removes the SQLite file the database URL names (with its -wal, -shm and -journal files)
    when this command created it and did not get as far as `started`: a failed start, whatever
    the cause, leaves no database file behind."""

    def __init__(self, url: str) -> None:
        name = sqlite_file(url)
        path = Path(name) if name is not None else None
        self.created = path if path is not None and not path.exists() else None
        self.started = False

    def __enter__(self) -> _StartGuard:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.created is None or self.started:
            return
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{self.created}{suffix}").unlink()


if __name__ == "__main__":
    raise SystemExit(main())
