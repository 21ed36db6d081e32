"""`POST /v1/chat/completions` and `GET /v1/models` through the official `openai` SDK, sync and async:
what the SDK parses, what the upstream received, exact usage and cost, and the ledger rows."""

from __future__ import annotations

import asyncio
import json
import time
from decimal import Decimal
from typing import Any

import openai
import pydantic
import pytest

from tests.ingress.conftest import primary_cost, upstream_body
from tests.support.gateway import GatewayHandle
from tests.support.observe import rows_when
from tests.support.replies import answer, chunk, usage_chunk
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse

USER = [{"role": "user", "content": "hi"}]


def usage(prompt: int, completion: int, cached: int = 0, written: int = 0, reasoning: int = 0) -> dict[str, Any]:
    """The inclusive usage object without its cost."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


async def test_plain_chat_sync_client(gw: GatewayHandle, client: openai.OpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue(answer("Hello there."))
    before = int(time.time())

    raw = await asyncio.to_thread(
        client.chat.completions.with_raw_response.create, model="chat", messages=USER, max_tokens=16
    )

    completion = raw.parse()
    request_id = raw.headers["x-request-id"]
    assert (completion.id, completion.object, completion.model) == (request_id, "chat.completion", "chat-1")
    (choice,) = completion.choices
    assert (choice.index, choice.finish_reason, choice.logprobs) == (0, "stop", None)
    assert (choice.message.role, choice.message.content, choice.message.tool_calls) == (
        "assistant",
        "Hello there.",
        None,
    )
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        3,
        1,
        4,
    )
    body = json.loads(raw.http_response.text, parse_float=Decimal)
    assert body["usage"] == {**usage(3, 1), "cost": primary_cost(3, 1), "cost_source": "estimated"}
    assert before <= body["created"] <= time.time()
    (row,) = await gw.ledger_rows()
    assert (row["request_id"], row["api"], row["streamed"]) == (request_id, "openai_chat", False)
    assert upstream_body(primary) == {
        "model": "org/chat-1-instruct",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "max_tokens": 16,
    }


async def test_conversation_async_client(aclient: openai.AsyncOpenAI, primary: ReplayUpstream) -> None:
    """Every role, string and part-array content, and a tool round trip reach the upstream intact."""
    primary.enqueue(answer("18C and sunny."))
    messages: list[Any] = [
        {"role": "system", "content": "Be terse.", "name": "rules"},
        {"role": "developer", "content": [{"type": "text", "text": "Use metric."}], "name": "ops"},
        {"role": "user", "content": [{"type": "text", "text": "Weather in"}, {"type": "text", "text": "Paris?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": [{"type": "text", "text": "18C"}, {"type": "text", "text": "sunny"}],
        },
    ]

    completion = await aclient.chat.completions.create(model="chat-1", messages=messages)

    assert completion.choices[0].message.content == "18C and sunny."
    assert upstream_body(primary)["messages"] == [
        {"role": "system", "content": "Be terse.", "name": "rules"},  # names kept (they were dropped)
        {"role": "system", "content": "Use metric.", "name": "ops"},  # the local wire profile sends developer as system
        {"role": "user", "content": "Weather in\nParis?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    "type": "function",
                }
            ],
        },
        {"role": "tool", "content": "18C\nsunny", "tool_call_id": "call_1"},  # text parts joined as the user's
    ]


async def test_media_parts_reach_the_upstream(aclient: openai.AsyncOpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue(answer("A cat."))
    content: list[Any] = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "https://img.test/cat.png", "detail": "low"}},
    ]

    completion = await aclient.chat.completions.create(model="chat", messages=[{"role": "user", "content": content}])

    assert completion.choices[0].message.content == "A cat."
    assert upstream_body(primary)["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://img.test/cat.png", "detail": "low"}},
            ],
        }
    ]


async def test_sampling_options_and_extras_reach_the_upstream(
    aclient: openai.AsyncOpenAI, primary: ReplayUpstream
) -> None:
    primary.enqueue(answer())

    await aclient.chat.completions.create(
        model="chat",
        messages=USER,
        max_tokens=10,
        max_completion_tokens=50,
        temperature=0.3,
        top_p=0.9,
        stop="END",
        seed=7,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        reasoning_effort="minimal",
        user="u-1",
        metadata={"trace": "t1"},
        parallel_tool_calls=False,
        extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "unknown_field": {"ignored": True}},
    )

    sent = upstream_body(primary)
    assert {key: value for key, value in sent.items() if key != "messages"} == {
        "model": "org/chat-1-instruct",
        "stream": False,
        "stop": ["END"],
        "max_tokens": 50,  # max_completion_tokens wins
        "reasoning_effort": "low",
        "temperature": 0.3,
        "top_p": 0.9,
        "seed": 7,
        "top_k": 40,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.25,
        "user": "u-1",  # and no `parallel_tool_calls` without tools (OpenAI refuses it)
    }


async def test_exact_usage_and_cost_streamed_and_ledger_row(
    gw: GatewayHandle, client: openai.OpenAI, primary: ReplayUpstream
) -> None:
    """primalabs' stream: 100 prompt tokens (64 cached), 80 completion tokens (30 reasoning)."""
    primary.enqueue("primalabs_reasoning_cached_stream")

    def run() -> tuple[Any, str]:
        stream = client.chat.completions.create(
            model="solo", messages=USER, stream=True, stream_options={"include_usage": True}
        )
        request_id = stream.response.headers["x-request-id"]
        return list(stream), request_id

    chunks, request_id = await asyncio.to_thread(run)

    *content, last = chunks
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.model_dump(exclude={"cost", "cost_source"}, exclude_none=True) == usage(100, 80, 64, 0, 30)
    cost = primary_cost(36, 50, reasoning=30, cache_read=64)
    assert cost == Decimal("0.0000372")
    assert Decimal(str(last.usage.model_extra["cost"])) == cost  # type: ignore[index]
    assert last.usage.model_extra["cost_source"] == "estimated"  # type: ignore[index]
    assert all(c.usage is None for c in content)
    assert {c.id for c in chunks} == {request_id}
    assert {c.model for c in chunks} == {"solo-1"}

    (row,) = await gw.ledger_rows()
    assert (row["request_id"], row["api"], row["model"], row["provider"]) == (
        request_id,
        "openai_chat",
        "solo-1",
        "primary",
    )
    assert (row["status"], row["streamed"], row["stop_reason"]) == ("ok", True, "end_turn")
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_tokens"]) == (36, 50, 30)
    assert (row["cache_read_tokens"], row["cache_write_tokens"]) == (64, 0)
    assert Decimal(row["cost_usd"]) == cost


