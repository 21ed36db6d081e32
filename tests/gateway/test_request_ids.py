"""api.md: an `x-request-id` header on every response, not only on completions and errors."""

from __future__ import annotations

import uuid

from tests.support.gateway import GatewayHandle

PATHS = (
    "/healthz",
    "/readyz",
    "/metrics",
    "/api/v1/models",
    "/v1/models",
    "/api/v1/usage",
    "/usage",
    "/api/v1/catalog/drift",
)


async def test_every_route_answers_with_a_request_id(gw: GatewayHandle) -> None:
    ids = []
    for path in PATHS:
        response = await gw.client.get(path)
        assert response.status_code in (200, 503), (path, response.text)  # /readyz may say not ready yet
        request_id = response.headers.get("x-request-id")
        assert request_id is not None, path
        assert uuid.UUID(request_id).version == 7, (path, request_id)
        ids.append(request_id)
    assert len(set(ids)) == len(ids)
