"""Operator configuration: `config.toml` decoded once into typed, frozen `Settings`.

The file's shape is the contract in config.md. Decoding goes through msgspec so a wrong type or an
unknown enum value fails with the key's path (`providers.local.kind: ...`); the CLI turns that into
exit code 2. Secrets are never written in the file: a provider names the environment variable
that holds its key (`api_key_env`), resolved here. A provider whose variable is unset is kept (so
it is reported at start-up and in `/api/v1/models`) but marked `key_missing` and stays out of
rotation.

Lookup order for the file: `--config`, `$SWITCHYARD_CONFIG`, `./config.toml`, then the bundled
`config.example.toml`. Relative paths (catalog globs, a SQLite file) are relative to the config
file's directory, so a service started from any working directory sees the same files. Without
`[catalog] files` the catalog is the one bundled with the package (a package resource), so a
config copied anywhere (`/etc/switchyard/`) needs no `catalog/` folder beside it.

`[server] access_log` is refused with a message saying why (exit 2): it never printed anything
(uvicorn ran at `warning`), and the canonical `request` line is the access log.
"""

from __future__ import annotations

import os
import re
import tomllib
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Literal, TypeVar
from urllib.parse import unquote

import msgspec
from msgspec import Meta, Struct, field

from app.config_urls import absolute_sqlite_url, database_url_problem, url_problem
from providers.config import KIND_DEFAULTS, ProviderConfig, ProviderKind, Timeouts, WireProfile

BUNDLED_CONFIG = Path(__file__).parent / "config.example.toml"  # the repository's, installed with the package
PROVIDER_NAME = r"^[a-z0-9][a-z0-9_\-]*$"
GPU_HOUR_USD = r"^[0-9]{1,12}(\.[0-9]{1,18})?$"  # a non-negative decimal string that fits the ledger
HOSTED_KINDS = frozenset({"fastrun", "primalabs"})  # vendors that bill per token: no GPU of yours behind them
# Upper bounds of every number a config may set, so that none breaks what is made of it at start-up
# (an `inf` timeout made into milliseconds, a window of 2**63 made into a deque): seconds up to
# about 115 days, counts and sizes up to a 32-bit integer.
MAX_SECONDS = 10_000_000.0
MAX_COUNT = 2**31 - 1
NO_NUL = r"^[^\x00]*$"  # a path or a host name the operating system can take
Seconds = Annotated[float, Meta(gt=0, le=MAX_SECONDS)]
Wait = Annotated[float, Meta(ge=0, le=MAX_SECONDS)]  # may be 0
Count = Annotated[int, Meta(ge=1, le=MAX_COUNT)]


class ConfigError(Exception):
    """Invalid configuration; the message names the file and the key."""


class ProviderPolicy(Struct, frozen=True):
    """How routing treats one provider's backends: this process's share of the configured limits
    (`provider_policy` makes it; the defaults are `ProviderSettings`'s)."""

    max_concurrency: int
    max_queue: int
    queue_timeout_s: float
    failure_cooldown_s: float
    capacity_cooldown_s: float
    max_cooldown_s: float
    breaker_window: int
    breaker_min_samples: int
    breaker_error_ratio: float


class ServerSettings(Struct, frozen=True, forbid_unknown_fields=True):
    host: Annotated[str, Meta(min_length=1, pattern=NO_NUL)] = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 8080
    workers: Annotated[int, Meta(ge=1, le=64)] = 1  # processes on this host (`serve --workers N` sets it)
    replicas: Count = 1  # hosts running this same config against the same upstreams
    max_body_bytes: Annotated[int, Meta(ge=1024, le=MAX_COUNT)] = 10 * 1024 * 1024
    sse_keepalive_s: Seconds = 15.0
    header_timeout_s: Seconds = 10.0  # request line and headers, from the first byte (or connect)
    body_timeout_s: Seconds = 60.0  # the whole body, from the end of the headers
    keep_alive_s: Seconds = 5.0  # an idle kept-alive connection is closed after this (uvicorn's default)
    max_header_bytes: Annotated[int, Meta(ge=1024, le=MAX_COUNT)] = 32 * 1024  # request line and headers; more is 431
    max_headers: Annotated[int, Meta(ge=8, le=MAX_COUNT)] = 100  # header fields; more is 431
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class DatabaseSettings(Struct, frozen=True, forbid_unknown_fields=True):
    url: str = "sqlite+aiosqlite:///switchyard.db"
    auto_migrate: bool | None = None  # default: True on SQLite, False elsewhere (`switchyard db upgrade`)


