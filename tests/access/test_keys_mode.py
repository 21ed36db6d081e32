"""`[auth] mode = "keys"` in one gateway: authentication on every route, model permissions, the
limits' answers and headers, expiry, and what the ledger records (access.md)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from litestar import Litestar
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE

from app.access.keyring import Entry
from app.access.limiter import Verdict
from app.access.rate_headers import duration, rate_headers
from app.edge.cycle import _SPECIAL
from app.edge.key_guard import rate_window, require_admin, require_key, require_page_key
from app.pipeline.events import header_pairs
from catalog.keys import KeyRecord
from tests.access.conftest import ADMIN, MakeKey, bearer
from tests.support.client import COMPLETIONS, body, parse_sse
from tests.support.gateway import GatewayHandle
from tests.support.replies import answer, error, stream_answer
from tests.support.upstream import ReplayUpstream
from tests.support.waiting import wait_until

OPEN = {"/healthz", "/readyz", "/metrics"}
INVALID = "invalid or missing API key"


def _error(response: httpx.Response) -> tuple[int, str, str]:
    error = response.json()["error"]
    return response.status_code, error["type"], error["message"]


async def test_every_route_but_health_and_metrics_needs_a_key(gw: GatewayHandle) -> None:
    app = gw.server.config.app
    assert isinstance(app, Litestar)
    checked = set()
    for route in app.routes:
        path = route.path.replace("{rest:path}", "x").replace("{key_id:str}", "key_x")
        for method in sorted(route.methods - {"HEAD", "OPTIONS"} or {"POST"}):  # a raw ASGI door: POST
            response = await gw.client.request(method, path)
            checked.add((method, path))
            if path in OPEN:
                assert response.status_code != 401, (method, path)
            else:
                assert response.status_code == 401, (method, path, response.text)
                assert INVALID in response.text
    assert ("POST", "/api/v1/completions") in checked
    assert ("POST", "/v1/messages") in checked
    assert ("GET", "/api/v1/keys/me") in checked


async def test_bearer_and_x_api_key_the_same_401_for_every_bad_key(
    gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream
) -> None:
    up.enqueue(answer("one"))
    up.enqueue(answer("two"))
    key = await make_key()
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(key["secret"]))).status_code == 200
    lower = {"authorization": f"bearer {key['secret']}"}
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=lower)).status_code == 200
    revoked = await make_key()
    await gw.client.delete(f"/api/v1/keys/{revoked['id']}", headers=bearer(ADMIN))
    expired = await make_key(expires="2020-01-01")
    for headers in (
        {},
        bearer("sy-" + "x" * 43),
        {"authorization": f"Basic {key['secret']}"},
        {"x-api-key": key["secret"][:-1]},
        bearer(revoked["secret"]),
        {"x-api-key": expired["secret"]},
        {"x-api-key": (key["secret"] + "\u00e9").encode()},  # not ASCII: no match as bytes or as Latin-1 text
        {"authorization": b"Bearer " + key["secret"][:-1].encode() + b"\xff"},
    ):
        response = await gw.client.post(COMPLETIONS, json=body("chat"), headers=headers)
        assert _error(response) == (401, "authentication_error", INVALID), headers
    (row_1, row_2) = await gw.ledger_rows()
    assert row_1["api_key_id"] == row_2["api_key_id"] == key["id"]


async def test_a_key_expires_at_its_time(gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream) -> None:
    up.set_default(answer("ok"))
    soon = (datetime.now(UTC) + timedelta(seconds=1.5)).replace(tzinfo=None).isoformat()
    key = await make_key(expires=soon)  # no offset: UTC
    assert key["expires_at"].startswith(soon[:19])
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(key["secret"]))).status_code == 200

    async def refused() -> bool:
        response = await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(key["secret"]))
        return response.status_code == 401

    await wait_until(refused, within=3.0, what="the key refused once expired")


async def test_a_key_sees_and_uses_only_its_models(gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream) -> None:
    up.set_default(answer("ok"))
    key = await make_key(models=["chat"])
    headers = bearer(key["secret"])
    assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=headers)).status_code == 200
    refused = await gw.client.post(COMPLETIONS, json=body("other"), headers=headers)
    assert _error(refused) == (403, "permission_error", "this API key may not use model 'other'")
    # before routing: a forbidden model is a 403 whether a backend could serve it now or not, and
    # whatever provider the request pins (a 503 or a 400 would tell the caller about it)
    no_backend = await gw.client.post(COMPLETIONS, json=body("idle"), headers=headers)
    assert _error(no_backend) == (403, "permission_error", "this API key may not use model 'idle'")
    pinned = await gw.client.post(COMPLETIONS, json={**body("other"), "provider": "nope"}, headers=headers)
    assert _error(pinned) == (403, "permission_error", "this API key may not use model 'other'")
    served = await gw.client.post(COMPLETIONS, json=body("idle"), headers=bearer(ADMIN))
    assert _error(served)[:2] == (503, "unavailable")  # the admin key may use it: it has no backend
    assert [m["id"] for m in (await gw.client.get("/v1/models", headers=headers)).json()["data"]] == ["chat"]
    assert [m["id"] for m in (await gw.client.get("/api/v1/models", headers=headers)).json()["data"]] == ["chat"]
    assert (await gw.client.get("/v1/models/chat", headers=headers)).json()["id"] == "chat"
    assert (await gw.client.get("/v1/models/other", headers=headers)).status_code == 404  # as if it were not there
    every = (await gw.client.get("/v1/models", headers=bearer(ADMIN))).json()["data"]
    assert [m["id"] for m in every] == ["chat", "free", "idle", "other"]


async def test_a_budget_needs_a_price_on_every_backend(gw: GatewayHandle, make_key: MakeKey) -> None:
    key = await make_key(budget_usd="5")
    refused = await gw.client.post(COMPLETIONS, json=body("free"), headers=bearer(key["secret"]))
    assert _error(refused) == (403, "permission_error", "this model has no price, so a budget cannot be enforced")
    # nor is it listed to that key (access.md: the lists show the models it may use)
    headers = bearer(key["secret"])
    assert [m["id"] for m in (await gw.client.get("/v1/models", headers=headers)).json()["data"]] == ["chat", "other"]
    assert [m["id"] for m in (await gw.client.get("/api/v1/models", headers=headers)).json()["data"]] == [
        "chat",
        "other",
    ]
    assert (await gw.client.get("/v1/models/free", headers=headers)).status_code == 404


async def test_limited_keys_get_openai_headers_on_json_and_streams(
    gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream
) -> None:
    up.enqueue(answer("ok"))
    up.enqueue(stream_answer("ok"))
    key = await make_key(rpm=5, tpm=10_000)
    headers = bearer(key["secret"])
    plain = await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=100), headers=headers)
    streamed = await gw.client.post(COMPLETIONS, json=body("chat", stream=True, max_tokens=100), headers=headers)
    assert parse_sse(streamed.text)[-1][0] == "stream_event"
    # each reserves 89 (input bound) + 100 (max_tokens); the first settled to its 4 real tokens
    for response, left, tokens_left in ((plain, 4, 10_000 - 189), (streamed, 3, 10_000 - 4 - 189)):
        assert response.status_code == 200
        assert response.headers["x-ratelimit-limit-requests"] == "5"
        assert response.headers["x-ratelimit-remaining-requests"] == str(left)
        assert response.headers["x-ratelimit-reset-requests"].endswith("s")
        assert response.headers["x-ratelimit-limit-tokens"] == "10000"
        assert response.headers["x-ratelimit-remaining-tokens"] == str(tokens_left)


async def test_an_upstream_failure_after_admission_still_carries_the_rate_headers(
    gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream
) -> None:
    up.set_default(error(500))
    key = await make_key(rpm=5, tpm=10000)
    failed = await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=10), headers=bearer(key["secret"]))
    assert failed.status_code == 502, failed.text
    assert (failed.headers["x-ratelimit-limit-requests"], failed.headers["x-ratelimit-remaining-requests"]) == (
        "5",
        "4",
    )
    assert failed.headers["x-ratelimit-remaining-tokens"] == str(10000 - 89 - 10)  # its reservation, not yet settled


async def test_tpm_refuses_what_would_exceed_it(gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream) -> None:
    up.set_default(answer("ok"))
    key = await make_key(tpm=1000)
    headers = bearer(key["secret"])
    # 89 (input bound) + 900 reserved, settled to the 4 tokens the upstream counted
    assert (await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=900), headers=headers)).status_code == 200
    refused = await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=910), headers=headers)  # 4 + 999
    assert _error(refused) == (429, "rate_limit_error", "rate limit reached for this API key (tpm)")
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.headers["x-ratelimit-remaining-tokens"] == "996"  # left in the window: less than it asks
    # 1039 on its own: it could never pass, so no Retry-After to wait for (a client would retry forever)
    too_large = await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=950), headers=headers)
    message = (
        "rate limit reached for this API key (tpm): this request alone reserves 1039 tokens (its input and "
        "max_tokens), more than the limit of 1000 a minute; lower max_tokens"
    )
    assert _error(too_large) == (429, "rate_limit_error", message)
    assert "retry-after" not in too_large.headers
    assert too_large.headers["x-ratelimit-limit-tokens"] == "1000"
    again = await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=900), headers=headers)  # 4 + 989
    assert again.status_code == 200
    assert again.headers["x-ratelimit-remaining-tokens"] == str(1000 - 4 - 989)


async def test_a_refusal_tells_the_window_as_it_stands(
    gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream
) -> None:
    """An rpm refusal's token headers are the window's (not zeros), its request headers say when
    a request passes (its Retry-After)."""
    up.set_default(answer("ok"))
    key = await make_key(rpm=1, tpm=10_000)
    headers = bearer(key["secret"])
    assert (await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=100), headers=headers)).status_code == 200
    refused = await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=100), headers=headers)
    assert _error(refused) == (429, "rate_limit_error", "rate limit reached for this API key (rpm)")
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-remaining-tokens"] == str(10_000 - 4)  # the first one settled to 4
    retry = int(refused.headers["retry-after"])
    assert refused.headers["x-ratelimit-reset-requests"] == duration(retry)
    assert refused.headers["x-ratelimit-reset-tokens"].endswith("s")


async def test_a_budget_refusal_tells_the_window_too(gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream) -> None:
    """Every response to a key with limits carries the window (access.md), the budget's 429 too."""
    up.set_default(answer("ok"))
    key = await make_key(rpm=5, tpm=10_000)
    headers = bearer(key["secret"])
    assert (await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=100), headers=headers)).status_code == 200
    budget = {"budget_usd": "0.0001", "budget_period": "total"}
    assert (await gw.client.patch(f"/api/v1/keys/{key['id']}", json=budget, headers=bearer(ADMIN))).status_code == 200
    refused = await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=100), headers=headers)
    assert _error(refused)[:2] == (429, "insufficient_quota")
    assert refused.headers["x-ratelimit-remaining-requests"] == "4"
    assert refused.headers["x-ratelimit-remaining-tokens"] == str(10_000 - 4)  # the first one settled to 4
    assert refused.headers["x-ratelimit-reset-requests"] == refused.headers["x-ratelimit-reset-tokens"]
    assert refused.headers["x-ratelimit-reset-tokens"] != "0ms"
    assert "retry-after" not in refused.headers  # a `total` budget never renews


