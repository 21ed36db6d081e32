"""Errors on the OpenAI paths: 400s naming the OpenAI field path (`param`), the two-view body of
api.md, and the `openai` SDK's exception class for every status."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import pytest

from tests.support.gateway import GatewayHandle
from tests.support.replies import answer, error
from tests.support.upstream import ReplayUpstream

CHAT = "/v1/chat/completions"
USER = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
B64 = "UklGRgAAAABXQVZF"


def assert_error(response: Any, status: int, type_: str, param: str | None = None) -> dict[str, Any]:
    """api.md's two views of one error, the request id in both and in the header."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    request_id = response.headers["x-request-id"]
    error = body["error"]
    assert (error["code"], error["type"], error["request_id"], error.get("param")) == (status, type_, request_id, param)
    assert body["request_id"] == request_id
    assert body["errors"] == [
        {
            "status": str(status),
            "title": body["errors"][0]["title"],
            "detail": error["message"],
            "code": type_,
            "request_id": request_id,
        }
    ]
    return body


def parts(*content: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(content)}]


BAD = [
    ({"messages": []}, "messages"),
    ({"prompt": "legacy"}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [USER], "n": 2}, "n"),
    ({"messages": [USER], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": [USER], "stop": 5}, "stop"),
    ({"messages": [USER], "temperature": "hot"}, "temperature"),
    ({"messages": [USER], "temperature": 2.5}, "temperature"),
    ({"messages": [USER], "top_p": -0.1}, "top_p"),
    ({"messages": [USER], "max_tokens": 0}, "max_tokens"),
    ({"messages": [USER], "max_completion_tokens": "10"}, "max_completion_tokens"),
    # past chat-1's max_output (4096), which the pipeline checks: named as the client spelt it
    ({"model": "chat-1", "messages": [USER], "max_completion_tokens": 4097}, "max_completion_tokens"),
    ({"model": "chat-1", "messages": [USER], "max_completion_tokens": 4097, "stream": True}, "max_completion_tokens"),
    ({"model": "chat-1", "messages": [USER], "max_tokens": 9, "max_completion_tokens": 4097}, "max_completion_tokens"),
    ({"model": "chat-1", "messages": [USER], "max_tokens": 4097}, "max_tokens"),
    ({"messages": [USER], "presence_penalty": 3}, "presence_penalty"),
    ({"messages": [USER], "seed": 1.5}, "seed"),
    ({"messages": [USER], "logprobs": "yes"}, "logprobs"),
    ({"messages": [USER], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": [USER], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [USER], "stream": "true"}, "stream"),
    ({"messages": [USER], "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ({"messages": [USER], "reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"messages": [USER], "top_k": -2}, "top_k"),
    ({"messages": [USER], "min_p": 2}, "min_p"),
    ({"messages": [USER], "repetition_penalty": 0}, "repetition_penalty"),
    ({"messages": [USER], "model": 7}, "model"),
    ({"messages": [USER], "model": "no-such-model"}, "model"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [1, 2, 3]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": 42}]}, "messages[0].content"),
    ({"messages": parts({"type": "text", "text": "a"}, {"type": "hologram"})}, "messages[0].content[1].type"),
    ({"messages": parts({"type": "text"})}, "messages[0].content[0].text"),
    (
        {"messages": parts({"type": "image_url", "image_url": {"url": "/etc/passwd"}})},
        "messages[0].content[0].image_url.url",
    ),
    (
        {"messages": parts({"type": "image_url", "image_url": {"url": "file:///x.png"}})},
        "messages[0].content[0].image_url.url",
    ),
    (  # an image part holding a page: accepted and sent on, where OpenAI and the Anthropic door refuse it
        {"messages": parts({"type": "image_url", "image_url": {"url": "data:text/html;base64,PGgxPg=="}})},
        "messages[0].content[0].image_url.url",
    ),
    (
        {"messages": parts({"type": "image_url", "image_url": "https://x.test/a.png"})},
        "messages[0].content[0].image_url",
    ),
    (
        {"model": "solo", "messages": parts({"type": "image_url", "image_url": {"url": "https://x.test/a.png"}})},
        "messages[0].content[0]",
    ),
    (
        {"messages": parts({"type": "input_audio", "input_audio": {"data": "%%", "format": "wav"}})},
        "messages[0].content[0].input_audio.data",
    ),
    (
        {"messages": parts({"type": "input_audio", "input_audio": {"data": B64, "format": "ogg"}})},
        "messages[0].content[0].input_audio.format",
    ),
    ({"messages": parts({"type": "file", "file": {"file_id": "file-1"}})}, "messages[0].content[0].file.file_id"),
    ({"messages": parts({"type": "file", "file": {"filename": "a.pdf"}})}, "messages[0].content[0].file.file_data"),
    (
        {
            "messages": [
                {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a"}}]}
            ]
        },
        "messages[0].content[0].type",
    ),
    ({"messages": [USER, {"role": "tool", "content": "18C"}]}, "messages[1].tool_call_id"),
    ({"messages": [USER, {"role": "assistant", "content": None}]}, "messages[1].content"),  # no calls either
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    (
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}],
                }
            ]
        },
        "messages[0].tool_calls[0].function.arguments",
    ),
    ({"messages": [USER], "tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
    (
        {"messages": [USER], "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
        "tools[0].function.name",
    ),
    ({"messages": [USER], "tools": [TOOL, TOOL]}, "tools[1].function.name"),
    ({"messages": [USER], "tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": [USER], "tool_choice": "required"}, "tool_choice"),
    (
        {"messages": [USER], "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice.function.name",
    ),
    ({"messages": [USER], "tools": []}, "tools"),  # OpenAI refuses an empty list
    (
        {
            "messages": [USER],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
        },
        "tools[0].function.parameters",
    ),
    ({"messages": [USER], "seed": 2**64}, "seed"),
    ({"messages": [USER], "seed": -(2**63) - 1}, "seed"),
    *(
        ({"messages": [USER], "response_format": {"type": "json_schema", "json_schema": {"name": name}}}, param)
        for name, param in [
            ("", "response_format.json_schema.name"),
            ("n" * 65, "response_format.json_schema.name"),
        ]
    ),
    ({"messages": [USER], "response_format": {"type": "xml"}}, "response_format.type"),
    ({"messages": [USER], "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"messages": [USER], "metadata": ["a"]}, "metadata"),
    ({"messages": [USER], "metadata": {"ok": "1", "a": 1}}, "metadata.a"),  # was `metadata[...]`
    ({"messages": [USER], "stream_options": {"include_usage": True}}, "stream_options"),  # without stream
    ({"messages": [USER], "stop": ""}, "stop"),
    # audio output: a 200 in text only would drop what the client asked for
    ({"messages": [USER], "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "modalities"),
    ({"messages": [USER], "modalities": ["audio"]}, "modalities"),
    ({"messages": [USER], "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"messages": [USER], "stop": ["END", ""]}, "stop"),
    # a prompt over the context window, named by the part that holds most of it
    ({"messages": [{"role": "system", "content": "s" * 300_000}, USER]}, "messages"),
    (
        {"messages": [USER], "tools": [{**TOOL, "function": {"name": "f", "description": "d" * 300_000}}]},
        "tools",
    ),
    (
        {
            "messages": [USER],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": {"description": "d" * 300_000}},
            },
        },
        "response_format",
    ),
]


@pytest.mark.parametrize(("payload", "param"), BAD)
async def test_bad_input_is_400_naming_the_openai_field(
    gw: GatewayHandle, primary: ReplayUpstream, payload: dict[str, Any], param: str
) -> None:
    response = await gw.client.post(CHAT, json=payload)

    body = assert_error(response, 400, "invalid_request_error", param)
    assert body["error"]["message"].startswith(f"{param}: ")
    assert primary.requests == []


async def test_malformed_json_and_not_an_object(gw: GatewayHandle) -> None:
    response = await gw.client.post(CHAT, content=b"{not json", headers={"content-type": "application/json"})
    assert_error(response, 400, "invalid_request_error")
    response = await gw.client.post(CHAT, json=[USER])
    assert response.json()["error"]["message"] == "request body must be a JSON object"


async def test_unknown_fields_and_nulls_are_ignored(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(answer())
    payload = {
        "messages": [{**USER, "audio": None, "extra": 1}],
        "model": None,
        "tools": None,
        "logit_bias": {"50256": -100},
        "service_tier": "auto",
        "store": False,
        "n": 1,
        "modalities": ["text"],
        "audio": None,
        "frobnicate": {"deep": [1, 2]},
    }
    response = await gw.client.post(CHAT, json=payload)
    assert response.status_code == 200, response.text


async def test_unknown_path_and_wrong_method(gw: GatewayHandle, client: openai.OpenAI) -> None:
    assert_error(await gw.client.get("/v1/nothing"), 404, "not_found_error")
    assert_error(await gw.client.get(CHAT), 405, "invalid_request_error")
    with pytest.raises(openai.NotFoundError) as caught:
        await asyncio.to_thread(client.embeddings.create, model="chat", input="hi")
    assert caught.value.status_code == 404
    assert caught.value.body["type"] == "not_found_error"  # type: ignore[index]


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"n": 2}, "n"), ({"stop": ["1", "2", "3", "4", "5"]}, "stop"), ({"temperature": "warm"}, "temperature")],
)
async def test_sdk_bad_request_error(client: openai.OpenAI, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await asyncio.to_thread(client.chat.completions.create, model="chat", messages=[USER], **extra)

    assert caught.value.status_code == 400
    body: Any = caught.value.body
    assert (body["type"], body["param"], body["code"]) == ("invalid_request_error", param, 400)
    assert caught.value.response.headers["x-request-id"] == body["request_id"]


@pytest.mark.parametrize("stream", [False, True])
async def test_sdk_rate_limit_error_with_retry_after(
    gw: GatewayHandle, aclient: openai.AsyncOpenAI, primary: ReplayUpstream, stream: bool
) -> None:
    """Before the answer starts an error is an ordinary HTTP error, streamed or not."""
    primary.enqueue("fastrun_429_retry_after")

    with pytest.raises(openai.RateLimitError) as caught:
        await aclient.chat.completions.create(model="solo", messages=[USER], stream=stream)

    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "7"
    body: Any = caught.value.body
    assert (body["type"], body["message"]) == ("rate_limit_error", "all backends for this model are at capacity")
    (row,) = await gw.ledger_rows()
    assert (row["api"], row["status"], row["error_status"], row["streamed"]) == ("openai_chat", "error", 429, stream)


async def test_sdk_502_then_503_while_the_backend_cools_down(
    gw: GatewayHandle, client: openai.OpenAI, primary: ReplayUpstream
) -> None:
    primary.enqueue(error(500))

    with pytest.raises(openai.InternalServerError) as refused:
        await asyncio.to_thread(client.chat.completions.create, model="solo", messages=[USER])
    with pytest.raises(openai.APIStatusError) as unavailable:
        await asyncio.to_thread(client.chat.completions.create, model="solo", messages=[USER])

    assert refused.value.status_code == 502
    assert refused.value.body["type"] == "upstream_error"  # type: ignore[index]
    assert unavailable.value.status_code == 503
    assert isinstance(unavailable.value, openai.InternalServerError)
    assert unavailable.value.body["type"] == "unavailable"  # type: ignore[index]
    assert int(unavailable.value.response.headers["retry-after"]) >= 1
    assert len(primary.requests) == 1
    rows = await gw.ledger_rows()
    assert [(r["api"], r["error_status"]) for r in rows] == [("openai_chat", 502), ("openai_chat", 503)]


async def test_deep_json_and_foreign_media_types_are_clean_4xx(gw: GatewayHandle) -> None:
    """The native door's guards hold here too: nesting past the limit and non-JSON bodies."""
    deep = "[" * 990 + "]" * 990
    tool = '{"type":"function","function":{"name":"f","parameters":{"x":' + deep + "}}}"
    body = '{"model":"chat-1","messages":[{"role":"user","content":"hi"}],"tools":[' + tool + "]}"
    nested = await gw.client.post(CHAT, content=body, headers={"content-type": "application/json"})
    assert_error(nested, 400, "invalid_request_error", "tools[0].function.parameters")
    form = await gw.client.post(CHAT, content=b"a=b", headers={"content-type": "application/x-www-form-urlencoded"})
    assert_error(form, 415, "invalid_request_error")
    gzip = await gw.client.post(
        CHAT, content=b"{}", headers={"content-type": "application/json", "content-encoding": "gzip"}
    )
    assert_error(gzip, 415, "invalid_request_error")


@pytest.mark.parametrize(
    ("door", "head", "param"),
    [
        (CHAT, '{"model":"chat-1","messages":[{"role":"user","content":"x"}],"metadata":{"k":', "metadata"),
        (
            "/api/v1/completions",
            '{"model":"chat-1","messages":[{"role":"user","content":[{"kind":"text","data":"x"}]}],'
            '"provider_options":{"p":1},"zz":',
            "",
        ),
    ],
)
async def test_a_field_error_beside_deep_nesting_is_a_400_not_a_500(
    gw: GatewayHandle, door: str, head: str, param: str
) -> None:
    """Naming the key of a bad value in a free-form object decodes the body again: one nested
    past msgspec's depth raised RecursionError out of the error path (a 500 any key could cause)."""
    body = head + '{"a":' * 1500 + "1" + "}" * 1500 + "}"
    response = await gw.client.post(door, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert "nests deeper than 64 levels" in response.json()["error"]["message"]


async def test_a_bad_value_among_thousands_of_metadata_keys_answers_at_once(gw: GatewayHandle) -> None:
    """Naming the bad key decodes the body once per key tried: 5,000 keys in a 2 MB body held the
    worker 8 s. Only the first keys are tried; past them the message names the object."""
    metadata = {f"k{n}": "v" for n in range(5000)} | {"zz": 1}
    payload = {"model": "chat-1", "messages": [{"role": "user", "content": "x" * 2_000_000}], "metadata": metadata}
    started = time.monotonic()
    response = await gw.client.post(CHAT, json=payload)
    assert time.monotonic() - started < 2.0
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "metadata[...]"  # the key past the ones tried


async def test_a_clients_tool_call_arguments_nested_past_the_decoders_depth_are_no_500(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """An assistant turn's `arguments` string nested past msgspec's depth: read as no arguments
    (`{}`, as any string that is not JSON), not a RecursionError out of the door (a 500)."""
    primary.enqueue(answer())
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * 100_000}}
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    response = await gw.client.post(CHAT, json={"model": "chat-1", "messages": messages})
    assert response.status_code == 200, response.text


async def test_audio_output_is_refused_through_the_sdk(client: openai.OpenAI, primary: ReplayUpstream) -> None:
    """`modalities: ["text", "audio"]` was ignored: a 200 with text and no `message.audio`, which
    the client then reads (`message.audio.data`) and fails on, after paying for the answer."""
    with pytest.raises(openai.BadRequestError) as caught:
        await asyncio.to_thread(
            client.chat.completions.create,
            model="chat-1",
            messages=[USER],
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "wav"},
        )
    assert caught.value.status_code == 400
    body: Any = caught.value.body
    assert (body["type"], body["param"], body["code"]) == ("invalid_request_error", "modalities", 400)
    assert body["message"] == 'modalities: only text output is served here (`modalities: ["text"]`)'
    assert primary.requests == []
