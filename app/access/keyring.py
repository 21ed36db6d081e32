"""Every API key in memory, by the hash of its secret: authentication without a database call.

`authenticate(headers)` reads `Authorization: Bearer <key>` or `x-api-key: <key>` (and, on the
spend page's routes only, an HTTP Basic password), hashes the secret (SHA-256) and looks the hash
up in a dict: the secret is never compared as text. Missing, unknown, revoked and expired keys get
the same 401. The admin key (its secret in the environment variable `[auth] admin_key_env`) is a
key like the others, with the id `admin`, no limits and every right.

Changes reach the ring three ways:
- at once, in the process that made them over HTTP (`apply`);
- through Redis pub/sub (`{prefix}:keys`, the message is the key id) from any process or the
  CLI: the receiver reloads that key from the database — within a second everywhere;
- by polling the table, with Redis or without: every `POLL_S` a look at the table's watermark
  (`catalog.keys.keys_watermark`: its count and latest `updated_at`), reading every key again when
  it moved (and every `REDIS_POLL_S` anyway) — so a change made over HTTP in one worker, or by the
  CLI, reaches every worker within a second whatever Redis does. With Redis the table was read
  every 10 s only: a process whose Redis was down, or whose subscription went silent (a host gone
  without closing the connection), saw a revocation 10 s late.
  A poll that gets no answer in `READ_S` gives up (a connection that stopped answering without
  closing would otherwise stop the polling for good): the read is cancelled, which drops that
  connection, and the next poll takes a new one.

Each read of the table that changed it is saved beside the journal (`catalog.saved_snapshot`), and
a start that cannot reach the database begins from that copy, as the catalog does: a worker that
uvicorn restarted during an outage used to fail its start, and uvicorn then stopped every worker.

`unshared_limit`: the limit a key change would set that this deployment cannot keep (several
processes and no Redis), refused alike by the CLI and the admin API.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import Iterable
from datetime import UTC, datetime
from hashlib import sha256
from pathlib import Path
from typing import Any

from msgspec import UNSET
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.access.worstcase import to_nano
from app.context import Principal
from app.errors import AuthenticationFailed, register_secret
from app.settings import AuthSettings, RedisSettings, Settings
from catalog.database import database_unreachable
from catalog.keys import KeyChanges, KeyRecord, get_key, hash_secret, keys_watermark, list_keys
from catalog.saved_snapshot import read_saved_keys, save_keys

POLL_S = 0.5  # without Redis: how often the table's watermark is read
REDIS_POLL_S = 10.0  # how often the whole table is read again regardless
READ_S = 10.0  # how long a poll may wait for the database (module docstring)
ADMIN_ID = "admin"
INVALID = "invalid or missing API key"
_BEARER = b"bearer "
_BASIC = b"basic "
# the rate headers of a key's windows, their limit filled in once (`Entry.rate_template`)
_REQUESTS = b"x-ratelimit-limit-requests: %d\r\nx-ratelimit-remaining-requests: %%d\r\nx-ratelimit-reset-requests: %%s"
_TOKENS = b"x-ratelimit-limit-tokens: %d\r\nx-ratelimit-remaining-tokens: %%d\r\nx-ratelimit-reset-tokens: %%s"


def keys_channel(redis: RedisSettings) -> str:
    return f"{redis.key_prefix}:keys"


def _basic_password(token: bytes) -> bytes | None:
    """The password of an HTTP Basic credential (`user:password`, base64): the spend page's key."""
    try:
        decoded = base64.b64decode(token, validate=True)
    except ValueError:
        return None
    return decoded.partition(b":")[2] or None


class Entry:
    """A usable key as the edge needs it: the record, its principal, its expiry as a timestamp, and
    its limits as an admission reads them (-1 where the key has none; the budget in nano-dollars),
    computed once per version of the key rather than per request."""

    __slots__ = (
        "admin",
        "budget_nano",
        "concurrency",
        "expires",
        "limited",
        "principal",
        "rate_template",
        "record",
        "rpm",
        "tpm",
    )

    def __init__(self, record: KeyRecord, admin: bool = False) -> None:
        self.record = record
        self.principal = Principal(record.id, record.owner)
        self.expires = record.expires_at.timestamp() if record.expires_at is not None else None
        self.admin = admin
        self.limited = record.limited
        self.budget_nano = to_nano(record.budget_usd) if record.budget_usd is not None else -1
        self.rpm = record.rpm if record.rpm is not None else -1
        self.tpm = record.tpm if record.tpm is not None else -1
        self.concurrency = record.max_concurrency if record.max_concurrency is not None else -1
        windows = [_REQUESTS % self.rpm] if self.rpm >= 0 else []
        if self.tpm >= 0:
            windows.append(_TOKENS % self.tpm)
        self.rate_template = b"\r\n".join(windows)  # `app.access.rate_headers.admission_headers` fills in the rest


