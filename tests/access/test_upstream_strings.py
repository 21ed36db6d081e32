"""Strings an upstream chose, and an admin secret without the `sy-` form, kept out of logs, the
ledger and error bodies. access.md: "no secret ever reaches a log line, a ledger row or an error";
api.md: upstream keys never appear in an error message; README: the log never holds a key, a
request body or a prompt. Errors scrub the provider's key (`Provider._scrub`) and cut secrets
(`app.errors.unsecret`); these are the paths that did neither."""

from __future__ import annotations

import pytest

from tests.access.conftest import ADMIN, CATALOG, bearer, keyed_gateway
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import StartGateway, provider_table
from tests.support.logs import Logs
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse

PROMPT = "my-private-prompt-text-4711"
UP_KEY = "fr_live_0123456789abcdefghijklmnopqrstuv"
KEY_ENV = "AUDIT_UPSTREAM_KEY"
ECHO = f"POST /v1/chat/completions authorization: Bearer {UP_KEY} {PROMPT}"


def _answer(upstream_id: str) -> dict[str, object]:
    return {
        "id": upstream_id,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_id_that_echoes_the_request_reaches_neither_ledger_nor_log(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, logs: Logs, stream: bool
) -> None:
    """The upstream's `id` (a whole answer's, or a chunk's) is stored whole (up to 300 characters)
    as `upstream_request_id` in the ledger row, the journal and the canonical `request` log line.
    A proxy upstream that puts its view of the request there (its key, the prompt) puts them in
    the operator's log and database; an error message with the same text is scrubbed."""
    monkeypatch.setenv(KEY_ENV, UP_KEY)
    gw = await keyed_gateway(start_gateway, up, monkeypatch, provider={"api_key_env": KEY_ENV})
    if stream:
        chunk = {
            "id": ECHO,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
        up.enqueue(reply_sse([chunk]))
    else:
        up.enqueue(reply_json(200, _answer(ECHO)))
    response = await gw.client.post(
        COMPLETIONS, json={**body("chat", text=PROMPT), "stream": stream}, headers=bearer(ADMIN)
    )
    assert response.status_code == 200, response.text
    rows = await gw.ledger_rows()
    logs.lines("request", gw)
    assert UP_KEY not in repr(rows)
    assert UP_KEY not in logs.raw
    assert PROMPT not in logs.raw


async def test_a_non_sy_admin_secret_is_not_quoted_in_errors(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`[auth] admin_key_env` holds any text the operator chose (README; `KeyRing.masked` says it
    has no `sy-` prefix to find it by). `unsecret` only cuts `sy-` secrets, so an admin secret
    pasted where a model, provider, role or report parameter goes is echoed whole."""
    secret = "operator-chosen-admin-secret-0123456789"
    monkeypatch.setenv("AUDIT_ADMIN_KEY", secret)
    auth = {"mode": "keys", "admin_key_env": "AUDIT_ADMIN_KEY"}
    gw2 = await start_gateway(providers=provider_table({"up": up}), catalog=CATALOG, auth=auth)
    messages = [{"role": "user", "content": "hi"}]
    echoed = []
    for method, path, payload in [
        ("POST", "/v1/chat/completions", {"model": secret, "messages": messages}),
        ("POST", COMPLETIONS, {**body("chat"), "provider": secret}),
        ("GET", f"/api/v1/usage?group_by={secret}", None),
        ("GET", f"/v1/models/{secret}", None),
    ]:
        response = await gw2.client.request(method, path, json=payload, headers=bearer(secret))
        assert response.status_code in (400, 404), (path, response.text)
        if secret in response.text:
            echoed.append(f"{method} {path.replace(secret, '<secret>')}")
    assert echoed == []


@pytest.mark.parametrize(
    ("key", "upstream_id"),
    [("a", "chatcmpl-8f1c2a9e0b"), ("x", "req|2024~abc@node#3"), (UP_KEY, "gen-1733-XyZ")],
)
async def test_an_ordinary_upstream_id_is_kept_whatever_the_providers_key(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, key: str, upstream_id: str
) -> None:
    """A local server is often given a throwaway key ("a", "x"): an id holding it is no leak, and
    was dropped (most `chatcmpl-<hex>` ids hold an "a"); nor are `|`, `~`, `@` or `#` prose."""
    monkeypatch.setenv(KEY_ENV, key)
    gw = await keyed_gateway(start_gateway, up, monkeypatch, provider={"api_key_env": KEY_ENV})
    up.enqueue(reply_json(200, _answer(upstream_id)))
    response = await gw.client.post(COMPLETIONS, json=body("chat"), headers=bearer(ADMIN))
    assert response.status_code == 200, response.text
    (row,) = await gw.ledger_rows()
    assert row["upstream_request_id"] == upstream_id
