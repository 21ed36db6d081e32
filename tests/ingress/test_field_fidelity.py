"""Fields of OpenAI's Chat Completions request that must reach the upstream as the client sent
them (ingress.md: where the page is silent, what OpenAI's own API does): what a client sends back
from an answer of the gateway's own, and the parts of a `json_schema` format beyond its schema."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.ingress.conftest import upstream_body
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream, reply_json

USER: list[Any] = [{"role": "user", "content": "hi"}]
REFUSED = {
    "id": "chatcmpl-r1",
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": None, "refusal": "I can't help with that."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9},
}


async def test_a_refusal_sent_back_in_the_history_reaches_the_upstream(
    aclient: openai.AsyncOpenAI, primary: ReplayUpstream
) -> None:
    """An agent appends the answer's message to its history, as the SDK's docs do; a refusal's is
    `content: null` with `refusal` (OpenAI's request type has the field): its text goes upstream
    as the assistant's turn, never a 400 on `content` nor a turn silently missing."""
    primary.enqueue(reply_json(200, REFUSED))
    primary.enqueue(answer("Because it is harmful."))

    first = await aclient.chat.completions.create(model="chat", messages=USER)
    refused = first.choices[0].message
    assert (refused.content, refused.refusal) == (None, "I can't help with that.")
    again: list[Any] = [*USER, refused, {"role": "user", "content": "why?"}]
    second = await aclient.chat.completions.create(model="chat", messages=again)

    assert second.choices[0].message.content == "Because it is harmful."
    assert upstream_body(primary)["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "I can't help with that."},
        {"role": "user", "content": "why?"},
    ]


async def test_a_refusal_beside_text_is_not_dropped(aclient: openai.AsyncOpenAI, primary: ReplayUpstream) -> None:
    primary.enqueue(answer())
    assistant: Any = {"role": "assistant", "content": "Here is part of it.", "refusal": "The rest I won't."}

    await aclient.chat.completions.create(model="chat", messages=[*USER, assistant, {"role": "user", "content": "ok"}])

    assert upstream_body(primary)["messages"][1] == {
        "role": "assistant",
        "content": "Here is part of it.\nThe rest I won't.",
    }


@pytest.mark.parametrize(
    "content",
    ["", [{"type": "refusal", "refusal": "The rest I won't."}]],
)
async def test_a_refusal_goes_upstream_once_and_alone(
    aclient: openai.AsyncOpenAI, primary: ReplayUpstream, content: Any
) -> None:
    """Beside `content: ""`, or beside a refusal part saying it already, the refusal is the turn's
    one text: not a blank line before it, nor twice."""
    primary.enqueue(answer())
    assistant: Any = {"role": "assistant", "content": content, "refusal": "The rest I won't."}

    await aclient.chat.completions.create(model="chat", messages=[*USER, assistant, {"role": "user", "content": "ok"}])

    assert upstream_body(primary)["messages"][1] == {"role": "assistant", "content": "The rest I won't."}


async def test_a_json_schema_keeps_its_description(aclient: openai.AsyncOpenAI, primary: ReplayUpstream) -> None:
    """OpenAI: `description` is "used by the model to determine how to respond in the format"."""
    primary.enqueue(answer('{"city": "Paris"}'))
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    spec: Any = {"name": "pick", "description": "The city the user should visit next", "schema": schema, "strict": True}

    await aclient.chat.completions.create(
        model="chat", messages=USER, response_format={"type": "json_schema", "json_schema": spec}
    )

    assert upstream_body(primary)["response_format"] == {"type": "json_schema", "json_schema": spec}