async def test_rejected_requests_are_in_the_ledger_under_their_key(
    gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream
) -> None:
    up.set_default(answer("ok"))
    key = await make_key(rpm=1, owner="team-a")
    headers = bearer(key["secret"])
    await gw.client.post(COMPLETIONS, json=body("chat"), headers=headers)
    refused = await gw.client.post(COMPLETIONS, json=body("chat"), headers=headers)
    assert _error(refused) == (429, "rate_limit_error", "rate limit reached for this API key (rpm)")
    rows: list[dict[str, Any]] = await gw.ledger_rows()
    assert [(r["api_key_id"], r["status"], r["error_type"]) for r in rows] == [
        (key["id"], "ok", None),
        (key["id"], "error", "rate_limit_error"),
    ]


def test_every_rate_header_the_gate_makes_is_one_uvicorn_would_pass_unchanged() -> None:
    """`write_head` writes a key's `x-ratelimit-*` headers without uvicorn's byte checks (`made`): so
    every name and value `rate_headers` (and the lease's headers, the same `_headers`) can make must
    be one those checks pass unchanged — lowercase, none of uvicorn's special names, no byte its
    patterns refuse — for counts from -1 to 10^12 and resets from 0 to a month."""
    now = datetime.now(UTC)
    record = KeyRecord(
        id="k", name="n", secret_hash="00" * 32, prefix="sy-x", created_at=now, updated_at=now, rpm=10**9, tpm=10**12
    )
    entry = Entry(record)
    for seconds in (0.0, 0.0004, 0.001, 0.5, 0.999, 1.0, 1.5, 59.9999, 60.0, 61.25, 3_599.999, 86_400.0, 2_678_400.0):
        for count in (-1, 0, 7, 10**12):
            for refused in (None, "rpm", "tpm"):
                verdict = Verdict(
                    refused=refused,  # type: ignore[arg-type]
                    retry_after=seconds if refused else None,
                    remaining_requests=count,
                    reset_requests_s=seconds,
                    remaining_tokens=count,
                    reset_tokens_s=seconds,
                )
                block = rate_headers(entry, verdict)
                headers = header_pairs(block)
                assert len(headers) == 6
                assert b"\r\n".join(b": ".join(pair) for pair in headers) == block  # lines, nothing else
                for name, value in headers:
                    assert name == name.lower()
                    assert name not in _SPECIAL
                    assert HEADER_RE.search(name) is None
                    assert HEADER_VALUE_RE.search(value) is None
                    assert re.fullmatch(rb"-?[0-9][0-9.ms]*", value), value


