"""Our responses validate against fabro's published schema (a copy of ../shared/reference/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.support.client import USER, parse_sse, post
from tests.support.gateway import GatewayHandle
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse

SPEC = Path(__file__).resolve().parents[1] / "reference" / "fabro-completions.openapi.yaml"


@pytest.fixture(scope="module")
def validate() -> Any:
    document = yaml.safe_load(SPEC.read_text())
    registry = Registry().with_resource("urn:fabro", Resource.from_contents(document, DRAFT202012))

    def check(instance: Any, schema_name: str) -> None:
        schema = {"$ref": f"urn:fabro#/components/schemas/{schema_name}"}
        Draft202012Validator(schema, registry=registry).validate(instance)

    return check


async def test_json_response_validates(gw: GatewayHandle, primary: ReplayUpstream, validate: Any) -> None:
    message = {
        "content": "Sure.",
        "reasoning_content": "think",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    body = {
        "id": "u",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    primary.enqueue(reply_json(200, body))
    response = (await post(gw, {"messages": [USER]})).json()
    validate(response, "CompletionResponse")
    validate(response["message"], "CompletionMessage")


async def test_streamed_final_response_validates(gw: GatewayHandle, primary: ReplayUpstream, validate: Any) -> None:
    primary.enqueue(reply_sse([{"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}]}]))
    response = await post(gw, {"messages": [USER], "stream": True})
    frames = parse_sse(response.text)
    validate(frames[-1][1]["response"], "CompletionResponse")


async def test_error_response_validates(gw: GatewayHandle, validate: Any) -> None:
    response = await post(gw, {"messages": []})
    validate(response.json(), "ErrorResponse")
    response = await post(gw, {"messages": [USER], "model": "nope"})
    validate(response.json(), "ErrorResponse")


async def test_request_example_from_the_spec_is_accepted(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(
        reply_json(200, {"id": "u", "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}]})
    )
    request = {
        "model": "chat-1",
        "system": "You are terse.",
        "messages": [
            {"role": "user", "content": [{"kind": "text", "data": "Weather in Paris?"}]},
            {
                "role": "assistant",
                "content": [
                    {
                        "kind": "tool_call",
                        "data": {
                            "id": "call_1",
                            "name": "get_weather",
                            "type": "function",
                            "arguments": {"city": "Paris"},
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": [
                    {"kind": "tool_result", "data": {"tool_call_id": "call_1", "content": "18C", "is_error": False}}
                ],
            },
        ],
        "tools": [
            {
                "name": "get_weather",
                "description": "Current weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            }
        ],
        "tool_choice": {"mode": "auto"},
        "schema": None,
        "stream": False,
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 512,
        "stop_sequences": ["\n\n"],
        "reasoning_effort": "low",
        "provider": "primary",
        "provider_options": {"primary": {"top_k": 40}},
    }
    response = await post(gw, request)
    assert response.status_code == 200, response.text