class AuthSettings(Struct, frozen=True, forbid_unknown_fields=True):
    """`none`: anyone who reaches the port may call (local development); `keys`: access.md."""

    mode: Literal["none", "keys"] = "none"
    admin_key_env: str = "SWITCHYARD_ADMIN_KEY"  # the admin key's secret, for /api/v1/keys and all usage
    fail_open: bool = False  # limited keys with Redis unreachable: 503 (false) or each process's share (true)


class CatalogSettings(Struct, frozen=True, forbid_unknown_fields=True):
    files: list[str] | None = None  # globs, relative to the config file; absent: the catalog bundled with the package
    sync_on_start: bool = True


class LedgerSettings(Struct, frozen=True, forbid_unknown_fields=True):
    enabled: bool = True  # false only to measure what accounting costs (bench/): no rows are written
    queue_size: Count = 10_000
    batch_size: Count = 256
    flush_interval_s: Seconds = 1.0  # a batch has a fixed price (RESULTS.md): fewer is cheaper
    # a directory, relative to the config file
    journal: Annotated[str, Meta(min_length=1, pattern=NO_NUL)] = "switchyard-journal"
    fsync_interval_s: Seconds = 1.0  # a machine crash loses at most this much
    required: bool = True  # no journal, no traffic (503); false: serve, rows held in memory only


class TimeoutSettings(Struct, frozen=True, forbid_unknown_fields=True):
    connect: Seconds = 5.0
    first_byte: Seconds = 120.0
    idle: Seconds = 60.0
    total: Seconds = 600.0


class ProviderSettings(Struct, frozen=True, forbid_unknown_fields=True):
    kind: ProviderKind
    base_url: Annotated[str, Meta(pattern=r"^https?://")]
    api_key_env: str | None = None
    priority: Annotated[int, Meta(ge=-MAX_COUNT - 1, le=MAX_COUNT)] = 0  # as a catalog deployment's
    max_concurrency: Count = 64
    timeouts: TimeoutSettings = field(default_factory=TimeoutSettings)
    max_queue: Annotated[int, Meta(ge=0, le=MAX_COUNT)] = 256
    queue_timeout_s: Wait = 10.0
    failure_cooldown_s: Wait = 2.0
    capacity_cooldown_s: Wait = 1.0
    max_cooldown_s: Wait = 300.0
    breaker_window: Count = 20
    breaker_min_samples: Count = 5
    breaker_error_ratio: Annotated[float, Meta(gt=0, le=1)] = 0.5
    developer_role: bool | None = None
    reasoning_history: bool | None = None
    stream_usage: bool | None = None
    max_completion_tokens: bool | None = None
    sampling_extras: bool | None = None
    continue_final_message: bool | None = None
    # USD per hour of the GPUs behind a self-hosted provider, an exact decimal string (cost.md,
    # `app.pipeline.gpu_time`); refused on the hosted vendors' kinds (`_check_gpu_hour`)
    gpu_hour_usd: Annotated[str, Meta(pattern=GPU_HOUR_USD)] | None = None


