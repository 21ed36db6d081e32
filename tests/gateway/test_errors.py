"""Every error status of api.md's table through HTTP: status, both error views, headers, ledger rows."""

from __future__ import annotations

from typing import Any

import pytest

from app.catalog_watch import CATALOG_POLL_S
from app.routing.router import UNCONFIGURED_RETRY_S
from tests.gateway.conftest import CATALOG, providers_for
from tests.support.catalog import catalog_toml, model
from tests.support.client import COMPLETIONS, USER, post
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.upstream import ReplayUpstream, reply_json


def assert_error(
    response: Any, status: int, type_: str, message: str | None = None, param: str | None = None
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    request_id = response.headers["x-request-id"]
    error = body["error"]
    assert (error["code"], error["type"], error["request_id"]) == (status, type_, request_id)
    assert body["request_id"] == request_id
    (entry,) = body["errors"]
    assert entry["status"] == str(status)
    assert entry["detail"] == error["message"]
    assert entry["code"] == type_
    assert entry["request_id"] == request_id
    if message is not None:
        assert error["message"] == message
    assert error.get("param") == param
    return body


@pytest.mark.parametrize(
    ("payload", "param", "message"),
    [
        (
            {
                "messages": [
                    {"role": "user", "content": [{"kind": "text", "data": "a"}, {"kind": "hologram", "data": 1}]}
                ]
            },
            "messages[0].content[1].kind",
            "messages[0].content[1].kind: unknown content kind 'hologram'",
        ),
        ({"messages": []}, "messages", None),
        ({"model": "chat-1"}, "messages", "messages: field required"),
        ({"messages": [{"role": "robot", "content": []}]}, "messages[0].role", None),
        ({"messages": [USER], "temperature": 3}, "temperature", None),
        ({"messages": [USER], "top_p": -0.1}, "top_p", None),
        ({"messages": [USER], "max_tokens": 0}, "max_tokens", None),
        ({"messages": [USER], "reasoning_effort": "extreme"}, "reasoning_effort", None),
        ({"messages": [USER], "tool_choice": {"mode": "sometimes"}}, "tool_choice.mode", None),
        (
            {
                "messages": [USER],
                "tools": [{"name": "a", "description": "", "parameters": {}}],
                "tool_choice": {"mode": "named", "tool_name": "b"},
            },
            "tool_choice.tool_name",
            "tool_choice.tool_name: names no declared tool: 'b'",
        ),
        ({"model": "no-such-model", "messages": [USER]}, "model", "model: unknown model 'no-such-model'"),
        ({"messages": [USER], "provider": "nowhere"}, "provider", "provider: unknown provider 'nowhere'"),
        ({"messages": [USER], "provider_options": {"primary": {"model": "x"}}}, "provider_options.primary.model", None),
        ({"messages": [USER], "provider_options": {"elsewhere": {}}}, "provider_options.elsewhere", None),
        (
            {
                "messages": [{"role": "user", "content": [{"kind": "image", "data": {"url": "/etc/passwd"}}]}],
                "model": "vision-1",
            },
            "messages[0].content[0].data.url",
            None,
        ),
        (
            {
                "messages": [{"role": "user", "content": [{"kind": "image", "data": {"url": "file:///etc/passwd"}}]}],
                "model": "vision-1",
            },
            "messages[0].content[0].data.url",
            None,
        ),
        *(  # api.md's other local paths: `./x`, `~/x` (and a parent directory's)
            (
                {
                    "messages": [{"role": "user", "content": [{"kind": "image", "data": {"url": url}}]}],
                    "model": "vision-1",
                },
                "messages[0].content[0].data.url",
                None,
            )
            for url in ("./a.png", "~/a.png", "../a.png")
        ),
        *(
            (
                {"messages": [{"role": "user", "content": [{"kind": "image", "data": {"url": url}}]}]},
                "messages[0].content[0]",  # the URL is taken (a scheme is case-insensitive); the model is not
                "messages[0].content[0]: model 'chat-1' does not accept 'image' parts (no 'vision' capability)",
            )
            for url in ("https://x.test/a.png", "HTTPS://X.test/a.png")
        ),
        (
            {"messages": [{"role": "user", "content": [{"kind": "tool_call", "data": {"id": "1", "name": "f"}}]}]},
            "messages[0].content[0].kind",
            None,
        ),
        ({"messages": [{"role": "user", "content": [{"data": "no kind"}]}]}, "messages[0].content[0].kind", None),
    ],
)
async def test_invalid_requests_are_400_naming_the_field(
    gw: GatewayHandle, primary: ReplayUpstream, payload: dict[str, Any], param: str, message: str | None
) -> None:
    response = await post(gw, payload)
    assert_error(response, 400, "invalid_request_error", message, param)
    assert primary.requests == []


async def test_malformed_json_and_non_object(gw: GatewayHandle) -> None:
    response = await gw.client.post(COMPLETIONS, content=b"{not json", headers={"content-type": "application/json"})
    assert_error(response, 400, "invalid_request_error")
    response = await post(gw, [1, 2])
    assert_error(response, 400, "invalid_request_error", "request body must be a JSON object")


async def test_null_optional_fields_mean_absent(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(
        reply_json(200, {"id": "x", "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}]})
    )
    payload = {
        "messages": [USER],
        "model": None,
        "system": None,
        "tools": None,
        "tool_choice": None,
        "schema": None,
        "stream": None,
        "temperature": None,
        "provider": None,
        "provider_options": None,
    }
    response = await post(gw, payload)
    assert response.status_code == 200, response.text


async def test_body_too_large_is_413(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    gw = await start_gateway(
        providers=providers_for(primary, secondary), catalog=CATALOG, server={"max_body_bytes": 2048}
    )
    payload = {"messages": [{"role": "user", "content": [{"kind": "text", "data": "x" * 4096}]}]}
    response = await post(gw, payload)
    assert_error(response, 413, "invalid_request_error")
    # the limit it broke, so a client knows how far to shrink (a big image was told only "too large")
    assert response.json()["error"]["message"] == "request body too large (the limit is 2048 bytes)"


async def test_upstream_client_error_is_400_with_upstream_message(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    error = {
        "error": {
            "message": "This model's maximum context length is 32768 tokens",
            "type": "invalid_request_error",
            "code": 400,
        }
    }
    primary.enqueue(reply_json(400, error))
    response = await post(gw, {"messages": [USER]})
    assert_error(response, 400, "invalid_request_error", "This model's maximum context length is 32768 tokens")
    (row,) = await gw.ledger_rows()
    assert (row["status"], row["error_status"], row["attempts"]) == ("error", 400, 1)


async def test_all_backends_at_capacity_is_429_with_soonest_retry_after(
    gw: GatewayHandle, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    busy = {
        "error": {"message": "all backends for this model are at capacity", "type": "rate_limit_error", "code": 429}
    }
    primary.enqueue(reply_json(429, busy, headers={"retry-after": "7"}))
    secondary.enqueue(reply_json(429, busy, headers={"retry-after": "3"}))
    response = await post(gw, {"messages": [USER]})
    assert_error(response, 429, "rate_limit_error", "all backends for this model are at capacity")
    assert response.headers["retry-after"] == "3"
    (row,) = await gw.ledger_rows()
    assert (row["status"], row["error_status"], row["attempts"]) == ("error", 429, 2)


async def test_all_backends_refusing_is_502(
    gw: GatewayHandle, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    primary.enqueue(reply_json(503, {"error": {"message": "down", "type": "unavailable", "code": 503}}))
    secondary.enqueue(reply_json(500, {"detail": "boom"}))
    response = await post(gw, {"messages": [USER]})
    assert_error(response, 502, "upstream_error", "all backends refused the request (primary: 503; secondary: 500)")
    (row,) = await gw.ledger_rows()
    assert (row["status"], row["error_type"], row["attempts"], row["provider"]) == (
        "error",
        "upstream_error",
        2,
        "secondary",
    )


async def test_failover_to_second_backend(
    gw: GatewayHandle, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    primary.enqueue(reply_json(502, {"error": {"message": "bad gateway", "type": "upstream_error", "code": 502}}))
    secondary.enqueue(
        reply_json(200, {"id": "s", "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}]})
    )
    response = await post(gw, {"messages": [USER]})
    assert response.status_code == 200
    assert response.json()["provider"] == "secondary"
    (row,) = await gw.ledger_rows()
    assert (row["provider"], row["attempts"], row["status"]) == ("secondary", 2, "ok")


async def test_a_model_served_by_no_configured_provider_is_503_with_retry_after(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    """api.md: 503 `no backend is available` when none is configured — with `Retry-After`: a
    deployment synced into the catalog is in use within the catalog watch's poll."""
    catalog = catalog_toml(model("elsewhere", ("nowhere", "org/x", 10), default=True))
    gw = await start_gateway(providers=providers_for(primary, secondary), catalog=catalog)
    for payload in ({"model": "elsewhere", "messages": [USER]}, {"messages": [USER]}):  # named, and no default
        response = await post(gw, payload)
        assert_error(response, 503, "unavailable", "no backend is available for this model")
        assert response.headers["retry-after"] == str(int(UNCONFIGURED_RETRY_S)) == str(int(CATALOG_POLL_S))
    assert primary.requests == secondary.requests == []


async def test_no_backend_available_is_503(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SWITCHYARD_TEST_UNSET_KEY", raising=False)
    providers = providers_for(
        primary,
        secondary,
        {
            "primary": {"api_key_env": "SWITCHYARD_TEST_UNSET_KEY"},
            "secondary": {"api_key_env": "SWITCHYARD_TEST_UNSET_KEY"},
        },
    )
    gw = await start_gateway(providers=providers, catalog=CATALOG)
    response = await post(gw, {"model": "chat-1", "messages": [USER]})
    assert_error(response, 503, "unavailable", "no backend is available for this model")
    assert primary.requests == []
    assert secondary.requests == []
    (row,) = await gw.ledger_rows()
    assert (row["status"], row["error_status"], row["attempts"], row["model"]) == ("error", 503, 0, "chat-1")
    models = (await gw.client.get("/api/v1/models")).json()["data"]
    assert {m["id"]: m["ready"] for m in models}["chat-1"] is False


async def test_upstream_timeout_is_504(
    start_gateway: StartGateway, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    fast = {"timeouts": {"first_byte": 0.3, "idle": 0.3}}
    gw = await start_gateway(
        providers=providers_for(primary, secondary, {"primary": fast, "secondary": fast}), catalog=CATALOG
    )
    stalled = reply_json(200, {"id": "late"}, first_byte_delay_s=5.0)
    primary.enqueue(stalled)
    secondary.enqueue(stalled)
    response = await post(gw, {"messages": [USER]})
    assert_error(response, 504, "upstream_error")
    (row,) = await gw.ledger_rows()
    assert (row["error_status"], row["attempts"]) == (504, 2)
    assert row["latency_ms"] < 3000


async def test_unknown_route_is_json_404(gw: GatewayHandle) -> None:
    response = await gw.client.get("/api/v1/nothing")
    assert_error(response, 404, "not_found_error")


DEEP = "[" * 100_000


async def test_an_answer_nested_past_the_decoders_depth_is_served_not_a_500(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """An upstream's text (for a `schema`) or tool-call arguments nested past msgspec's depth: the
    RecursionError escaped the parse, a 500 after the answer was billed. It is no JSON: `output`
    null, the call's arguments `{}`."""
    message = {"role": "assistant", "content": DEEP}
    primary.enqueue(reply_json(200, _chat_answer(message)))
    schema = {"type": "array"}
    answered = await post(gw, {"model": "chat-1", "messages": [USER], "schema": schema})
    assert answered.status_code == 200, answered.text
    assert answered.json()["output"] is None
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": DEEP}}
    primary.enqueue(reply_json(200, _chat_answer({"role": "assistant", "content": None, "tool_calls": [call]})))
    tools = [{"name": "f", "description": "f", "parameters": {"type": "object"}}]
    called = await post(gw, {"model": "chat-1", "messages": [USER], "tools": tools})
    assert called.status_code == 200, called.text
    (part,) = called.json()["message"]["content"]
    assert part["data"]["arguments"] == {}


def _chat_answer(message: dict[str, Any]) -> dict[str, Any]:
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [choice],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
    }
