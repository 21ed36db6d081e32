"""What a misbehaving model's answer becomes at the OpenAI door, read by the real client: an answer
with nothing in it streams to the same message as its JSON answer."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.support.replies import answer, chunk
from tests.support.upstream import ReplayUpstream, reply_sse

USER: Any = {"role": "user", "content": "Weather in Paris?"}


@pytest.mark.parametrize("deltas", [[], [{"content": ""}], [{"reasoning_content": "Hmm."}]])
async def test_an_answer_with_nothing_in_it_streams_to_the_message_its_json_answer_is(
    aclient: openai.AsyncOpenAI, primary: ReplayUpstream, deltas: list[dict[str, Any]]
) -> None:
    """A model that says nothing (finish `stop`): the stream helper's message has `content: ""`, as
    the JSON answer's has (and OpenAI's first chunk sends), so an agent that puts it back in the
    history gets its next turn, not a 400 for `content: null`."""
    primary.enqueue(reply_sse([chunk({"role": "assistant"}), *[chunk(d) for d in deltas], chunk({}, "stop")]))
    async with aclient.chat.completions.stream(model="chat", messages=[USER]) as stream:
        message = (await stream.get_final_completion()).choices[0].message
    assert message.content == ""

    primary.enqueue(answer("Sorry, again: it is sunny."))
    history: Any = [USER, message, {"role": "user", "content": "Well?"}]
    completion = await aclient.chat.completions.create(model="chat", messages=history)
    assert completion.choices[0].message.content == "Sorry, again: it is sunny."
