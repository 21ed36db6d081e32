"""The `local` adapter against a real `transformers serve` on a tiny random model.

What this server does on the wire, and what the adapter must make of it:
- a streamed chat answer ends with the finish chunk, which carries `usage`, and then the body
  ends: there is no `data: [DONE]`, and the adapter must not call that a truncated stream;
- usage is sent whether or not `stream_options.include_usage` was asked for;
- `max_tokens` bounds the answer, and `completion_tokens` counts exactly the generated tokens;
- errors are FastAPI-shaped (`{"detail": ...}`), e.g. a 400 for a model the server does not serve.

The model's text is noise, so these tests assert event shapes, exact token counts (the prompt's
count comes from the model's own tokenizer and chat template) and finish reasons, never text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import msgspec
import pytest

from providers.adapter import Provider, make_client
from providers.config import KIND_DEFAULTS, ProviderConfig
from providers.errors import Failure, UpstreamError
from providers.events import Event, Finish, TextDelta, UpstreamMeta, Usage, UsageReport
from providers.types import (
    CompletionRequest,
    Message,
    TextPart,
    ToolCallData,
    ToolCallPart,
    ToolDefinition,
    ToolResultData,
    ToolResultPart,
)
from tests.support.ports import free_port

if TYPE_CHECKING:
    from tests.local.conftest import LocalServer, PromptTokens

STREAM_MODES = [pytest.param(True, id="stream"), pytest.param(False, id="json")]
SYSTEM = "You are a helpful assistant. Answer briefly."
CONVERSATION = [
    ("user", "What is the weather like in Paris today?"),
    ("assistant", "It is sunny, 21 degrees."),
    ("user", "And tomorrow?"),
]


def _local_config(base_url: str) -> ProviderConfig:
    return ProviderConfig(name="local", kind="local", base_url=base_url, wire=KIND_DEFAULTS["local"])


def _text(role: str, text: str) -> Message:
    return Message(role=role, content=[TextPart(data=text)])  # type: ignore[arg-type]


async def _events(provider: Provider, req: CompletionRequest, model: str, *, stream: bool) -> list[Event]:
    return [event async for event in provider.events(req, model, stream=stream)]


def _assert_answer(events: list[Event], *, usage: Usage, stream: bool) -> None:
    """UpstreamMeta?, TextDelta+ (one when not streamed), UsageReport, Finish("length")."""
    body = events[1:] if events and isinstance(events[0], UpstreamMeta) else events
    if body is not events:
        meta = events[0]
        assert isinstance(meta, UpstreamMeta)
        assert meta.upstream_request_id
    deltas, tail = body[:-2], body[-2:]
    assert tail == [UsageReport(usage=usage), Finish(reason="length")]
    assert deltas, "no text before the finish"
    assert all(isinstance(delta, TextDelta) and delta.text for delta in deltas)
    if stream:
        assert len(deltas) <= usage.output_tokens
    else:
        assert len(deltas) == 1


@pytest.fixture
async def provider(transformers_server: LocalServer) -> AsyncIterator[Provider]:
    client = make_client()
    try:
        yield Provider(_local_config(transformers_server.base_url), client)
    finally:
        await client.aclose()


@pytest.mark.parametrize("stream", STREAM_MODES)
async def test_max_tokens_ends_with_length_and_exact_usage(
    provider: Provider, transformers_server: LocalServer, prompt_tokens: PromptTokens, stream: bool
) -> None:
    req = CompletionRequest(messages=[_text("user", "Hello there!")], max_tokens=5)
    events = await _events(provider, req, transformers_server.model, stream=stream)
    prompt = prompt_tokens([("user", "Hello there!")])
    assert prompt > 0
    _assert_answer(events, usage=Usage(input_tokens=prompt, output_tokens=5), stream=stream)


@pytest.mark.parametrize("stream", STREAM_MODES)
async def test_system_and_multi_turn_conversation(
    provider: Provider, transformers_server: LocalServer, prompt_tokens: PromptTokens, stream: bool
) -> None:
    req = CompletionRequest(messages=[_text(role, text) for role, text in CONVERSATION], system=SYSTEM, max_tokens=3)
    events = await _events(provider, req, transformers_server.model, stream=stream)
    prompt = prompt_tokens([("system", SYSTEM), *CONVERSATION])
    _assert_answer(events, usage=Usage(input_tokens=prompt, output_tokens=3), stream=stream)


@pytest.mark.parametrize("stream", STREAM_MODES)
async def test_tool_call_and_result_turns_are_accepted(
    provider: Provider, transformers_server: LocalServer, prompt_tokens: PromptTokens, stream: bool
) -> None:
    call = ToolCallData(id="call_1", name="get_weather", arguments={"city": "Paris"})
    req = CompletionRequest(
        messages=[
            _text("user", "What is the weather like in Paris today?"),
            Message(role="assistant", content=[ToolCallPart(data=call)]),
            Message(
                role="tool",
                content=[ToolResultPart(data=ToolResultData(tool_call_id="call_1", content="sunny"))],
                tool_call_id="call_1",
            ),
        ],
        tools=[ToolDefinition(name="get_weather", parameters={"type": "object", "properties": {}})],
        max_tokens=4,
    )
    events = await _events(provider, req, transformers_server.model, stream=stream)
    report = next(event for event in events if isinstance(event, UsageReport))
    first_turn = prompt_tokens([("user", "What is the weather like in Paris today?")])
    assert report.usage.input_tokens > first_turn
    _assert_answer(events, usage=Usage(input_tokens=report.usage.input_tokens, output_tokens=4), stream=stream)


@pytest.mark.parametrize("stream", STREAM_MODES)
async def test_unserved_model_is_a_client_error(provider: Provider, stream: bool) -> None:
    req = CompletionRequest(messages=[_text("user", "Hello there!")], max_tokens=2)
    with pytest.raises(UpstreamError) as caught:
        await _events(provider, req, "not-the-served-model", stream=stream)
    assert caught.value.kind is Failure.CLIENT
    assert caught.value.status == 400


async def test_probe_is_true_when_the_server_is_up(provider: Provider) -> None:
    assert await provider.probe() is True


async def test_probe_is_false_against_a_closed_port() -> None:
    client = make_client()
    try:
        provider = Provider(_local_config(f"http://127.0.0.1:{free_port()}/v1"), client)
        assert await provider.probe() is False
    finally:
        await client.aclose()


async def test_a_prefill_needs_continue_final_message_off_on_this_server(transformers_server: LocalServer) -> None:
    """`transformers serve` refuses a field it does not know (422 "Unexpected fields"), so the
    `local` default that makes vLLM and SGLang continue a prefill (`continue_final_message`) is
    a client error here, and `continue_final_message = false` serves the prefill as a plain turn."""
    messages = [_text("user", "Hello there!"), _text("assistant", "Well,")]
    req = CompletionRequest(messages=messages, max_tokens=2, continue_final_message=True)
    plain = msgspec.structs.replace(KIND_DEFAULTS["local"], continue_final_message=False)
    client = make_client()
    try:
        with pytest.raises(UpstreamError) as caught:
            await _events(
                Provider(_local_config(transformers_server.base_url), client),
                req,
                transformers_server.model,
                stream=False,
            )
        assert (caught.value.kind, caught.value.status) == (Failure.CLIENT, 422)
        assert "continue_final_message" in str(caught.value)
        config = ProviderConfig(name="local", kind="local", base_url=transformers_server.base_url, wire=plain)
        events = await _events(Provider(config, client), req, transformers_server.model, stream=False)
        assert events[-1] == Finish(reason="length")
    finally:
        await client.aclose()
