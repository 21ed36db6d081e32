"""`POST /v1/completions`, the legacy text completion: the official `openai` SDK (sync and async)
and the exact wire, against recorded vLLM answers (`ReplayUpstream`) and against the real
`switchyard mock-upstream` server; what reached the upstream's own `/completions`, exact usage and
Decimal cost, the ledger rows (`api = openai_completions`), and the 400s naming the field."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Any

import openai
import pytest

from devtools.mock_openai import ScriptedOptions, estimate_prompt_tokens
from devtools.mock_upstream import scripted_server
from providers.config import KIND_DEFAULTS, ProviderConfig
from providers.openai_text import build_text_body
from providers.types import TextCompletionRequest
from tests.ingress.conftest import primary_cost
from tests.ingress.test_openai_errors import assert_error
from tests.support.catalog import catalog_toml, model, price
from tests.support.gateway import GatewayHandle, StartGateway
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse

LEGACY = "/v1/completions"
PROMPT = "The capital of France is"
EXTRAS = {"top_k": 40, "seed": 7}


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    """The inclusive usage object without its cost."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def data_lines(text: str) -> list[Any]:
    """Every block one `data:` line; JSON payloads decoded (floats as Decimal), `[DONE]` kept."""
    assert text.endswith("\n\n"), text[-80:]
    blocks = [block.removeprefix("data: ") for block in text.split("\n\n")[:-1]]
    return [b if b == "[DONE]" else json.loads(b, parse_float=Decimal) for b in blocks]


def text_choice(text: str, logprobs: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}


def one_token(token: str, logprob: str, offset: int, top: dict[str, str]) -> dict[str, Any]:
    return {
        "tokens": [token],
        "token_logprobs": [Decimal(logprob)],
        "top_logprobs": [{t: Decimal(v) for t, v in top.items()}],
        "text_offset": [offset],
    }


async def test_sync_client_json_with_logprobs_and_extras(
    gw: GatewayHandle, client: openai.OpenAI, primary: ReplayUpstream
) -> None:
    primary.enqueue("vllm_completions_json")

    raw = await asyncio.to_thread(
        client.completions.with_raw_response.create,
        model="chat",
        prompt=PROMPT,
        max_tokens=8,
        logprobs=2,
        extra_body=EXTRAS,
    )

    completion = raw.parse()
    request_id = raw.headers["x-request-id"]
    assert (completion.id, completion.object, completion.model) == (request_id, "text_completion", "chat-1")
    (choice,) = completion.choices
    assert (choice.index, choice.text, choice.finish_reason) == (0, " Paris.", "stop")
    assert choice.logprobs is not None
    assert (choice.logprobs.tokens, choice.logprobs.text_offset) == ([" Paris", "."], [0, 6])
    assert choice.logprobs.token_logprobs == [-0.0312, -0.4519]
    assert choice.logprobs.top_logprobs == [{" Paris": -0.0312, " the": -3.9187}, {".": -0.4519, ",": -1.2208}]
    assert completion.usage is not None
    assert completion.usage.prompt_tokens_details is not None
    assert (completion.usage.prompt_tokens, completion.usage.prompt_tokens_details.cached_tokens) == (40, 32)
    cost = primary_cost(8, 2, cache_read=32)
    body = json.loads(raw.http_response.text, parse_float=Decimal)
    assert body["usage"] == {**usage(40, 2, cached=32), "cost": cost, "cost_source": "estimated"}
    (sent,) = primary.requests
    assert sent.path == "/v1/completions"
    assert sent.json() == {
        "model": "org/chat-1-instruct",
        "prompt": PROMPT,
        "max_tokens": 8,
        "stream": False,
        "logprobs": 2,
        **EXTRAS,
    }
    (row,) = await gw.ledger_rows()
    assert (row["request_id"], row["api"], row["streamed"], row["status"]) == (
        request_id,
        "openai_completions",
        False,
        "ok",
    )
    assert (row["input_tokens"], row["output_tokens"], row["cache_read_tokens"]) == (8, 2, 32)
    assert Decimal(row["cost_usd"]) == cost