_REQUESTS = [
    (b"x-ratelimit-limit-requests", b"5"),
    (b"x-ratelimit-remaining-requests", b"3"),
    (b"x-ratelimit-reset-requests", b"1.5s"),
]
_TOKENS = [
    (b"x-ratelimit-limit-tokens", b"1000"),
    (b"x-ratelimit-remaining-tokens", b"996"),
    (b"x-ratelimit-reset-tokens", b"20ms"),
]


@pytest.mark.parametrize(
    ("rpm", "tpm", "expected"),
    [
        (5, 1000, _REQUESTS + _TOKENS),
        (5, None, _REQUESTS),
        (None, 1000, _TOKENS),
        (None, None, []),  # a budget or a concurrency cap alone: no window to describe
    ],
)
def test_a_keys_rate_headers_describe_the_windows_it_has(
    rpm: int | None, tpm: int | None, expected: list[tuple[bytes, bytes]]
) -> None:
    now = datetime.now(UTC)
    record = KeyRecord(
        id="k", name="n", secret_hash="00" * 32, prefix="sy-x", created_at=now, updated_at=now, rpm=rpm, tpm=tpm
    )
    verdict = Verdict(remaining_requests=3, reset_requests_s=1.5, remaining_tokens=996, reset_tokens_s=0.02)
    assert header_pairs(rate_headers(Entry(record), verdict)) == expected


