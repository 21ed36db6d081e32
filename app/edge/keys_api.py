"""The key-management API (access.md), for automation; the CLI (`app.cli_keys`) does the same.

    POST   /api/v1/keys        admin   a new key: the key object plus `secret` (shown this once)
    GET    /api/v1/keys        admin   every key (revoked ones too), oldest first
    PATCH  /api/v1/keys/{id}   admin   change any option (null clears it)
    DELETE /api/v1/keys/{id}   admin   revoke (the key stays, for its ledger rows)
    GET    /api/v1/keys/me     any key its own object, with `spent_usd` (and `remaining_usd` with a budget)
                                       in the current budget period (all time without a budget)

A change applies in this process at once and reaches the others through Redis (within a second)
or their poll of the table (`app.access.keyring`). With `[auth] mode = "none"` the routes answer
404: there are no keys to manage through a server that does not check them. A body is JSON, its
`Content-Type` checked as the completion doors check it (`app.edge.guards`): a form's body is a 415.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import msgspec
from litestar import HttpMethod, Request, Router, route
from litestar.response import Response
from msgspec import UNSET, Struct, UnsetType

from app.access.keyring import POLL_S, REDIS_POLL_S, announce, unshared_limit
from app.edge.guards import check_json_headers
from app.edge.key_guard import GET_HEAD, caller, rate_window, require_admin, require_key
from app.edge.validation import validation_error
from app.errors import InvalidRequest, NotFound, clip
from app.service import Service
from catalog.exact_sum import decimal_text
from catalog.keys import (
    AMOUNT,
    KEY_ID,
    BudgetPeriod,
    KeyChanges,
    KeyRecord,
    catalog_models,
    checked,
    create_key,
    get_key,
    list_keys,
    parse_expires,
    revoke_key,
    to_builtins,
    update_key,
)
from catalog.usage_query import iso

_JSON = "application/json"
FLUSH_WAIT_S = 2.0  # `/me` waits this long for this process's rows to reach the ledger
_encode = msgspec.json.Encoder().encode


class KeyInput(Struct, forbid_unknown_fields=True):
    """A key's options as JSON: the CLI's options by their field names."""

    name: str | UnsetType = UNSET
    owner: str | UnsetType | None = UNSET
    models: list[str] | UnsetType | None = UNSET
    budget_usd: Decimal | UnsetType | None = UNSET
    budget_period: BudgetPeriod | UnsetType | None = UNSET
    rpm: int | UnsetType | None = UNSET
    tpm: int | UnsetType | None = UNSET
    max_concurrency: int | UnsetType | None = UNSET
    expires: str | UnsetType | None = UNSET
    expires_at: str | UnsetType | None = UNSET  # the name the key object answers with, taken back too


class _BudgetText(Struct):
    budget_usd: msgspec.Raw | UnsetType = UNSET


_decode_input = msgspec.json.Decoder(KeyInput).decode
_decode_budget = msgspec.json.Decoder(_BudgetText).decode


def _changes(body: bytes, current: KeyRecord | None = None) -> KeyChanges:
    try:
        given = _decode_input(body or b"{}")
        _check_budget_text(body)
        expires = _expires(given)
        changes = KeyChanges(
            name=given.name,
            owner=given.owner,
            models=tuple(given.models) if isinstance(given.models, list) else given.models,
            budget_usd=given.budget_usd,
            budget_period=given.budget_period,
            rpm=given.rpm,
            tpm=given.tpm,
            max_concurrency=given.max_concurrency,
            expires_at=parse_expires(expires) if isinstance(expires, str) else expires,
        )
        return checked(changes, current)
    except msgspec.ValidationError as exc:
        unknown = _UNKNOWN_FIELD.match(str(exc))
        if unknown is not None:
            name = clip(unknown[1])
            raise InvalidRequest(f"invalid key: {name}: unknown field", param=name) from None
        error = validation_error(str(exc))
        raise InvalidRequest(f"invalid key: {error.message}", param=error.param) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    except ValueError as exc:  # `checked` and `parse_expires` start their message with the option
        option = str(exc).partition(":")[0]
        raise InvalidRequest(f"invalid key: {exc}", param=option if option in _OPTIONS else None) from None


def _expires(given: KeyInput) -> str | UnsetType | None:
    if given.expires is not UNSET and given.expires_at is not UNSET:
        raise ValueError("expires: give expires or expires_at, not both")
    return given.expires if given.expires is not UNSET else given.expires_at


def _check_budget_text(body: bytes) -> None:
    """A budget given as a string is digits with an optional fraction (`"25.50"`): msgspec reads a
    string with `Decimal()`, which took `"5_0"` for 50 and `" 5"` for 5. A JSON number is exact."""
    raw = _decode_budget(body or b"{}").budget_usd
    if isinstance(raw, msgspec.Raw) and bytes(raw).startswith(b'"'):
        text = msgspec.json.decode(raw, type=str)
        if not AMOUNT.fullmatch(text):
            raise ValueError(f"budget_usd: '{clip(text)}' is not an amount (digits, a point and digits: 25 or 25.50)")


_UNKNOWN_FIELD = re.compile(r"^Object contains unknown field `(.*)`(?: - at `\$`)?$", re.DOTALL)
_OPTIONS = frozenset(KeyInput.__struct_fields__)


def _enforceable(service: Service, changes: KeyChanges) -> None:
    """400 for a limit this deployment cannot keep (`app.access.keyring.unshared_limit`)."""
    problem = unshared_limit(service.settings, changes)
    if problem is not None:
        raise InvalidRequest(f"invalid key: {problem}", param=problem.partition(":")[0])


def _key_id(request: Request[Any, Any, Any]) -> str:
    """The path's key id; 404 for what cannot be one, before any query (a NUL is a PostgreSQL
    error), and never echoing a secret pasted in its place (access.md: no secret in an error)."""
    key_id: str = request.path_params["key_id"]
    if key_id.startswith("sy-"):
        raise NotFound("no such key: that is a key's secret, not its id (`keys list` shows ids: key_…)")
    if KEY_ID.fullmatch(key_id) is None:
        raise NotFound(f"no key '{clip(key_id)}'")
    return key_id


def _models_checked(service: Service, changes: KeyChanges) -> KeyChanges:
    """`changes` with its models as ids of the catalog the service routes by; 400 naming `models`
    for one it does not know."""
    assert service.router is not None
    snapshot = service.router.snapshot

    def resolve(name: str) -> str | None:
        entry = snapshot.resolve(name)
        return entry.id if entry is not None else None

    try:
        return catalog_models(changes, resolve)
    except ValueError as exc:
        raise InvalidRequest(f"invalid key: {exc}", param="models") from None


def _service(request: Request[Any, Any, Any]) -> Service:
    service: Service = request.app.state.service
    if service.access is None or service.engine is None:
        raise NotFound('no such endpoint: API keys are off ([auth] mode = "none")')
    return service


async def _publish(service: Service, record: KeyRecord, event: str) -> None:
    """The change applied here and announced to the other processes, and logged (`event`: the
    admin API's audit trail; the key's id, name and owner, never its secret)."""
    assert service.access is not None
    service.log.info(event, key_id=record.id, name=record.name, owner=record.owner)
    service.access.keyring.apply(record)
    if service.settings.redis is not None and not await announce(service.settings.redis, record.id):
        service.log.warning("key_change_not_announced", key_id=record.id, poll_s=POLL_S, within_s=REDIS_POLL_S)


def _json(data: object, status: int = 200) -> Response[bytes]:
    return Response(_encode(data), status_code=status, media_type=_JSON)


async def create(request: Request[Any, Any, Any]) -> Response[bytes]:
    check_json_headers(request.scope["headers"])
    service = _service(request)
    changes = _changes(await request.body())
    if changes.name is UNSET:
        raise InvalidRequest("invalid key: name is required", param="name")
    _enforceable(service, changes)
    assert service.engine is not None
    record, secret = await create_key(service.engine, _models_checked(service, changes))
    await _publish(service, record, "key_created")
    return _json({**to_builtins(record), "secret": secret}, 201)


async def list_all(request: Request[Any, Any, Any]) -> Response[bytes]:
    service = _service(request)
    assert service.engine is not None
    return _json({"data": [to_builtins(record) for record in await list_keys(service.engine)]})


@route("/me", http_method=GET_HEAD, guards=[require_key])
async def me(request: Request[Any, Any, Any]) -> Response[bytes]:
    service = _service(request)
    entry = caller(request)
    assert entry is not None
    assert service.access is not None
    record = entry.record
    if service.ledger is not None and record.budget_usd is None:  # this process's rows, so the sum includes them
        with contextlib.suppress(TimeoutError):  # the database down: its read below answers 503 at once
            await asyncio.wait_for(service.ledger.flush(), FLUSH_WAIT_S)
    spent, start, end = await service.access.spend(record, datetime.now(UTC))
    # amounts as the usage report prints them (exact, no trailing zeros, whichever store the spend
    # came from), times as every other time of the API (UTC, `Z`)
    view: dict[str, Any] = {**to_builtins(record), "spent_usd": decimal_text(spent)}
    view["period_start"] = iso(start) if start is not None else None
    view["period_end"] = iso(end) if end is not None else None
    if record.budget_usd is not None:
        view["remaining_usd"] = decimal_text(max(Decimal(0), record.budget_usd - spent))
    return _json(view)


async def change(request: Request[Any, Any, Any]) -> Response[bytes]:
    check_json_headers(request.scope["headers"])
    service, key_id = _service(request), _key_id(request)
    assert service.engine is not None
    current = await get_key(service.engine, key_id)
    if current is None:
        raise NotFound(f"no key '{key_id[:64]}'")
    changes = _models_checked(service, _changes(await request.body(), current))
    _enforceable(service, changes)
    record = await update_key(service.engine, key_id, changes)
    if record is None:
        raise NotFound(f"no key '{key_id[:64]}'")
    await _publish(service, record, "key_updated")
    return _json(to_builtins(record))


async def revoke(request: Request[Any, Any, Any]) -> Response[bytes]:
    service, key_id = _service(request), _key_id(request)
    assert service.engine is not None
    record = await revoke_key(service.engine, key_id)
    if record is None:
        raise NotFound(f"no key '{key_id[:64]}'")
    await _publish(service, record, "key_revoked")
    return _json(to_builtins(record))


# One handler a path: Litestar's automatic OPTIONS answer keeps the methods of the first handler
# registered on its path (`Allow: OPTIONS, POST` here, GET left out), so the methods of a path share one.
@route("/", http_method=[*GET_HEAD, HttpMethod.POST], guards=[require_admin], status_code=200)
async def keys(request: Request[Any, Any, Any]) -> Response[bytes]:
    return await (create(request) if request.method == "POST" else list_all(request))


@route("/{key_id:str}", http_method=[HttpMethod.PATCH, HttpMethod.DELETE], guards=[require_admin], status_code=200)
async def one_key(request: Request[Any, Any, Any]) -> Response[bytes]:
    return await (change(request) if request.method == "PATCH" else revoke(request))


router = Router(path="/api/v1/keys", route_handlers=[keys, me, one_key], middleware=[rate_window])
