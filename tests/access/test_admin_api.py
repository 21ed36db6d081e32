"""The key-management API (`/api/v1/keys`, admin key) and `GET /api/v1/keys/me`; and what a key's
use leaves behind: no secret in any table or log line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import inspect, text

from catalog.ledger_write import write_records
from tests.access.conftest import ADMIN, ADMIN_ENV, CATALOG, MakeKey, bearer, keyed_gateway
from tests.catalog.test_ledger_writer import record
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import GatewayHandle, StartGateway, provider_table
from tests.support.logs import Logs
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream


async def test_create_list_update_revoke(gw: GatewayHandle, up: ReplayUpstream) -> None:
    up.set_default(answer("ok"))
    admin = bearer(ADMIN)
    created = await gw.client.post(
        "/api/v1/keys",
        json={"name": "ci", "owner": "team-a", "models": ["chat"], "budget_usd": "50", "rpm": 600, "tpm": 200000},
        headers=admin,
    )
    assert created.status_code == 201
    key = created.json()
    secret = key.pop("secret")
    assert secret.startswith("sy-")
    assert len(secret) >= 3 + 43  # 32 random bytes, base64url
    assert key["prefix"] == secret[:7]
    assert key["id"].startswith("key_")
    assert {k: key[k] for k in ("name", "owner", "models", "budget_usd", "budget_period", "rpm", "tpm")} == {
        "name": "ci",
        "owner": "team-a",
        "models": ["chat"],
        "budget_usd": "50",
        "budget_period": "month",  # a budget's default period
        "rpm": 600,
        "tpm": 200000,
    }
    listed = (await gw.client.get("/api/v1/keys", headers=admin)).json()["data"]
    assert listed == [key]
    changed = await gw.client.patch(f"/api/v1/keys/{key['id']}", json={"rpm": 1, "models": None}, headers=admin)
    assert (changed.json()["rpm"], changed.json()["models"]) == (1, None)
    assert (await gw.client.post(COMPLETIONS, json=body("other"), headers=bearer(secret))).status_code == 200
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(secret))).status_code == 429
    revoked = await gw.client.delete(f"/api/v1/keys/{key['id']}", headers=admin)
    assert revoked.json()["revoked_at"] is not None
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(secret))).status_code == 401
    missing = await gw.client.patch("/api/v1/keys/key_nope", json={"rpm": 2}, headers=admin)
    assert missing.status_code == 404


async def test_only_the_admin_key_manages_keys(gw: GatewayHandle, make_key: MakeKey) -> None:
    key = await make_key()
    for method, path in (("GET", "/api/v1/keys"), ("POST", "/api/v1/keys"), ("DELETE", f"/api/v1/keys/{key['id']}")):
        response = await gw.client.request(method, path, headers=bearer(key["secret"]))
        assert response.status_code == 403
        assert response.json()["error"]["type"] == "permission_error"
    out_of_range = {"name": "x", "expires": "0001-01-01T00:00:00+14:00"}  # the year 0 in UTC: it was a 500
    for bad in (
        {"name": "x", "rpm": 0},
        {"name": "x", "budget_period": "day"},
        {"name": "x", "expires": "soon"},
        {},
        out_of_range,
    ):
        response = await gw.client.post("/api/v1/keys", json=bad, headers=bearer(ADMIN))
        assert response.status_code == 400, bad


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"name": " "}, "invalid key: name: must not be empty"),
        ({"name": "x", "models": []}, "invalid key: models: name at least one model"),
        ({"name": "x", "models": ["chat", "nosuch"]}, "invalid key: models: unknown model 'nosuch'"),
        ({"name": "x", "budget_usd": "0.0000000000001"}, "invalid key: budget_usd: must be at least 0.000000001"),
        ({"name": "x", "budget_usd": "1", "budget_period": None}, "invalid key: budget_period: a budget needs"),
        ({"name": "x", "budget_usd": "5_0"}, "invalid key: budget_usd: '5_0' is not an amount"),  # it was 50
        ({"name": "x", "budget_usd": " 5"}, "invalid key: budget_usd: ' 5' is not an amount"),
    ],
)
async def test_a_key_is_refused_what_it_could_never_use(
    gw: GatewayHandle, make_key: MakeKey, bad: dict[str, Any], message: str
) -> None:
    """Refused, not stored as written: a blank name, no model at all, a model the catalog does
    not know (a request's model is resolved to its catalog id first, so it would never match), a
    budget below the nano-dollar limits count in (stored as 0), a budget without a period."""
    response = await gw.client.post("/api/v1/keys", json=bad, headers=bearer(ADMIN))
    assert response.status_code == 400, bad
    assert response.json()["error"]["message"].startswith(message)
    key = await make_key(budget_usd="1", budget_period="day")
    cleared = await gw.client.patch(f"/api/v1/keys/{key['id']}", json={"budget_period": None}, headers=bearer(ADMIN))
    assert cleared.status_code == 400
    assert (await gw.client.get("/api/v1/keys", headers=bearer(ADMIN))).json()["data"][0]["budget_period"] == "day"


async def test_an_alias_is_kept_as_its_catalog_id(gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream) -> None:
    up.set_default(answer("ok"))
    key = await make_key(models=["chat-latest", "chat"])
    assert key["models"] == ["chat"]
    headers = bearer(key["secret"])
    assert (await gw.client.post(COMPLETIONS, json=body("chat-latest"), headers=headers)).status_code == 200
    changed = await gw.client.patch(
        f"/api/v1/keys/{key['id']}", json={"models": ["chat-latest"]}, headers=bearer(ADMIN)
    )
    assert changed.json()["models"] == ["chat"]


async def test_me_reports_spend_and_what_is_left(gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream) -> None:
    up.set_default(answer("ok"))  # 3 input and 1 output tokens: $0.000005 at $1/$2 per million
    key = await make_key(budget_usd="0.01", budget_period="day", owner="team-a")
    unbudgeted = await make_key()
    for secret in (key["secret"], key["secret"], unbudgeted["secret"]):
        assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(secret))).status_code == 200
    me = (await gw.client.get("/api/v1/keys/me", headers=bearer(key["secret"]))).json()
    assert (me["id"], me["owner"], me["budget_usd"], me["budget_period"]) == (key["id"], "team-a", "0.01", "day")
    assert (me["spent_usd"], me["remaining_usd"]) == ("0.00001", "0.00999")  # exact, no trailing zeros
    assert me["period_start"].endswith("T00:00:00Z")
    assert me["period_end"].endswith("T00:00:00Z")
    assert "secret" not in me
    assert "secret_hash" not in me
    other = (await gw.client.get("/api/v1/keys/me", headers=bearer(unbudgeted["secret"]))).json()
    assert (other["spent_usd"], "remaining_usd" in other) == ("0.000005", False)  # from the ledger's sum


async def test_a_days_spend_leaves_out_the_next_days_rows(
    gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream
) -> None:
    """A row a replica's clock dated tomorrow counts in tomorrow's spend, not today's as well
    (access.md: the sum of the ledger's costs for that key in the period)."""
    up.set_default(answer("ok"))
    key = await make_key(budget_usd="0.01", budget_period="day")
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    assert gw.service.engine is not None
    ahead = record(1, api_key_id=key["id"], started_at=tomorrow, finished_at=tomorrow, cost_usd=Decimal(1))
    await write_records(gw.service.engine, [ahead])
    me = (await gw.client.get("/api/v1/keys/me", headers=bearer(key["secret"]))).json()
    assert (me["spent_usd"], me["remaining_usd"]) == ("0", "0.01")
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(key["secret"]))).status_code == 200