def test_every_route_a_key_guard_opens_also_carries_the_window_middleware(gw: GatewayHandle) -> None:
    """The guard reads the window, `rate_window` writes it into the head: a route given the guard
    alone would answer a limited key without its `x-ratelimit-*` headers."""
    app = gw.server.config.app
    assert isinstance(app, Litestar)
    guards = {require_key, require_admin, require_page_key}
    guarded = [
        handler
        for route in app.routes
        for handler in getattr(route, "route_handlers", [getattr(route, "route_handler", None)])
        if handler is not None and guards.intersection(handler.resolve_guards())
    ]
    assert len(guarded) >= 10
    assert [handler.handler_name for handler in guarded if rate_window not in handler.resolve_middleware()] == []


async def test_keys_revoked_leave_no_state_behind(either_limiter: GatewayHandle, up: ReplayUpstream) -> None:
    """A process churning keys (create, use, revoke) kept each one's counters and plans for good:
    7 KB a key, without Redis; with Redis, each one's lane (its encoded commands and lease). What
    is kept is the live keys' alone once a new plan is made."""
    gw = either_limiter
    up.set_default(answer("ok"))
    gate = gw.service.access
    assert gate is not None

    async def used_key(**limits: Any) -> str:
        made = await gw.client.post("/api/v1/keys", json={"name": "k", **limits}, headers=bearer(ADMIN))
        assert made.status_code == 201, made.text
        key = made.json()
        assert (await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(key["secret"]))).status_code == 200
        return str(key["id"])

    for _ in range(20):
        revoked = await gw.client.delete(
            f"/api/v1/keys/{await used_key(rpm=100, tpm=100_000, budget_usd='5')}", headers=bearer(ADMIN)
        )
        assert revoked.status_code == 200, revoked.text
    live = await used_key(rpm=100)
    assert set(gate._local._keys) <= {live}
    assert {entry.record.id for entry, _model, _pin in gate._plans} == {live}
    if gate._shared is not None:
        assert {lane.key_id for lane in gate._shared._lanes.values()} == {live}
    else:
        assert set(gate._local._keys) == {live}


