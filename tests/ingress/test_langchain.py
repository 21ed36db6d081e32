"""LangChain's `ChatOpenAI` pointed at the gateway (`base_url`), unchanged: invoke, tools, streaming,
structured output. Its sync calls block, so they run in a thread (the gateway shares the loop)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pydantic
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessageChunk
from langchain_openai import ChatOpenAI

from tests.ingress.conftest import upstream_body
from tests.support.gateway import GatewayHandle
from tests.support.replies import answer, chunk, usage_chunk
from tests.support.upstream import ReplayUpstream, reply_sse


class GetWeather(pydantic.BaseModel):
    """Current weather in a city."""

    city: str


class Weather(pydantic.BaseModel):
    city: str
    temp_c: int


@pytest.fixture
def chat(gw: GatewayHandle) -> ChatOpenAI:
    return ChatOpenAI(base_url=gw.url + "/v1", api_key="unused", model="chat", max_retries=0, stream_usage=True)  # type: ignore[arg-type]


def joined(chunks: list[BaseMessageChunk]) -> AIMessageChunk:
    total = functools.reduce(lambda a, b: a + b, chunks)
    assert isinstance(total, AIMessageChunk)
    return total


async def test_invoke(gw: GatewayHandle, chat: ChatOpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue(answer("Bonjour."))

    message = await asyncio.to_thread(chat.invoke, "Say hello in French")

    assert isinstance(message, AIMessage)
    assert message.content == "Bonjour."
    assert message.usage_metadata is not None
    assert (message.usage_metadata["input_tokens"], message.usage_metadata["output_tokens"]) == (3, 1)
    assert message.usage_metadata["total_tokens"] == 4
    assert message.response_metadata["model_name"] == "chat-1"
    assert message.response_metadata["finish_reason"] == "stop"
    (row,) = await gw.ledger_rows()
    assert (message.response_metadata["id"], row["api"]) == (row["request_id"], "openai_chat")
    assert upstream_body(primary)["messages"] == [{"role": "user", "content": "Say hello in French"}]


async def test_bind_tools_invoke(chat: ChatOpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue("nonstream_tool_calls")

    message = await asyncio.to_thread(chat.bind_tools([GetWeather]).invoke, "Weather in Paris?")

    assert isinstance(message, AIMessage)
    assert [(c["id"], c["name"], c["args"]) for c in message.tool_calls] == [
        ("call_x1", "get_weather", {"city": "Paris"}),
        ("call_x2", "get_time", {"tz": "CET"}),
    ]
    assert message.invalid_tool_calls == []
    (tool,) = upstream_body(primary)["tools"]
    assert tool["function"]["name"] == "GetWeather"
    assert tool["function"]["parameters"]["properties"] == {"city": {"type": "string"}}


async def test_stream_concatenated(chat: ChatOpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue(
        reply_sse([chunk({"content": "Hel"}), chunk({"content": "lo"}), chunk({}, "stop"), usage_chunk(9, 2)])
    )

    chunks: list[BaseMessageChunk] = await asyncio.to_thread(lambda: list(chat.stream("hi")))

    total = joined(chunks)
    assert total.content == "Hello"
    assert total.usage_metadata is not None
    assert (total.usage_metadata["input_tokens"], total.usage_metadata["output_tokens"]) == (9, 2)
    assert total.response_metadata["finish_reason"] == "stop"
    assert upstream_body(primary)["stream"] is True


async def test_parallel_tool_calls_streamed(chat: ChatOpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue("vllm_parallel_tool_calls_stream")

    chunks: list[Any] = [c async for c in chat.bind_tools([GetWeather]).astream("Paris and Tokyo?")]

    total = joined(chunks)
    assert [(c["id"], c["name"], c["args"]) for c in total.tool_calls] == [
        ("call_paris", "get_weather", {"city": "Paris"}),
        ("call_tokyo", "get_weather", {"city": "Tokyo"}),
    ]


async def test_structured_output(chat: ChatOpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue(answer('{"city": "Paris", "temp_c": 18}'))

    result = await chat.with_structured_output(Weather).ainvoke("Weather in Paris?")

    assert result == Weather(city="Paris", temp_c=18)
    assert upstream_body(primary)["response_format"]["type"] == "json_schema"