class RedisSettings(Struct, frozen=True, forbid_unknown_fields=True):
    """Shared routing state and metrics for several workers and replicas (`app.routing.cluster`)."""

    url: Annotated[str, Meta(pattern=r"^rediss?://")] = "redis://127.0.0.1:6379/0"
    key_prefix: Annotated[str, Meta(min_length=1, pattern=r"^[^\s*?\[\]\\]+$")] = "switchyard"  # no glob characters


class RoutingSettings(Struct, frozen=True, forbid_unknown_fields=True):
    request_deadline_s: Seconds = 300.0  # bounds the whole failover loop
    probe_interval_s: Seconds = 10.0  # health probes and /metrics scrapes
    quota_recheck_s: Wait = 300.0  # a provider out of money stays out this long


class Settings(Struct, frozen=True, forbid_unknown_fields=True):
    server: ServerSettings = field(default_factory=ServerSettings)
    database: DatabaseSettings = field(default_factory=DatabaseSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    catalog: CatalogSettings = field(default_factory=CatalogSettings)
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    routing: RoutingSettings = field(default_factory=RoutingSettings)
    redis: RedisSettings | None = None  # absent: every process keeps its own routing state
    providers: dict[Annotated[str, Meta(pattern=PROVIDER_NAME)], ProviderSettings] = field(default_factory=dict)
    base_dir: str = "."  # the config file's directory; set by `load_settings`
    source: str = ""  # the config file, as errors about its settings name it; set by `load_settings`

    @property
    def journal_dir(self) -> Path:
        """The ledger's journal directory (`catalog.journal`), relative to the config file."""
        return Path(self.base_dir) / self.ledger.journal

    @property
    def migrate_on_start(self) -> bool:
        if self.database.auto_migrate is not None:
            return self.database.auto_migrate
        return self.database.url.startswith("sqlite")


def find_config(explicit: str | None) -> Path:
    if explicit == "":  # `--config "$UNSET"`: not a request for the defaults
        raise ConfigError("--config: an empty path names no file")
    for candidate in (explicit, os.environ.get("SWITCHYARD_CONFIG")):
        if candidate:
            path = Path(candidate)
            if not path.is_file():
                raise ConfigError(f"{candidate}: config file not found")
            return path
    local = Path("config.toml")
    return local if local.is_file() else BUNDLED_CONFIG


def worker_config(explicit: str | None) -> str:
    """The config path `serve --workers` hands its workers: absolute, links kept (in a checkout the
    bundled file is a link, and resolved it was no longer `BUNDLED_CONFIG`: the workers took the
    repository for its directory and opened another SQLite file than the one prepared)."""
    return str(find_config(explicit).absolute())


def load_settings(explicit: str | None = None) -> Settings:
    """The settings of `find_config`'s file; its relative paths (SQLite file, journal, catalog
    globs) are relative to its directory — for the bundled example, to the current directory, as
    if it had been copied there (an installed package's own folder is no place for a database)."""
    path = find_config(explicit)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (TOML is): byte {exc.start} cannot be read") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    base_dir = Path.cwd() if path == BUNDLED_CONFIG else path.resolve().parent
    return settings_from_mapping(raw, base_dir=base_dir, source=str(path))


def settings_from_mapping(raw: dict[str, object], *, base_dir: Path, source: str) -> Settings:
    server = raw.get("server")
    if isinstance(server, dict) and "access_log" in server:
        message = "no longer a setting (the `request` log line is the access log); delete it"
        raise ConfigError(f"{source}: server.access_log: {message}")
    providers = raw.get("providers")
    if isinstance(providers, dict):  # checked one by one first: msgspec names a dict value `[...]`
        for name, entry in providers.items():
            if not re.fullmatch(PROVIDER_NAME, name):
                raise ConfigError(f'{source}: providers."{name}": a provider name is [a-z0-9][a-z0-9_-]*')
            checked = _convert(entry, ProviderSettings, source, f"providers.{name}")
            _check_gpu_hour(checked, source, name)
            _check_provider(checked, source, name)
            _refuse(url_problem(checked.base_url, base=True), source, f"providers.{name}.base_url")
    settings = _convert(raw, Settings, source, "")
    _refuse(database_url_problem(settings.database.url), source, "database.url")
    _refuse(env_name_problem(settings.auth.admin_key_env), source, "auth.admin_key_env")
    if settings.catalog.files == []:  # a sync would empty the catalog: every model gone
        message = "an empty list names no catalog (leave the key out for the catalog bundled with the package)"
        raise ConfigError(f"{source}: catalog.files: {message}")
    if settings.redis is not None:
        _refuse(url_problem(settings.redis.url, numbered_path=True), source, "redis.url")
    url = absolute_sqlite_url(settings.database.url, base_dir)
    _refuse(_sqlite_directory_problem(url), source, "database.url")
    database = msgspec.structs.replace(settings.database, url=url)
    return msgspec.structs.replace(settings, base_dir=str(base_dir), source=source, database=database)


def _refuse(problem: str | None, source: str, key: str) -> None:
    if problem is not None:
        raise ConfigError(f"{source}: {key}: {problem}")


def _check_provider(entry: ProviderSettings, source: str, name: str) -> None:
    """Settings that load but do nothing: a breaker whose window never holds its minimum of
    samples never opens; an empty `api_key_env` named no variable, and the provider ran keyless."""
    if entry.breaker_min_samples > entry.breaker_window:
        window, samples = entry.breaker_window, entry.breaker_min_samples
        message = f"{samples} is more than breaker_window ({window}): it would never open (lower one, raise the other)"
        raise ConfigError(f"{source}: providers.{name}.breaker_min_samples: {message}")
    if entry.api_key_env is not None and not entry.api_key_env.strip():
        raise ConfigError(f"{source}: providers.{name}.api_key_env: names no variable (leave it out for no key)")
    _refuse(env_name_problem(entry.api_key_env), source, f"providers.{name}.api_key_env")


def env_name_problem(name: str | None) -> str | None:
    """A secret is named by its environment variable, never written in the config (config.md): a
    value that is no variable's name (a pasted key, most likely) is refused without being repeated
    (it was logged as "key variable <the secret> is unset")."""
    if name is None or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return None
    return "is not an environment variable's name (letters, digits and _): name the variable that holds the secret"


def _check_gpu_hour(entry: ProviderSettings, source: str, name: str) -> None:
    """`gpu_hour_usd` is for servers you run: `local`, or an `openai_compatible` server you host
    (vLLM, SGLang on your own machines). On a hosted vendor's kind it is refused, not ignored."""
    if entry.gpu_hour_usd is not None and entry.kind in HOSTED_KINDS:
        message = f"only for a provider whose GPUs you run (kind local or openai_compatible), not {entry.kind}"
        raise ConfigError(f"{source}: providers.{name}.gpu_hour_usd: {message}")


def gpu_hour_rates(settings: Settings) -> dict[str, Decimal]:
    """USD per GPU hour of every provider that sets `gpu_hour_usd`, by provider name."""
    providers = settings.providers.items()
    return {name: Decimal(entry.gpu_hour_usd) for name, entry in providers if entry.gpu_hour_usd is not None}


_WIRE_KEYS: tuple[str, ...] = ("developer_role", "reasoning_history", "stream_usage", "max_completion_tokens")
_WIRE_KEYS += ("sampling_extras", "continue_final_message")


def _secret(env: str | None, *, source: str) -> str | None:
    """The secret in the variable `env`, without the surrounding whitespace a mounted secret file
    or an editor leaves (a trailing newline went into the upstream's request head as it was); a
    control character inside it is a ConfigError naming the option, never quoting the value."""
    value = os.environ.get(env) if env else None
    if value is None:
        return None
    value = value.strip()
    if any(not char.isprintable() for char in value):
        raise ConfigError(f"{source}: the variable {env} holds a control character")
    return value or None


def provider_configs(settings: Settings) -> list[ProviderConfig]:
    """Resolve every configured provider into the adapter's config, keys read from the environment."""
    configs = []
    for name, entry in settings.providers.items():
        defaults = KIND_DEFAULTS[entry.kind]
        overrides = {key: value for key in _WIRE_KEYS if (value := getattr(entry, key)) is not None}
        wire: WireProfile = msgspec.structs.replace(defaults, **overrides)
        api_key = _secret(entry.api_key_env, source=f"providers.{name}.api_key_env")
        configs.append(
            ProviderConfig(
                name=name,
                kind=entry.kind,
                base_url=entry.base_url.rstrip("/"),
                api_key=api_key or None,
                priority=entry.priority,
                timeouts=Timeouts(**msgspec.structs.asdict(entry.timeouts)),
                wire=wire,
            )
        )
    return configs


def provider_policy(settings: Settings, name: str) -> ProviderPolicy:
    """The provider's policy as this process enforces it: its share of the concurrency and queue
    limits (`process_share`)."""
    entry = settings.providers[name]
    processes = settings.server.workers * settings.server.replicas
    return ProviderPolicy(
        max_concurrency=process_share(entry.max_concurrency, processes),
        max_queue=process_share(entry.max_queue, processes) if entry.max_queue else 0,
        queue_timeout_s=entry.queue_timeout_s,
        failure_cooldown_s=entry.failure_cooldown_s,
        capacity_cooldown_s=entry.capacity_cooldown_s,
        max_cooldown_s=entry.max_cooldown_s,
        breaker_window=entry.breaker_window,
        breaker_min_samples=entry.breaker_min_samples,
        breaker_error_ratio=entry.breaker_error_ratio,
    )


def process_share(limit: int, processes: int) -> int:
    """One process's part of a limit shared by `processes` processes (workers x replicas).

    Splitting the configured limit statically keeps the total at or below it (but for the floor of
    one per process) with no coordination on the request path; a Redis semaphore would be exact
    but costs a round trip before every request and another after it.
    """
    return max(1, limit // processes)


def key_missing(settings: Settings, name: str) -> bool:
    env = settings.providers[name].api_key_env
    return bool(env) and not (os.environ.get(env or "") or "").strip()  # blank: as `_secret` reads it, no key


_PATH = re.compile(r"^(?P<msg>.*?) - at `\$\.?(?P<path>[^`]*)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`$")
_T = TypeVar("_T")


def _convert(raw: object, kind: type[_T], source: str, prefix: str) -> _T:
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_key_message(str(exc), prefix)}") from None


def _key_message(message: str, prefix: str = "") -> str:
    """msgspec says "Expected `int`, got `str` - at `$.server.port`"; operators want the key first."""
    match = _PATH.match(message)
    path, text = (prefix, message) if match is None else (_join(prefix, match["path"]), match["msg"])
    unknown = _UNKNOWN.match(text)
    if unknown is not None:
        path, text = _join(path, unknown["key"]), "unknown key"
    return f"{path}: {text}" if path else text


def _join(*parts: str) -> str:
    return ".".join(part for part in parts if part)


def _sqlite_directory_problem(url: str) -> str | None:
    """SQLite creates its file, not the directory: a path into one that does not exist was taken
    for a database outage at start-up (the service ran on a saved catalog, recording nothing)."""
    prefix = "sqlite+aiosqlite:///"
    raw = url[len(prefix) :] if url.startswith(prefix) else ""
    if not raw.startswith("/") or "?" in raw:
        return None  # `:memory:`, or a URI SQLite reads itself
    path = unquote(raw)  # as SQLAlchemy reads it (`%41` is `A`)
    directory = Path(path).parent
    try:
        found = directory.is_dir()
    except OSError:  # not ours to search (EACCES): SQLite's own error says so at the first use
        return None
    return None if found else f"the directory {directory} does not exist (SQLite makes the file, not it)"
