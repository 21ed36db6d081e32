"""Who sees what in the reports (access.md "Who sees what", cost.md): with keys, a non-admin key's
usage report holds its own rows only, grouped by owner too; the admin key sees every key's; the
fleet-wide cost reports (drift, GPU cost) are the admin's; the spend page asks a browser for the
key (HTTP Basic, the key as the password) and shows what that key may see."""

from __future__ import annotations

import base64

from tests.access.conftest import ADMIN, MakeKey, bearer
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import GatewayHandle
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream


def basic(secret: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"user:{secret}".encode()).decode()}


async def _spend(gw: GatewayHandle, up: ReplayUpstream, make_key: MakeKey) -> tuple[dict[str, str], dict[str, str]]:
    """Two keys of two owners: team-a sends two requests, team-b one ($0.000005 each)."""
    up.set_default(answer("ok"))  # 3 input and 1 output tokens: $0.000005 at $1/$2 per million
    a, b = await make_key(owner="team-a"), await make_key(owner="team-b")
    for secret in (a["secret"], a["secret"], b["secret"]):
        assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(secret))).status_code == 200
    await gw.ledger_rows()
    return a, b


async def test_a_key_sees_its_own_usage_and_the_admin_sees_all(
    gw: GatewayHandle, up: ReplayUpstream, make_key: MakeKey
) -> None:
    a, b = await _spend(gw, up, make_key)
    own = (await gw.client.get("/api/v1/usage?group_by=key,owner", headers=bearer(a["secret"]))).json()
    assert [(r["key"], r["owner"], r["requests"], r["cost_usd"]) for r in own["rows"]] == [
        (a["id"], "team-a", 2, "0.00001")
    ]
    assert own["totals"]["requests"] == 2
    everyone = (await gw.client.get("/api/v1/usage?group_by=owner", headers=bearer(ADMIN))).json()
    assert [(r["owner"], r["requests"], r["cost_usd"]) for r in everyone["rows"]] == [
        ("team-a", 2, "0.00001"),
        ("team-b", 1, "0.000005"),
    ]
    # Asking for another key's rows by filter gives nothing: the restriction is applied on top.
    other = (await gw.client.get(f"/api/v1/usage?key={b['id']}", headers=bearer(a["secret"]))).json()
    assert other["totals"]["requests"] == 0
    assert (await gw.client.get("/api/v1/usage")).status_code == 401


async def test_the_cost_reports_are_the_admins(gw: GatewayHandle, make_key: MakeKey) -> None:
    key = await make_key()
    for path in ("/api/v1/catalog/drift", "/api/v1/catalog/gpu-cost"):
        refused = await gw.client.get(path, headers=bearer(key["secret"]))
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert (error["type"], error["message"]) == (
            "permission_error",
            "this API key may not read this report: use the admin key",
        )
        assert (await gw.client.get(path, headers=bearer(ADMIN))).status_code == 200
        assert (await gw.client.get(path)).status_code == 401


async def test_the_spend_page_asks_for_a_key(gw: GatewayHandle, up: ReplayUpstream, make_key: MakeKey) -> None:
    a, b = await _spend(gw, up, make_key)
    asked = await gw.client.get("/usage")
    assert asked.status_code == 401
    assert asked.headers["www-authenticate"] == 'Basic realm="switchyard usage", charset="UTF-8"'
    wrong = await gw.client.get("/usage", headers=basic(a["secret"] + "x"))
    assert (wrong.status_code, "www-authenticate" in wrong.headers) == (401, True)
    page = await gw.client.get("/usage?group_by=key", headers=basic(a["secret"]))
    assert page.status_code == 200
    assert a["id"] in page.text
    assert b["id"] not in page.text
    admin_page = await gw.client.get("/usage", headers=basic(ADMIN))
    assert a["id"] in admin_page.text
    assert b["id"] in admin_page.text


async def test_a_basic_credential_counts_on_the_spend_page_only(gw: GatewayHandle, make_key: MakeKey) -> None:
    """A browser sends a cached Basic credential with another site's form POST too: anywhere but
    the page's own routes it would let that site create keys or spend with the admin's key."""
    key = await make_key()
    assert (await gw.client.get("/usage", headers=basic(ADMIN))).status_code == 200
    form = {**basic(ADMIN), "content-type": "text/plain"}  # what `<form enctype="text/plain">` sends
    created = await gw.client.post("/api/v1/keys", headers=form, content=b'{"name": "csrf"}')
    assert (created.status_code, created.json()["error"]["type"]) == (401, "authentication_error")
    assert (await gw.client.get("/api/v1/keys/me", headers=basic(key["secret"]))).status_code == 401
    spent = await gw.client.post(COMPLETIONS, json=body("chat"), headers=basic(key["secret"]))
    assert spent.status_code == 401
    listed = (await gw.client.get("/api/v1/keys", headers=bearer(ADMIN))).json()
    assert [item["name"] for item in listed["data"]] == [key["name"]]


async def test_the_keys_api_takes_a_json_body_only(gw: GatewayHandle) -> None:
    as_form = {**bearer(ADMIN), "content-type": "text/plain"}
    refused = await gw.client.post("/api/v1/keys", headers=as_form, content=b'{"name": "form"}')
    assert (refused.status_code, refused.json()["error"]["type"]) == (415, "invalid_request_error")
    made = await gw.client.post("/api/v1/keys", headers=bearer(ADMIN), json={"name": "json"})
    assert made.status_code == 201
    changed = await gw.client.patch(f"/api/v1/keys/{made.json()['id']}", headers=as_form, content=b'{"rpm": 1}')
    assert changed.status_code == 415
    listed = (await gw.client.get("/api/v1/keys", headers=bearer(ADMIN))).json()
    assert [(item["name"], item["rpm"]) for item in listed["data"]] == [("json", None)]
