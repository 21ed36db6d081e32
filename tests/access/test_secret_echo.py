"""access.md: "no secret ever reaches a log line, a ledger row or an error". A key's secret pasted
where a model, a provider or a parameter's name goes (the key in the model field, or in a path) was
quoted back whole in the error, the admin secret too (an authorization audit); the key-management
API already refused to echo one (`/api/v1/keys/sy-…`). Every error now cuts a secret to its prefix
(`app.errors.unsecret`)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.access.conftest import ADMIN, MakeKey, bearer
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import GatewayHandle

MESSAGES = [{"role": "user", "content": "hi"}]


def _requests(secret: str) -> list[tuple[str, str, Any]]:
    return [
        ("GET", f"/v1/models/{secret}", None),
        ("POST", COMPLETIONS, body(secret)),
        ("POST", COMPLETIONS, {**body("chat"), "provider": secret}),
        ("POST", "/v1/chat/completions", {"model": secret, "messages": MESSAGES}),
        ("POST", "/v1/completions", {"model": secret, "prompt": "hi"}),
        ("POST", "/v1/messages", {"model": secret, "max_tokens": 5, "messages": MESSAGES}),
        ("GET", f"/api/v1/usage?group_by={secret}", None),
        ("GET", f"/api/v1/usage?{secret}=1", None),
    ]


@pytest.mark.parametrize("whose", ["own key", "admin key"])
async def test_no_error_quotes_a_secret(gw: GatewayHandle, make_key: MakeKey, whose: str) -> None:
    caller = (await make_key(name="k"))["secret"]
    pasted = caller if whose == "own key" else ADMIN
    echoed = []
    for method, path, payload in _requests(pasted):
        response = await gw.client.request(method, path, json=payload, headers=bearer(caller))
        assert response.status_code in (400, 404), (path, response.status_code)
        assert pasted[:7] + "…" in response.text, path  # its prefix says which key it was
        if pasted in response.text:
            echoed.append(f"{method} {path.replace(pasted, '<secret>')}")
    assert echoed == []
