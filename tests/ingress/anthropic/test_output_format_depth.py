"""The beta's `output_format.schema` nested past what a decoder goes is named as
`output_config.format.schema` is: by the schema, not the whole option."""

from __future__ import annotations

from tests.support.gateway import GatewayHandle
from tests.support.upstream import ReplayUpstream

DEEP = b"[" * 5000 + b"]" * 5000


async def test_a_beta_output_format_schema_too_deep_to_decode_is_named_by_its_schema(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    head = b'{"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], '
    for option, param in (
        (b'"output_config": {"format": {"type": "json_schema", "schema": {"a": %s}}}}', "output_config.format.schema"),
        (b'"output_format": {"type": "json_schema", "schema": {"a": %s}}}', "output_format.schema"),
    ):
        body = head + option % DEEP
        response = await gw.client.post("/v1/messages", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param, response.text
    assert primary.requests == []