class KeyRing:
    def __init__(
        self,
        engine: AsyncEngine,
        auth: AuthSettings,
        redis: RedisSettings | None,
        log: Any,
        saved_in: Path | None = None,
    ) -> None:
        self._engine = engine
        self._saved_in = saved_in  # the journal's directory: the copy of the table (module doc); None: no copy
        self._saved: list[KeyRecord] | None = None  # what was last saved there
        self._redis_settings = redis
        self._log = log
        self._by_hash: dict[bytes, Entry] = {}  # by the raw SHA-256 of the secret (no hex per request)
        self.by_id: dict[str, Entry] = {}
        self.version = 0  # counts changes of `by_id`: what keeps per-key state may drop the gone (`AccessGate`)
        self._revoked: set[str] = set()  # ids of keys seen revoked: a revocation is final (`merge`)
        self._admin: Entry | None = None
        secret = (os.environ.get(auth.admin_key_env) or "").strip()  # as a presented key is (`authenticate`)
        if secret:
            register_secret(secret)
            now = datetime.now(UTC)
            record = KeyRecord(
                id=ADMIN_ID, secret_hash=hash_secret(secret), prefix="", name="admin", created_at=now, updated_at=now
            )
            self._admin = Entry(record, admin=True)
        else:
            log.warning("admin_key_missing", reason=f"{auth.admin_key_env} is unset: /api/v1/keys answers 403")
        self._tasks: list[asyncio.Task[None]] = []

    def authenticate(self, headers: Iterable[tuple[bytes, bytes]], *, basic: bool = False) -> Entry:
        """The entry of the key the headers carry, or 401. `basic`: an HTTP Basic credential's
        password counts too — only on the spend page's routes (`require_page_key`), which a
        browser opens: a browser sends a cached Basic credential with any request to the origin,
        a cross-site form's POST included, so elsewhere it would let another site use the key.

        A secret is hashed as the bytes sent (every key's is ASCII). One that is not ASCII (an
        admin secret of the operator's choosing) may come as UTF-8 (curl) or as Latin-1 (clients
        that encode header text so): the bytes are looked up first, then their Latin-1 text."""
        secret = None
        for name, value in headers:
            if name == b"authorization":
                if value[:7].lower() == _BEARER:
                    secret = value[7:].strip()
                elif basic and value[:6].lower() == _BASIC:
                    secret = _basic_password(value[6:].strip())
            elif name == b"x-api-key":
                secret = value.strip()
        entry = None
        if secret:
            entry = self._by_hash.get(sha256(secret).digest())
            if entry is None and not secret.isascii():
                entry = self._by_hash.get(bytes.fromhex(hash_secret(secret.decode("latin-1"))))
        if entry is None or (entry.expires is not None and entry.expires <= datetime.now(UTC).timestamp()):
            raise AuthenticationFailed(INVALID)
        return entry

    # -- keeping the ring current ------------------------------------------------------------------

    async def start(self) -> None:
        """The keys from the database, or from the saved copy when it cannot be reached (module doc;
        none saved: a `RuntimeError` saying so)."""
        try:
            await self.reload()
        except Exception as exc:
            if self._saved_in is None or not database_unreachable(exc):
                raise
            saved = read_saved_keys(self._saved_in)
            if saved is None:
                message = f"the database is unreachable and no key snapshot was saved in {self._saved_in}"
                raise RuntimeError(message) from exc
            self.merge(saved)
            self._log.warning("keys_from_saved_snapshot", keys=len(saved), directory=str(self._saved_in))
        self._tasks = [asyncio.create_task(self._poll())]
        if self._redis_settings is not None:
            self._tasks.append(asyncio.create_task(self._listen(self._redis_settings)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def reload(self) -> None:
        """Every key from the database (`merge`); saved beside the journal when they changed."""
        records = await list_keys(self._engine)
        self.merge(records)
        if self._saved_in is not None and records != self._saved:
            try:
                save_keys(records, self._saved_in)
            except OSError as exc:  # the ring is current all the same; a start in an outage would miss it
                self._log.warning("keys_snapshot_unsaved", error=type(exc).__name__)
            else:
                self._saved = records

    def merge(self, records: Iterable[KeyRecord]) -> None:
        """The ring rebuilt from a snapshot of the table, without undoing what reached it while the
        snapshot was on its way: `apply` (pub/sub, this process's HTTP) may have brought a newer
        version of a key, a revocation or a new key meanwhile. Keys are never deleted and a
        revocation is final, so a key revoked here stays out, a key held here but not in the
        snapshot is newer than the snapshot, and of two versions of a key the later `updated_at`
        wins, the one held when they are the same (a stale snapshot used to bring a revoked key
        back until the next poll, 10 s with Redis)."""
        held = self.by_id
        entries = [] if self._admin is None else [self._admin]
        seen = set()
        for record in records:
            seen.add(record.id)
            if record.revoked_at is not None:
                self._revoked.add(record.id)
            if record.id in self._revoked:
                continue
            entry = held.get(record.id)  # kept unless the snapshot's is newer (the gate keys its plans by it)
            entries.append(
                entry if entry is not None and entry.record.updated_at >= record.updated_at else Entry(record)
            )
        entries.extend(entry for key_id, entry in held.items() if key_id not in seen and key_id != ADMIN_ID)
        self._by_hash = {bytes.fromhex(entry.record.secret_hash): entry for entry in entries}
        self.by_id = {entry.record.id: entry for entry in entries}
        self.version += 1

    def apply(self, record: KeyRecord) -> None:
        """One key as it now is (revoked: gone from the ring for good); a version older than the
        one held (two reloads of one key answered out of order) changes nothing."""
        if record.id in self._revoked:
            return
        old = self.by_id.get(record.id)
        if old is not None and old.record.updated_at > record.updated_at:
            return
        self.version += 1
        if old is not None:
            del self.by_id[record.id]
            self._by_hash.pop(bytes.fromhex(old.record.secret_hash), None)
        if record.revoked_at is not None:
            self._revoked.add(record.id)
            return
        entry = Entry(record)
        self.by_id[record.id] = self._by_hash[bytes.fromhex(record.secret_hash)] = entry

    async def reload_one(self, key_id: str) -> None:
        record = await get_key(self._engine, key_id)
        if record is not None:
            self.apply(record)

    async def _poll(self) -> None:
        """Read the table again when its watermark (read every `POLL_S`) moved, and every
        `REDIS_POLL_S` anyway (module doc). The watermark is read before the keys, so a change
        made between the two is read again at the next poll."""
        loop = asyncio.get_running_loop()
        seen: tuple[int, datetime | None] | None = None
        read_at = loop.time()
        failing = False  # logged once when reading starts failing, once when it works again
        while True:
            await asyncio.sleep(POLL_S)
            try:
                async with asyncio.timeout(READ_S):
                    mark = await keys_watermark(self._engine)
                    if mark == seen and loop.time() - read_at < REDIS_POLL_S and not failing:
                        continue
                    seen, read_at = mark, loop.time()
                    await self.reload()
            except Exception as exc:  # TimeoutError too  # the database is down: keep the keys known, try again later
                if not failing:
                    self._log.warning("keys_reload_failed", error=type(exc).__name__)
                failing = True
            else:
                if failing:
                    self._log.warning("keys_reload_recovered")
                failing = False

    async def _listen(self, settings: RedisSettings) -> None:
        """Reload the keys named on the channel; after a reconnect, reload them all."""
        while True:
            redis = Redis.from_url(settings.url, socket_connect_timeout=1.0)
            try:
                async with redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(keys_channel(settings))
                    async with asyncio.timeout(READ_S):
                        await self.reload()
                    async for message in pubsub.listen():
                        async with asyncio.timeout(READ_S):
                            await self.reload_one(bytes(message["data"]).decode())
            except (RedisError, OSError):
                await asyncio.sleep(1.0)
            except asyncio.CancelledError:
                raise
            except Exception:
                self._log.exception("keys_listener_failed")
                await asyncio.sleep(1.0)
            finally:
                await redis.aclose()


async def announce(redis: RedisSettings, key_id: str) -> bool:
    """Tell every process to reload `key_id`; False when Redis could not be reached (best effort:
    the poll, every `REDIS_POLL_S`, catches a lost message — the caller says so)."""
    client = Redis.from_url(redis.url, socket_connect_timeout=1.0, socket_timeout=1.0)
    try:
        await client.publish(keys_channel(redis), key_id)
    except (RedisError, OSError, RuntimeError):  # RuntimeError: uvloop's, on a connection Redis reset
        return False
    finally:
        await client.aclose()
    return True


LIMITS = ("budget_usd", "rpm", "tpm", "max_concurrency")


def unshared_limit(settings: Settings, changes: KeyChanges) -> str | None:
    """The message for a limit `changes` set that this deployment cannot keep (None: it can):
    several processes (workers x replicas) count limits in Redis only, `serve` refuses to start
    without it, and a key given one meanwhile had every request refused. The CLI and the admin API
    refuse it alike."""
    server = settings.server
    processes = server.workers * server.replicas
    if settings.auth.mode != "keys" or settings.redis is not None or processes == 1:
        return None  # as `check_shared_limits`: `serve` without keys mode counts no limit
    for option in LIMITS:
        if getattr(changes, option) not in (UNSET, None):
            return f"{option}: limits need [redis] here: {processes} processes share them"
    return None