async def test_async_client_stream_with_logprobs_and_usage(
    gw: GatewayHandle, aclient: openai.AsyncOpenAI, primary: ReplayUpstream
) -> None:
    primary.enqueue("vllm_completions_stream")

    stream = await aclient.completions.create(
        model="chat-1",
        prompt=PROMPT,
        max_tokens=4,
        logprobs=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=EXTRAS,
    )
    items = [item async for item in stream]

    *chunks, last = items
    assert [c.choices[0].text for c in chunks] == [" Paris", ".", " It", " is", ""]
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, None, None, "length"]
    offsets = [c.choices[0].logprobs.text_offset if c.choices[0].logprobs else None for c in chunks]
    assert offsets == [[0], [6], [7], [10], None]
    assert chunks[2].choices[0].logprobs is not None
    assert chunks[2].choices[0].logprobs.top_logprobs == [{" The": -0.9561, "\n": -1.1102, " It": -1.2034}]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (5, 4, 9)
    assert primary.requests[0].path == "/v1/completions"
    assert primary.requests[0].json() == {
        "model": "org/chat-1-instruct",
        "prompt": PROMPT,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": 2,
        **EXTRAS,
    }
    (row,) = await gw.ledger_rows()
    assert {item.id for item in items} == {row["request_id"]}
    assert (row["api"], row["streamed"], row["status"], row["stop_reason"]) == (
        "openai_completions",
        True,
        "ok",
        "max_tokens",
    )
    assert (row["input_tokens"], row["output_tokens"], Decimal(row["cost_usd"])) == (5, 4, primary_cost(5, 4))


