"""The sampling options OpenAI-compatible servers take, and log probabilities coming back."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from providers.config import KIND_DEFAULTS, ProviderConfig
from providers.events import Finish, Logprobs, TextDelta, TokenLogprob, TopLogprob
from providers.openai_chat import ChatStreamParser, build_chat_body
from providers.types import CompletionRequest

LOCAL = ProviderConfig(name="local", kind="local", base_url="http://127.0.0.1:8000/v1", wire=KIND_DEFAULTS["local"])
MESSAGES = [{"role": "user", "content": [{"kind": "text", "data": "hi"}]}]


def body(**fields: Any) -> dict[str, Any]:
    req = msgspec.convert({"messages": MESSAGES, **fields}, CompletionRequest)
    decoded: dict[str, Any] = msgspec.json.decode(build_chat_body(req, "m", LOCAL, stream=False))
    return decoded


def test_sampling_extras_go_under_their_own_names() -> None:
    extras = {
        "seed": 7,
        "top_k": 40,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "presence_penalty": -0.5,
        "frequency_penalty": 0.25,
        "logprobs": True,
        "top_logprobs": 2,
        "parallel_tool_calls": False,
        "user": "u-1",
    }
    sent = body(**extras, tools=[{"name": "f"}])  # `parallel_tool_calls` goes only with tools
    assert {key: sent[key] for key in extras} == extras
    assert "parallel_tool_calls" not in body(**extras)
    assert set(body()) == {"model", "messages", "stream"}  # nothing sent that was not asked for


def test_json_object_without_a_schema() -> None:
    assert body(json_object=True)["response_format"] == {"type": "json_object"}
    schema = {"type": "object"}
    assert body(json_object=True, schema=schema)["response_format"] == {
        "type": "json_schema",
        "json_schema": {"schema": schema, "name": "response", "strict": True},
    }


@pytest.mark.parametrize(("field", "value"), [("top_logprobs", 21), ("presence_penalty", 2.5), ("min_p", 1.5)])
def test_out_of_range_extras_are_refused(field: str, value: float) -> None:
    with pytest.raises(msgspec.ValidationError, match=f"at `\\$.{field}`"):
        msgspec.convert({"messages": MESSAGES, field: value}, CompletionRequest)


LOGPROBS = {
    "content": [
        {"token": "Hi", "logprob": -0.25, "bytes": [72, 105], "top_logprobs": [{"token": "Hi", "logprob": -0.25}]},
        {"token": "!", "logprob": -1.5, "bytes": None, "top_logprobs": []},
    ]
}
EXPECTED = Logprobs(
    [
        TokenLogprob("Hi", -0.25, [72, 105], [TopLogprob("Hi", -0.25)]),
        TokenLogprob("!", -1.5, None, []),
    ]
)


def test_streamed_logprobs_follow_their_delta() -> None:
    parser = ChatStreamParser()
    chunk = {"choices": [{"index": 0, "delta": {"content": "Hi!"}, "logprobs": LOGPROBS, "finish_reason": "stop"}]}
    events = parser.feed(msgspec.json.encode(chunk)) + parser.finish()
    assert events == [TextDelta("Hi!"), EXPECTED, Finish("stop")]


def test_whole_answer_logprobs() -> None:
    answer = {"choices": [{"index": 0, "message": {"content": "Hi!"}, "logprobs": LOGPROBS, "finish_reason": "stop"}]}
    assert ChatStreamParser().parse_whole(msgspec.json.encode(answer)) == [TextDelta("Hi!"), EXPECTED, Finish("stop")]