async def test_exact_usage_json_cost_null_when_a_bucket_is_unpriced(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    """Cache writes without a cache-write rate: the cost is unknown, said as null, never 0."""
    primary.enqueue("nonstream_usage_details")

    response = await gw.client.post("/v1/chat/completions", json={"model": "solo-1", "messages": USER})

    assert response.status_code == 200, response.text
    body = response.json(parse_float=Decimal)
    assert body["usage"] == {**usage(500, 120, 300, 150, 100), "cost": None, "cost_source": None}
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "42", "reasoning_content": "Deep thought."}
    (row,) = await gw.ledger_rows()
    assert (row["api"], row["input_tokens"], row["output_tokens"], row["reasoning_tokens"]) == (
        "openai_chat",
        50,
        20,
        100,
    )
    assert (row["cache_read_tokens"], row["cache_write_tokens"], row["cost_usd"]) == (300, 150, None)


async def test_authoritative_cost_is_exact(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    primary.enqueue("openrouter_cost_stream")
    payload = {"model": "solo", "messages": USER, "stream": True, "stream_options": {"include_usage": True}}

    response = await gw.client.post("/v1/chat/completions", json=payload)

    lines = [line for line in response.text.split("\n\n") if line]
    assert lines[-1] == "data: [DONE]"
    final = json.loads(lines[-2].removeprefix("data: "), parse_float=Decimal)
    # the upstream billed 0.000123456789012345678: rounded once to the ledger's 18 places, so the
    # answer and the ledger say the same
    assert str(final["usage"]["cost"]) == "0.000123456789012346"
    assert final["usage"]["cost_source"] == "authoritative"
    (row,) = await rows_when(gw, 1)
    assert Decimal(row["cost_usd"]) == Decimal("0.000123456789012346")


async def test_no_usage_object_when_the_upstream_reported_none(
    gw: GatewayHandle, aclient: openai.AsyncOpenAI, primary: ReplayUpstream
) -> None:
    primary.enqueue(
        reply_json(200, {"id": "x", "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}]})
    )
    primary.enqueue("no_usage_stream")
    empty = {"id": "y", "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}], "usage": {}}
    primary.enqueue(reply_json(200, empty))  # an empty usage object is no report either, not zeros

    raw = await aclient.chat.completions.with_raw_response.create(model="chat", messages=USER)
    stream = await aclient.chat.completions.create(
        model="chat", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    raw_empty = await aclient.chat.completions.with_raw_response.create(model="chat", messages=USER)

    assert "usage" not in json.loads(raw.http_response.text)
    assert raw.parse().usage is None
    assert "usage" not in json.loads(raw_empty.http_response.text)
    assert [c.choices[0].delta.content for c in chunks] == [None, "Yo", None]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)
    rows = await gw.ledger_rows()
    assert [(r["api"], r["input_tokens"], r["output_tokens"], r["cost_usd"]) for r in rows] == [
        ("openai_chat", None, None, None),
        ("openai_chat", None, None, None),
        ("openai_chat", None, None, None),
    ]


async def test_stream_helper_reassembles_text_and_reasoning(client: openai.OpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue("vllm_reasoning_stream")

    def run() -> Any:
        with client.chat.completions.stream(model="chat", messages=USER) as stream:
            return stream.get_final_completion()

    completion = await asyncio.to_thread(run)

    message = completion.choices[0].message
    assert (message.content, completion.choices[0].finish_reason) == ("4", "stop")
    assert message.model_extra["reasoning_content"] == "2 and 2 make 4."  # type: ignore[index]
    assert completion.model == "chat-1"


def _tools() -> list[Any]:
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name} somewhere",
                "parameters": {"type": "object", "properties": {key: {"type": "string"}}, "required": [key]},
            },
        }
        for name, key in (("get_weather", "city"), ("get_time", "tz"))
    ]


async def _streamed_calls(aclient: openai.AsyncOpenAI) -> Any:
    async with aclient.chat.completions.stream(
        model="chat", messages=USER, tools=_tools(), tool_choice="auto", parallel_tool_calls=True
    ) as stream:
        return await stream.get_final_completion()


def _calls(completion: Any) -> list[tuple[str, str, Any]]:
    message = completion.choices[0].message
    assert message.content is None
    assert completion.choices[0].finish_reason == "tool_calls"
    return [(c.id, c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]


async def test_parallel_tool_calls_streamed_vllm(aclient: openai.AsyncOpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue("vllm_parallel_tool_calls_stream")

    completion = await _streamed_calls(aclient)

    assert _calls(completion) == [
        ("call_paris", "get_weather", {"city": "Paris"}),
        ("call_tokyo", "get_weather", {"city": "Tokyo"}),
    ]
    sent = upstream_body(primary)
    assert [t["function"]["name"] for t in sent["tools"]] == ["get_weather", "get_time"]
    assert (sent["tool_choice"], sent["parallel_tool_calls"]) == ("auto", True)


class GetWeather(pydantic.BaseModel):
    city: str


async def test_interleaved_parallel_calls_through_the_stream_helper_events(
    aclient: openai.AsyncOpenAI, primary: ReplayUpstream
) -> None:
    """A strict tool's arguments are parsed at each `arguments.done` event: interleaved fragments
    made it fire with '' (a ValidationError out of the loop)."""
    primary.enqueue("vllm_parallel_tool_calls_stream")
    done = []
    async with aclient.chat.completions.stream(
        model="chat", messages=USER, tools=[openai.pydantic_function_tool(GetWeather, name="get_weather")]
    ) as stream:
        async for event in stream:
            if event.type == "tool_calls.function.arguments.done":
                done.append((event.index, event.arguments, event.parsed_arguments))
    assert done == [
        (0, '{"city":"Paris"}', GetWeather(city="Paris")),
        (1, '{"city":"Tokyo"}', GetWeather(city="Tokyo")),
    ]
    (tool,) = upstream_body(primary)["tools"]
    assert tool["function"]["strict"] is True  # the SDK's strict tool stays strict upstream (it was dropped)


async def test_parallel_tool_calls_that_share_index_0(aclient: openai.AsyncOpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue("parallel_tool_calls_same_index_stream")

    completion = await _streamed_calls(aclient)

    assert _calls(completion) == [("call_a", "get_weather", {"city": "Oslo"}), ("call_b", "get_time", {"tz": "CET"})]


async def test_tool_call_whose_id_and_name_repeat(aclient: openai.AsyncOpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue("llamacpp_tool_call_repeated_id_stream")

    completion = await _streamed_calls(aclient)

    assert _calls(completion) == [("Xb2kQ9", "get_weather", {"city": "Berlin"})]


async def test_calls_without_arguments_stream_as_an_empty_object(
    aclient: openai.AsyncOpenAI, primary: ReplayUpstream
) -> None:
    """An upstream that sends no argument (`""`) for a call of a tool without parameters: the
    client read `""`, which `json.loads` refuses; OpenAI sends `{}`. Both the live call and the
    one sent whole at the end."""
    primary.enqueue(
        reply_sse(
            [
                chunk(
                    {
                        "tool_calls": [
                            {"index": 0, "id": "c1", "type": "function", "function": {"name": "now", "arguments": ""}}
                        ]
                    }
                ),
                chunk(
                    {
                        "tool_calls": [
                            {"index": 1, "id": "c2", "type": "function", "function": {"name": "now", "arguments": ""}}
                        ]
                    }
                ),
                chunk({}, "tool_calls"),
            ]
        )
    )
    completion = await _streamed_calls(aclient)
    assert _calls(completion) == [("c1", "now", {}), ("c2", "now", {})]
    whole = [{"id": "c3", "type": "function", "function": {"name": "now", "arguments": ""}}]
    message = {"role": "assistant", "content": None, "tool_calls": whole}
    primary.enqueue(reply_json(200, {"choices": [{"message": message, "finish_reason": "tool_calls"}]}))
    answered = await aclient.chat.completions.create(model="chat", messages=USER, tools=_tools())
    assert _calls(answered) == [("c3", "now", {})]  # not streamed: the same


async def test_tool_calls_whole_answer_and_named_choice(client: openai.OpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue("nonstream_tool_calls")

    completion = await asyncio.to_thread(
        client.chat.completions.create,
        model="chat",
        messages=USER,
        tools=_tools(),
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )

    assert _calls(completion) == [("call_x1", "get_weather", {"city": "Paris"}), ("call_x2", "get_time", {"tz": "CET"})]
    assert upstream_body(primary)["tool_choice"] == {"function": {"name": "get_time"}, "type": "function"}


class Weather(pydantic.BaseModel):
    city: str
    temp_c: int


async def test_structured_output_parsed_by_the_sdk(client: openai.OpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue(answer('{"city": "Paris", "temp_c": 18}'))

    completion = await asyncio.to_thread(
        client.chat.completions.parse, model="chat", messages=USER, response_format=Weather
    )

    assert completion.choices[0].message.parsed == Weather(city="Paris", temp_c=18)
    response_format = upstream_body(primary)["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["schema"]["properties"] == {
        "city": {"title": "City", "type": "string"},
        "temp_c": {"title": "Temp C", "type": "integer"},
    }
    assert (response_format["json_schema"]["name"], response_format["json_schema"]["strict"]) == ("Weather", True)


async def test_a_json_schema_keeps_its_name_and_strictness(
    aclient: openai.AsyncOpenAI, primary: ReplayUpstream
) -> None:
    """The client's `name` and `strict` reach the upstream; `strict` absent is OpenAI's default,
    not strict (a strict upstream refuses schemas that only a strict mode forbids)."""
    primary.set_default(answer('{"a": 1}'))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for spec, sent in (
        ({"name": "loose", "schema": schema}, ("loose", False)),
        ({"name": "tight", "schema": schema, "strict": True}, ("tight", True)),
        ({"name": "Page[Item]", "schema": schema}, ("Page[Item]", False)),  # the SDK's `.parse()` of a generic model
    ):
        response_format: Any = {"type": "json_schema", "json_schema": spec}
        await aclient.chat.completions.create(model="chat", messages=USER, response_format=response_format)
        upstream = upstream_body(primary, len(primary.requests) - 1)["response_format"]["json_schema"]
        assert (upstream["name"], upstream["strict"], upstream["schema"]) == (*sent, schema)


async def test_structured_output_streamed(aclient: openai.AsyncOpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue("structured_output_stream")
    primary.enqueue(answer('{"ok": true}'))

    async with aclient.chat.completions.stream(model="chat", messages=USER, response_format=Weather) as stream:
        completion = await stream.get_final_completion()
    await aclient.chat.completions.create(model="chat", messages=USER, response_format={"type": "json_object"})

    assert completion.choices[0].message.parsed == Weather(city="Paris", temp_c=18)
    assert upstream_body(primary, 1)["response_format"] == {"type": "json_object"}


LOGPROBS = {
    "content": [
        {"token": "Hi", "logprob": -0.25, "bytes": [72, 105], "top_logprobs": [{"token": "Hi", "logprob": -0.25}]},
        {
            "token": "!",
            "logprob": -1.5,
            "bytes": None,
            "top_logprobs": [{"token": "!", "logprob": -1.5}, {"token": "?", "logprob": None}],  # SGLang's -inf
        },
    ]
}


WHOLE_WITH_LOGPROBS = {
    "id": "x",
    "choices": [{"index": 0, "message": {"content": "Hi!"}, "logprobs": LOGPROBS, "finish_reason": "stop"}],
}


def token_chunk(text: str, token: int) -> dict[str, Any]:
    """A streamed chunk of `text` with the log probabilities of LOGPROBS' token `token`."""
    logprobs = {"content": LOGPROBS["content"][token : token + 1]}
    return {"id": "s", "choices": [{"index": 0, "delta": {"content": text}, "logprobs": logprobs}]}


async def test_logprobs_relayed_whole_and_streamed(aclient: openai.AsyncOpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue(reply_json(200, WHOLE_WITH_LOGPROBS))
    primary.enqueue(reply_sse([token_chunk("Hi", 0), token_chunk("!", 1), chunk({}, "stop"), usage_chunk(3, 2)]))

    completion = await aclient.chat.completions.create(model="chat", messages=USER, logprobs=True, top_logprobs=1)
    async with aclient.chat.completions.stream(model="chat", messages=USER, logprobs=True, top_logprobs=1) as stream:
        chunks = [event.chunk async for event in stream if event.type == "chunk"]
        final = await stream.get_final_completion()

    expected = [
        ("Hi", -0.25, [72, 105], [("Hi", -0.25)]),
        ("!", -1.5, None, [("!", -1.5), ("?", None)]),
    ]
    for result in (completion, final):
        logprobs = result.choices[0].logprobs
        assert logprobs is not None
        assert logprobs.content is not None
        seen = [(t.token, t.logprob, t.bytes, [(a.token, a.logprob) for a in t.top_logprobs]) for t in logprobs.content]
        assert seen == expected
    assert [(c.choices[0].delta.content, c.choices[0].logprobs is not None) for c in chunks] == [
        (None, False),
        ("Hi", True),
        ("!", True),
        (None, False),
    ]
    assert final.choices[0].message.content == "Hi!"
    sent = upstream_body(primary)
    assert (sent["logprobs"], sent["top_logprobs"]) == (True, 1)


async def test_logprobs_an_upstream_sends_unasked_are_not_relayed(
    aclient: openai.AsyncOpenAI, primary: ReplayUpstream
) -> None:
    """ingress.md: `logprobs` "when asked and the upstream gave them"; some servers send them anyway."""
    primary.enqueue(reply_json(200, WHOLE_WITH_LOGPROBS))
    primary.enqueue(reply_sse([token_chunk("Hi", 0), chunk({}, "stop")]))

    completion = await aclient.chat.completions.create(model="chat", messages=USER)
    stream = await aclient.chat.completions.create(model="chat", messages=USER, stream=True)
    chunks = [c async for c in stream]

    assert completion.choices[0].logprobs is None
    assert completion.choices[0].message.content == "Hi!"
    assert [(c.choices[0].delta.content, c.choices[0].logprobs) for c in chunks] == [
        (None, None),
        ("Hi", None),
        (None, None),
    ]


JAN_1_2026 = 1_767_225_600  # the catalog's prices take effect on 2026-01-01


async def test_models_list(client: openai.OpenAI, aclient: openai.AsyncOpenAI) -> None:
    page = await asyncio.to_thread(client.models.list)
    apage = await aclient.models.list()

    for models in (page.data, apage.data):
        assert [(m.id, m.object, m.owned_by, m.created) for m in models] == [
            ("chat-1", "model", "switchyard", JAN_1_2026),  # when its first price took effect
            ("free-1", "model", "switchyard", 0),  # no price
            ("solo-1", "model", "switchyard", JAN_1_2026),
        ]


async def test_models_retrieve(aclient: openai.AsyncOpenAI) -> None:
    """OpenAI's `GET /v1/models/{model}`: a catalog id, or an alias answered with its id; 404 else."""
    for name in ("chat-1", "chat"):
        model = await aclient.models.retrieve(name)
        assert (model.id, model.object, model.owned_by, model.created) == ("chat-1", "model", "switchyard", JAN_1_2026)
    with pytest.raises(openai.NotFoundError) as missing:
        await aclient.models.retrieve("no-such-model")
    assert missing.value.status_code == 404
    assert "no-such-model" in missing.value.message


async def test_ledger_rows_name_the_ingress(
    gw: GatewayHandle, aclient: openai.AsyncOpenAI, primary: ReplayUpstream
) -> None:
    primary.enqueue(answer("one"))
    primary.enqueue(reply_sse([chunk({"content": "two"}), chunk({}, "length"), usage_chunk(7, 5)]))
    primary.enqueue(answer("three"))

    first = await aclient.chat.completions.with_raw_response.create(model="chat", messages=USER)
    stream = await aclient.chat.completions.create(model="free-1", messages=USER, stream=True)
    second = [c async for c in stream]
    native = await gw.client.post(
        "/api/v1/completions", json={"messages": [{"role": "user", "content": [{"kind": "text", "data": "hi"}]}]}
    )

    rows = await gw.ledger_rows()
    assert [(r["api"], r["model"], r["streamed"], r["status"], r["stop_reason"]) for r in rows] == [
        ("openai_chat", "chat-1", False, "ok", "end_turn"),
        ("openai_chat", "free-1", True, "ok", "max_tokens"),
        ("unified", "chat-1", False, "ok", "end_turn"),
    ]
    assert rows[0]["request_id"] == first.headers["x-request-id"]
    assert rows[1]["request_id"] == second[0].id
    assert rows[2]["request_id"] == native.headers["x-request-id"]
    assert (rows[1]["input_tokens"], rows[1]["output_tokens"], rows[1]["cost_usd"], rows[1]["price_id"]) == (
        7,
        5,
        None,
        None,
    )
    assert (rows[0]["input_tokens"], rows[0]["output_tokens"], Decimal(rows[0]["cost_usd"])) == (
        3,
        1,
        primary_cost(3, 1),
    )