async def test_provider_options_count_toward_the_budget_and_tpm(
    gw: GatewayHandle, make_key: MakeKey, up: ReplayUpstream
) -> None:
    """`provider_options` are merged into the upstream's body, and a `tools` list there is prompt:
    a 200 kB tool description in them was admitted on a $0.50 budget and spent $50, and passed a
    `tpm` of 1,000 with 10,049 tokens. They count toward the input bound now."""
    up.set_default(answer("ok"))
    tool = {"type": "function", "function": {"name": "t", "description": "x" * 3000, "parameters": {"type": "object"}}}
    options = {"provider_options": {"up": {"tools": [tool]}}}
    budgeted = bearer((await make_key(budget_usd="0.002", budget_period="total"))["secret"])
    small = await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=16), headers=budgeted)
    assert small.status_code == 200, small.text  # the same request without the options passes
    refused = await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=16, **options), headers=budgeted)
    assert _error(refused)[:2] == (429, "insufficient_quota")
    limited = bearer((await make_key(tpm=1000))["secret"])
    refused = await gw.client.post(COMPLETIONS, json=body("chat", max_tokens=16, **options), headers=limited)
    assert _error(refused)[:2] == (429, "rate_limit_error")


async def test_the_key_comes_before_the_body_on_the_completion_doors(gw: GatewayHandle, make_key: MakeKey) -> None:
    """access.md: every route needs a key. A form body or an oversized one without a key was a 415
    or a 413 (the body was looked at first), and a limited key's 415 or 413 had no window."""
    form = {"content-type": "application/x-www-form-urlencoded"}
    for path in (COMPLETIONS, "/v1/chat/completions", "/v1/messages", "/v1/completions"):
        assert (await gw.client.post(path, content=b"a=b", headers=form)).status_code == 401
        assert (await gw.client.post(path, json={"pad": "x" * 11_000_000})).status_code == 401
    limited = bearer((await make_key(rpm=5))["secret"])
    refused = await gw.client.post(COMPLETIONS, content=b"a=b", headers={**form, **limited})
    assert refused.status_code == 415
    assert refused.headers["x-ratelimit-limit-requests"] == "5"