async def test_stream_exact_chunks(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue("vllm_completions_stream")
    payload = {"prompt": PROMPT, "max_tokens": 4, "logprobs": 2, "stream": True}

    response = await gw.client.post(LEGACY, json={**payload, "stream_options": {"include_usage": True}})

    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    *chunks, done = data_lines(response.text)
    assert done == "[DONE]"
    head = {
        "id": response.headers["x-request-id"],
        "object": "text_completion",
        "created": chunks[0]["created"],
        "model": "chat-1",
    }
    it_top = {" The": "-0.9561", "\n": "-1.1102", " It": "-1.2034"}
    assert chunks == [
        {
            **head,
            "choices": [
                text_choice(" Paris", one_token(" Paris", "-0.0312", 0, {" Paris": "-0.0312", " the": "-3.9187"}))
            ],
        },
        {**head, "choices": [text_choice(".", one_token(".", "-0.4519", 6, {".": "-0.4519", ",": "-1.2208"}))]},
        {**head, "choices": [text_choice(" It", one_token(" It", "-1.2034", 7, it_top))]},
        {
            **head,
            "choices": [text_choice(" is", one_token(" is", "-0.0087", 10, {" is": "-0.0087", " has": "-5.1234"}))],
        },
        {**head, "choices": [text_choice("", None, "length")]},
        {**head, "choices": [], "usage": {**usage(5, 4), "cost": primary_cost(5, 4), "cost_source": "estimated"}},
    ]


def llamacpp_logprob(token: str, logprob: float, top: dict[str, float]) -> dict[str, Any]:
    """One entry of llama.cpp's chat-shaped `logprobs.content`, as its `/completions` sends it."""
    alternatives = [{"id": 7, "token": t, "bytes": list(t.encode()), "logprob": v} for t, v in top.items()]
    return {"id": 7, "token": token, "bytes": list(token.encode()), "logprob": logprob, "top_logprobs": alternatives}


async def test_llamacpp_chat_shaped_logprobs_become_the_legacy_arrays(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    """llama.cpp's `/completions` answers `logprobs: {content: [...]}` (chat's shape), whole and
    streamed; they were read as no log probabilities at all (`logprobs: null`)."""
    paris = llamacpp_logprob(" Paris", -0.1, {" Paris": -0.1, " Lyon": -2.5})
    dot = llamacpp_logprob(".", -0.25, {".": -0.25, ",": -1.5})
    whole = {
        "choices": [{"index": 0, "text": " Paris.", "finish_reason": "stop", "logprobs": {"content": [paris, dot]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
    primary.enqueue(reply_json(200, whole))
    primary.enqueue(
        reply_sse(
            [
                {"choices": [{"index": 0, "text": " Paris", "logprobs": {"content": [paris]}}]},
                {"choices": [{"index": 0, "text": ".", "logprobs": {"content": [dot]}}]},
                {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
            ]
        )
    )
    payload = {"prompt": PROMPT, "max_tokens": 2, "logprobs": 2}

    answer = (await gw.client.post(LEGACY, json=payload)).json()
    streamed = data_lines((await gw.client.post(LEGACY, json={**payload, "stream": True})).text)

    assert answer["choices"][0]["logprobs"] == {
        "tokens": [" Paris", "."],
        "token_logprobs": [-0.1, -0.25],
        "top_logprobs": [{" Paris": -0.1, " Lyon": -2.5}, {".": -0.25, ",": -1.5}],
        "text_offset": [0, 6],
    }
    assert [chunk["choices"][0]["logprobs"] for chunk in streamed[:-1]] == [
        {
            "tokens": [" Paris"],
            "token_logprobs": [Decimal("-0.1")],
            "top_logprobs": [{" Paris": Decimal("-0.1"), " Lyon": Decimal("-2.5")}],
            "text_offset": [0],
        },
        {
            "tokens": ["."],
            "token_logprobs": [Decimal("-0.25")],
            "top_logprobs": [{".": Decimal("-0.25"), ",": Decimal("-1.5")}],
            "text_offset": [6],
        },
        None,
    ]


async def test_no_log_probabilities_unless_asked(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    """ingress.md: `logprobs` "when asked". The transcript's vLLM sends them anyway: the stream
    is one chunk per token, with no empty-text chunks carrying them, and the whole answer has none."""
    primary.enqueue("vllm_completions_stream")
    primary.enqueue("vllm_completions_json")
    payload = {"prompt": PROMPT, "max_tokens": 4, "stream": True}

    response = await gw.client.post(LEGACY, json=payload)
    whole = await gw.client.post(LEGACY, json={**payload, "stream": False})

    *chunks, done = data_lines(response.text)
    assert done == "[DONE]"
    assert [(c["choices"][0]["text"], c["choices"][0]["logprobs"]) for c in chunks] == [
        (" Paris", None),
        (".", None),
        (" It", None),
        (" is", None),
        ("", None),
    ]
    assert whole.json()["choices"][0]["logprobs"] is None


async def test_defaults_prompt_array_echo_and_no_usage_when_the_upstream_reported_none(
    gw: GatewayHandle, primary: ReplayUpstream
) -> None:
    whole = {"id": "cmpl-x", "object": "text_completion", "choices": [{"text": "Say: hi", "finish_reason": "stop"}]}
    primary.enqueue(reply_json(200, whole))
    primary.enqueue(
        reply_sse([{"id": "cmpl-y", "choices": [{"text": "hi"}]}, {"choices": [{"text": "", "finish_reason": "stop"}]}])
    )
    payload = {"model": "chat", "prompt": ["Say:"], "echo": True, "stop": "\n"}

    answer = await gw.client.post(LEGACY, json=payload)
    streamed = await gw.client.post(LEGACY, json={**payload, "stream": True, "stream_options": {"include_usage": True}})

    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"] == [text_choice("Say: hi", None, "stop")]
    assert "usage" not in answer.json()
    lines = data_lines(streamed.text)
    assert [line if line == "[DONE]" else line["choices"] for line in lines] == [
        [text_choice("hi")],
        [text_choice("", None, "stop")],
        "[DONE]",
    ]
    assert primary.requests[0].json() == {
        "model": "org/chat-1-instruct",
        "prompt": "Say:",
        "max_tokens": 16,  # the legacy default, always sent
        "stream": False,
        "stop": ["\n"],
        "echo": True,
    }
    rows = await gw.ledger_rows()
    assert [(r["api"], r["input_tokens"], r["output_tokens"], r["cost_usd"]) for r in rows] == [
        ("openai_completions", None, None, None),
        ("openai_completions", None, None, None),
    ]


async def test_error_after_the_stream_started(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue(reply_sse([{"id": "cmpl-t", "choices": [{"text": "Once"}]}], done=False))

    response = await gw.client.post(LEGACY, json={"prompt": "Tell", "stream": True})

    lines = data_lines(response.text)
    assert lines[0]["choices"] == [text_choice("Once")]
    assert lines[1:] == [
        {
            "error": {
                "message": "the upstream failed mid-answer: upstream stream ended before a finish reason",
                "type": "upstream_error",
                "code": 502,
            }
        }
    ]
    (row,) = await gw.ledger_rows()
    assert (row["api"], row["status"], row["error_status"]) == ("openai_completions", "error", 502)


BAD = [
    ({"model": "solo", "prompt": "x"}, "model"),
    ({"model": "no-such-model", "prompt": "x"}, "model"),
    ({"model": 7, "prompt": "x"}, "model"),
    ({}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, 2, 3]}, "prompt"),
    ({"prompt": [[1, 2], [3]]}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": "x" * 270_000}, "prompt"),  # at least 33,750 tokens: past chat-1's 32,768 window
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 20000}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 4097}, "max_tokens"),  # chat-1's max_output is 4096
    ({"prompt": "x", "logprobs": 6}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "temperature": 2.5}, "temperature"),
    ({"prompt": "x", "top_p": "high"}, "top_p"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "seed": 1.5}, "seed"),
    ({"prompt": "x", "seed": 2**63}, "seed"),  # past a 64-bit integer, OpenAI's and vLLM's
    ({"prompt": "x", "echo": "yes"}, "echo"),
    ({"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": -3}, "frequency_penalty"),
    ({"prompt": "x", "stream": "true"}, "stream"),
    ({"prompt": "x", "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),  # without stream
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "n": 2}, "n"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "suffix": "end"}, "suffix"),
]


@pytest.mark.parametrize(("payload", "param"), BAD)
async def test_bad_input_is_400_naming_the_field(
    gw: GatewayHandle, primary: ReplayUpstream, payload: dict[str, Any], param: str
) -> None:
    response = await gw.client.post(LEGACY, json=payload)

    body = assert_error(response, 400, "invalid_request_error", param)
    assert body["error"]["message"].startswith(f"{param}: ")
    assert primary.requests == []


async def test_unknown_fields_are_ignored_and_the_guards_hold(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue("vllm_completions_json")
    ok = await gw.client.post(LEGACY, json={"prompt": "x", "n": 1, "best_of": 1, "logit_bias": {"1": 5}, "user": "u"})
    assert ok.status_code == 200, ok.text
    nested = b'{"prompt": ' + b"[" * 70 + b"]" * 70 + b"}"
    assert_error(await gw.client.post(LEGACY, content=nested), 400, "invalid_request_error", "prompt")
    form = await gw.client.post(
        LEGACY, content=b"prompt=x", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert_error(form, 415, "invalid_request_error")
    assert_error(await gw.client.get(LEGACY), 405, "invalid_request_error")
    assert len(primary.requests) == 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": "solo"}, "model"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"stop": ["1", "2", "3", "4", "5"]}, "stop"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 20000}, "max_tokens"),
        ({"logprobs": 6}, "logprobs"),
    ],
)
async def test_sdk_bad_request_error(client: openai.OpenAI, fields: dict[str, Any], param: str) -> None:
    request: dict[str, Any] = {"model": "chat", "prompt": "hi", **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        await asyncio.to_thread(client.completions.create, **request)

    assert caught.value.status_code == 400
    body: Any = caught.value.body
    assert (body["type"], body["param"], body["code"]) == ("invalid_request_error", param, 400)
    assert caught.value.response.headers["x-request-id"] == body["request_id"]


MOCK_CATALOG = catalog_toml(
    model("mock-model", ("mock", "mock-model", 10), aliases=["mock"], capabilities=["completions"], default=True),
    prices=[price("mock", "mock-model", "1.00", "2.00")],
)


def mock_prompt_tokens(request: TextCompletionRequest, stream: bool) -> int:
    """What the mock counts: the body the gateway sends it, at four bytes a token."""
    config = ProviderConfig("mock", "local", "http://unused/v1", wire=KIND_DEFAULTS["local"])
    return estimate_prompt_tokens(build_text_body(request, "mock-model", config, stream=stream))


async def test_against_the_mock_upstream_server(start_gateway: StartGateway) -> None:
    options = ScriptedOptions(chunks=3, tokens_per_chunk=1, text="alpha beta gamma")
    async with scripted_server(options) as server:
        providers = {"mock": {"kind": "local", "base_url": server.url}}
        gw = await start_gateway(providers=providers, catalog=MOCK_CATALOG)
        async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0) as sdk:
            whole = await sdk.completions.create(model="mock-model", prompt="Say:", logprobs=2, echo=True)
            stream = await sdk.completions.create(
                model="mock", prompt="Go", max_tokens=3, stream=True, stream_options={"include_usage": True}
            )
            items = [item async for item in stream]

    (choice,) = whole.choices
    assert (choice.text, choice.finish_reason) == ("Say:alpha beta gamma", "stop")
    assert choice.logprobs is not None
    assert choice.logprobs.tokens == ["Say:", "alpha", " beta", " gamma"]
    assert choice.logprobs.token_logprobs == [None, -0.1, -0.2, -0.3]
    assert choice.logprobs.top_logprobs == [
        None,
        {"alpha": -0.1, "alpha~1": -1.1},
        {" beta": -0.2, "beta~1": -1.2},
        {" gamma": -0.3, "gamma~1": -1.3},
    ]
    assert choice.logprobs.text_offset == [0, 4, 9, 14]
    prompt = mock_prompt_tokens(TextCompletionRequest(prompt="Say:", logprobs=2, echo=True), stream=False)
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (prompt, 3)
    *chunks, last = items
    assert [c.choices[0].text for c in chunks] == ["alpha", " beta", " gamma", ""]
    assert chunks[-1].choices[0].finish_reason == "stop"
    prompt = mock_prompt_tokens(TextCompletionRequest(prompt="Go", max_tokens=3, stream=True), stream=True)
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (prompt, 3)
    rows = await gw.ledger_rows()
    assert [(r["api"], r["provider"], r["streamed"], r["output_tokens"]) for r in rows] == [
        ("openai_completions", "mock", False, 3),
        ("openai_completions", "mock", True, 3),
    ]
    assert Decimal(rows[1]["cost_usd"]) == (prompt * Decimal("1.00") + 3 * Decimal("2.00")) / 1_000_000
