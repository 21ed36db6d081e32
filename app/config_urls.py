"""The URLs of `config.toml` checked before anything connects: `database_url_problem` and
`url_problem` (a provider's `base_url`, `[redis] url`) say what is wrong, or None; `app.settings`
names the key and the file (config.md: exit 2).

Parsed with `urllib`, not SQLAlchemy's parser: reading a config imports no SQL
(tests/test_architecture.py).
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlsplit

DATABASE_SCHEMES = ("sqlite+aiosqlite://", "postgresql+asyncpg://")  # the two async drivers installed
DATABASE_FORM = "must be sqlite+aiosqlite:///PATH or postgresql+asyncpg://USER@HOST:PORT/DB"
# SQLAlchemy's pysqlite arguments; asyncpg.connect's that a URL can spell as text (`command_timeout`
# asyncpg reads with `float`; not `timeout`, which the service sets, nor the numbers and objects
# asyncpg takes only as Python values), and SQLAlchemy's own `prepared_statement_cache_size`.
# tests/test_cli_config.py checks them against asyncpg.
SQLITE_URL_ARGUMENTS = frozenset(
    {"uri", "timeout", "isolation_level", "detect_types", "check_same_thread", "cached_statements"}
)
_ESCAPE = "percent-encode `/`, `?`, `#` and `@` in a user or password: `%2F`, `%3F`, `%23`, `%40`"
_TRUE = frozenset({"true", "1", "yes", "on", "t", "y"})  # SQLAlchemy's `asbool`
POSTGRES_URL_ARGUMENTS = frozenset(
    {"host", "port", "user", "password", "passfile", "service", "servicefile", "database", "ssl", "direct_tls"}
    | {"command_timeout", "target_session_attrs", "krbsrvname", "gsslib", "prepared_statement_cache_size"}
    | {"statement_cache_size"}  # 0 behind a pooler in transaction mode (PgBouncer: catalog.database)
)
_NUMBERS = ("statement_cache_size", "prepared_statement_cache_size")  # counts, which asyncpg takes as ints


def database_url_problem(url: str) -> str | None:
    """One of the two drivers, a URL that parses (its port a number), naming a database (for SQLite
    a file path after the third slash: `sqlite+aiosqlite://db.sqlite` would name a host), with
    only the arguments its driver takes."""
    if not url.startswith(DATABASE_SCHEMES):
        return f"{DATABASE_FORM}, not {url.split(':', 1)[0]!r}"
    parts = urlsplit(url)
    try:
        _port = parts.port
    except ValueError:  # urllib's message quotes the "port": with `/`, `?` or `#` in a password, its start
        return f"not a database URL ({_port_problem(url, parts.netloc)})"
    database = parts.path.removeprefix("/")
    if url.startswith("sqlite") and (parts.netloc or not database):
        return f"{DATABASE_FORM} (a file path after the third slash)"
    if url.startswith("sqlite") and (database == ":memory:" or "mode=memory" in parts.query):
        return "an in-memory SQLite database is gone with its connection: the ledger, keys and catalog need a file"
    if not database:  # the driver would pick one (the user's name): never a Switchyard database by chance
        return f"{DATABASE_FORM} (it names no database)"
    return _arguments_problem(url, parts.query)


def _arguments_problem(url: str, query: str) -> str | None:
    """SQLAlchemy passes a PostgreSQL URL's arguments to `asyncpg.connect` (an unknown one was a
    TypeError at the first connection) and drops a SQLite URL's unknown ones with a warning
    (`?mode=ro` without `uri=true` was silently ignored). The SQLite URI form (`uri=true`) hands
    the rest to SQLite itself."""
    pairs = parse_qsl(query, keep_blank_values=True)
    names = [name for name, _value in pairs]
    sqlite = url.startswith("sqlite")
    if sqlite and any(name == "uri" and value.lower() in _TRUE for name, value in pairs):
        return None
    accepted = SQLITE_URL_ARGUMENTS if sqlite else POSTGRES_URL_ARGUMENTS
    unknown = [name for name in names if name not in accepted]
    if unknown:
        return f"the driver takes no argument {unknown[0]!r} (it takes {', '.join(sorted(accepted))})"
    counts = [
        f"{name}={value}" for name, value in pairs if name in _NUMBERS and not (value.isascii() and value.isdigit())
    ]
    counts += [f"{name} twice" for name in _NUMBERS if names.count(name) > 1]  # a list asyncpg would be given
    if not sqlite and counts:
        return f"{counts[0]}: a statement cache size is a whole number (0 behind PgBouncer in transaction mode)"
    return None


def url_problem(url: str, *, numbered_path: bool = False, base: bool = False) -> str | None:
    """A URL its client can use: a host, a port from 1 to 65535 when given, no whitespace or
    control characters; `numbered_path`: Redis's database number, the whole path (redis-py would
    read `/fifteen` as database 0); `base`: a provider's, which its paths are appended to, so no
    query or fragment (`/v1?x=1/chat/completions`), and no user or password (the key is a header)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # as in `database_url_problem`: never quote what may be a password
        return f"not a URL ({_port_problem(url, parts.netloc)})"
    if any(char.isspace() or not char.isprintable() for char in url):
        return "must not hold spaces or control characters"
    if not parts.hostname:
        return "names no host"
    if port == 0:
        return "port 0 is no port"
    if base and ("?" in url or "#" in url):
        return "must not hold a query or a fragment (`?`, `#`)"
    if base and "@" in parts.netloc:  # httpx made a probe's Basic auth of it, over the provider's key
        return "must not hold a user or password (`user:password@`): the key goes in api_key_env"
    path = parts.path.removeprefix("/")
    if numbered_path and path and not path.isdigit():
        return f"the path is the database number (redis://HOST:PORT/0), not {path!r}"
    return None


def _port_problem(url: str, netloc: str) -> str:
    """Why urllib refused a URL's port: a number out of range (`:99999`, which it was told was no
    number), or not a number (what it took for one may be a password's start: not quoted). An `@`
    after the host is a password's `/`, `?` or `#` that ended it (`u:123456/x@host`): its digits
    are no port."""
    port = netloc.rpartition(":")[2]
    if port.isascii() and port.isdigit() and "@" not in url.partition(netloc)[2]:
        return "the port must be from 1 to 65535"
    return f"the port is not a number; {_ESCAPE}"


def absolute_sqlite_url(url: str, base_dir: Path) -> str:
    """A SQLite URL with a relative path made absolute from `base_dir` (the config file's directory)."""
    prefix = "sqlite+aiosqlite:///"
    if not url.startswith(prefix):
        return url
    path = url[len(prefix) :]
    if not path or path == ":memory:" or path.startswith("/"):
        return url
    # the config's directory goes into a URL: quoted, so a `?`, `#` or `%41` in it stays a path
    # (SQLAlchemy unquotes the database); the operator's own part is URL text already
    relative, mark, query = path.partition("?")
    return (
        prefix
        + posixpath.normpath(quote(str(base_dir.resolve()).rstrip("/"), safe="/") + "/" + relative)
        + mark
        + query
    )