async def test_no_secret_in_any_table_or_log_line(
    logs: Logs, start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = await keyed_gateway(start_gateway, up, monkeypatch)  # started after `logs`: its lines are captured
    up.set_default(answer("ok"))
    created = await gw.client.post("/api/v1/keys", json={"name": "n", "rpm": 5}, headers=bearer(ADMIN))
    secret = created.json()["secret"]
    for headers in (bearer(secret), {"x-api-key": secret}, bearer(secret + "x"), bearer(ADMIN)):
        await gw.client.post(COMPLETIONS, json=body("chat"), headers=headers)
    await gw.client.get("/api/v1/keys/me", headers=bearer(secret))
    await gw.client.get("/metrics")
    await gw.ledger_rows()
    assert gw.service.engine is not None
    async with gw.service.engine.connect() as conn:
        names = await conn.run_sync(lambda sync: inspect(sync).get_table_names())
        tables = [text(f'SELECT * FROM "{name}"') for name in names]  # noqa: S608  # names from the schema
        dumped = [str(row) for table in tables for row in (await conn.execute(table)).all()]
    assert any(created.json()["id"] in row for row in dumped)
    logs.lines("request", gw)
    metrics = (await gw.client.get("/metrics")).text
    for needle in (secret, secret[3:], secret[7:], ADMIN):
        assert not any(needle in row for row in dumped)
        assert needle not in logs.raw
        assert needle not in metrics


async def test_key_changes_over_the_api_leave_an_audit_trail(
    logs: Logs, start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Creating, changing and revoking a key over HTTP left no line in the log."""
    gw = await keyed_gateway(start_gateway, up, monkeypatch)
    created = await gw.client.post("/api/v1/keys", json={"name": "ci", "owner": "team-a"}, headers=bearer(ADMIN))
    key_id, secret = created.json()["id"], created.json()["secret"]
    changed = await gw.client.patch(f"/api/v1/keys/{key_id}", json={"rpm": 10}, headers=bearer(ADMIN))
    revoked = await gw.client.delete(f"/api/v1/keys/{key_id}", headers=bearer(ADMIN))
    assert (created.status_code, changed.status_code, revoked.status_code) == (201, 200, 200)
    trail = [
        (event, line["key_id"], line["name"], line["owner"])
        for event in ("key_created", "key_updated", "key_revoked")
        for line in logs.lines(event, gw)
    ]
    assert trail == [(event, key_id, "ci", "team-a") for event in ("key_created", "key_updated", "key_revoked")]
    assert secret not in logs.raw
    assert secret[3:] not in logs.raw


LONG = "n" * 201


@pytest.mark.parametrize(
    ("bad", "param", "message"),
    [
        ({"name": LONG}, "name", "invalid key: name: at most 200 characters"),  # PostgreSQL's 500 before
        ({"name": "x", "owner": "team\x00"}, "owner", "invalid key: owner: must not hold control characters"),
        ({"name": "a\x1b[31mb"}, "name", "invalid key: name: must not hold control characters"),
        ({"name": "x", "owner": "team\u202eevil"}, "owner", "invalid key: owner: must not hold control characters"),
        ({"name": "a\u2028b"}, "name", "invalid key: name: must not hold control characters"),
        ({"name": "x", "rpm": 0}, "rpm", "invalid key: rpm: must be from 1 to"),
        ({"name": None}, "name", "invalid key: name: Expected `str`, got `null`"),
        ({"name": "x", "budget_period": "p" * 5000}, "budget_period", "invalid key: budget_period: Invalid enum value"),
        ({"name": "x", "u" * 5000: 1}, "u" * 64 + "…", "invalid key: " + "u" * 64 + "…: unknown field"),
        ({"name": "x", "expires": "soon"}, "expires", "invalid key: expires:"),
        ({"name": "x", "expires": "2027-01-01", "expires_at": "2027-02-01"}, "expires", "invalid key: expires: give"),
    ],
)
async def test_every_refused_option_is_named_and_a_client_value_clipped(
    gw: GatewayHandle, bad: dict[str, Any], param: str, message: str
) -> None:
    response = await gw.client.post("/api/v1/keys", json=bad, headers=bearer(ADMIN))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["message"][: len(message)]) == (param, message)
    assert len(response.content) < 1024  # a 5,000-character value was echoed in full, twice


async def test_an_id_that_is_no_id_is_404_and_a_secret_in_its_place_is_never_echoed(
    logs: Logs, start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NUL in an id was PostgreSQL's error (a 500); a secret pasted for an id (revoking a leaked
    key) was echoed in the 404 and written in the log's path."""
    gw = await keyed_gateway(start_gateway, up, monkeypatch)  # started after `logs`: its lines are captured
    secret = (await gw.client.post("/api/v1/keys", json={"name": "n"}, headers=bearer(ADMIN))).json()["secret"]
    for method in ("PATCH", "DELETE"):
        for key_id in ("key_%00", "admin", secret):
            response = await gw.client.request(method, f"/api/v1/keys/{key_id}", json={}, headers=bearer(ADMIN))
            assert response.status_code == 404, (method, key_id, response.text)
            assert secret[3:] not in response.text
    rejected = [line["path"] for line in logs.lines("request", gw) if line.get("status") == "rejected"]
    assert "/api/v1/keys/sy-…" in rejected
    assert secret[3:] not in logs.raw


async def test_a_limit_several_processes_without_redis_cannot_keep_is_refused_at_once(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve --workers 2` without Redis starts while no key has limits; a key given one over HTTP
    then had every request refused (503 limits cannot be checked): it is refused instead."""
    gw = await keyed_gateway(start_gateway, up, monkeypatch, server={"workers": 2})
    refused = await gw.client.post("/api/v1/keys", json={"name": "l", "rpm": 2}, headers=bearer(ADMIN))
    assert refused.status_code == 400
    assert (refused.json()["error"]["param"], refused.json()["error"]["message"]) == (
        "rpm",
        "invalid key: rpm: limits need [redis] here: 2 processes share them",
    )
    plain = await gw.client.post("/api/v1/keys", json={"name": "p"}, headers=bearer(ADMIN))
    assert plain.status_code == 201
    key_id = plain.json()["id"]
    budget = {"budget_usd": "1"}
    assert (await gw.client.patch(f"/api/v1/keys/{key_id}", json=budget, headers=bearer(ADMIN))).status_code == 400
    assert (
        await gw.client.patch(f"/api/v1/keys/{key_id}", json={"name": "q"}, headers=bearer(ADMIN))
    ).status_code == 200


async def test_options_lists_every_method_of_each_key_path(gw: GatewayHandle) -> None:
    """Litestar's OPTIONS answer kept the first handler's methods only (`OPTIONS, POST` for a path
    that also lists keys)."""
    allowed = {}
    for path in ("/api/v1/keys", "/api/v1/keys/key_x", "/api/v1/keys/me"):
        response = await gw.client.options(path)
        allowed[path] = (response.status_code, response.headers["allow"])
    assert allowed == {
        "/api/v1/keys": (204, "GET, HEAD, OPTIONS, POST"),
        "/api/v1/keys/key_x": (204, "DELETE, OPTIONS, PATCH"),
        "/api/v1/keys/me": (204, "GET, HEAD, OPTIONS"),
    }


READ_ROUTES = (
    "/v1/models",
    "/v1/models/chat",
    "/api/v1/models",
    "/api/v1/usage",
    "/usage",
    "/api/v1/catalog/drift",
    "/api/v1/catalog/gpu-cost",
    "/api/v1/keys/me",
    "/api/v1/keys",
    "/healthz",
    "/readyz",
    "/metrics",
)


async def test_every_read_route_answers_head_as_it_answers_get(gw: GatewayHandle, make_key: MakeKey) -> None:
    """RFC 9110: a server that answers GET answers HEAD, with the same head and no body (a
    monitor probing with HEAD got 405 from every route but the health ones)."""
    key = await make_key(name="reader")
    for path in READ_ROUTES:
        headers = bearer(ADMIN if "catalog" in path or path == "/api/v1/keys" else key["secret"])
        got, head = await gw.client.get(path, headers=headers), await gw.client.head(path, headers=headers)
        assert (path, got.status_code, head.status_code) == (path, 200, 200)
        assert head.content == b""
        assert head.headers["content-type"] == got.headers["content-type"]


async def test_the_admin_secret_pasted_into_a_path_is_masked_in_the_log(
    logs: Logs, start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admin secret of the operator's choosing has no `sy-` prefix to find it by:
    `/v1/models/<admin secret>` was logged as it was. It is masked by its text, `/` and all."""
    chosen = "operator/chosen+admin=9f2c%41"  # a `/` (base64), a `%` (sent as %25)
    monkeypatch.setenv(ADMIN_ENV, chosen)
    auth = {"mode": "keys", "admin_key_env": ADMIN_ENV}
    gw = await start_gateway(providers=provider_table({"up": up}), catalog=CATALOG, auth=auth)
    sent = chosen.replace("%", "%25")
    for path in (f"/v1/models/{sent}", f"/api/v1/usage/{sent}"):
        assert (await gw.client.get(path, headers=bearer(chosen))).status_code == 404
    rejected = [line["path"] for line in logs.lines("request", gw) if line.get("status") == "rejected"]
    assert rejected == ["/v1/models/…", "/api/v1/usage/…"]
    assert chosen not in logs.raw
    assert "9f2c" not in logs.raw


async def test_a_key_objects_expires_at_is_taken_back_on_update(gw: GatewayHandle) -> None:
    """The key object answers `expires_at`; a client that read it and sent it back (PATCH) got
    `expires_at: unknown field`, as only `expires` was taken."""
    created = await gw.client.post("/api/v1/keys", json={"name": "x"}, headers=bearer(ADMIN))
    key_id = created.json()["id"]
    changed = await gw.client.patch(
        f"/api/v1/keys/{key_id}", json={"expires_at": "2027-01-01T00:00:00Z"}, headers=bearer(ADMIN)
    )
    assert changed.status_code == 200, changed.text
    assert created.json()["expires_at"] is None
    assert changed.json()["expires_at"] == "2027-01-01T00:00:00Z"


async def test_a_chunked_body_over_the_limit_on_the_admin_api_states_the_limit(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 413 states the limit it broke (README, `app.errors.too_large`): a chunked body, read by
    the app rather than refused by the connection, was told only "request body too large"."""
    gw = await keyed_gateway(start_gateway, up, monkeypatch, server={"max_body_bytes": 2048})

    async def chunks() -> Any:
        for _ in range(4):
            yield b"x" * 1024

    response = await gw.client.post("/api/v1/keys", content=chunks(), headers=bearer(ADMIN))
    assert response.status_code == 413
    assert response.json()["error"]["message"] == "request body too large (the limit is 2048 bytes)"
