"""Characters end to end: what an upstream meant reaches the client on every door, whole or
streamed, whatever bytes carried it and however the network cut them.

The upstream sends what real servers send and msgspec alone refuses: bytes that are no UTF-8 (a
token cut mid-character, a Latin-1 error page), a leading byte-order mark (some servers' writers
add one), a lone UTF-16 surrogate escape echoed in an error message. A stream of those bytes is
read with U+FFFD for the bad ones (`providers.sse`), so the whole answer of the same bytes must be
too — not a 502 that fails over to a second backend while the first one's billed tokens vanish
from the ledger row. An upstream's 4xx message reaches the client (api.md: "with the upstream's
message") even when it is not strict UTF-8 JSON.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from devtools.mock_http import Reply
from tests.support.client import COMPLETIONS, body, parse_sse, types
from tests.support.gateway import GatewayHandle
from tests.support.upstream import ReplayUpstream

BOM = b"\xef\xbb\xbf"
USAGE = b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}'


def whole_reply(answer: bytes) -> Reply:
    return Reply(status=200, headers=[("content-type", "application/json")], chunks=[answer])


def whole_chat(content: bytes, prefix: bytes = b"") -> Reply:
    """A whole chat answer whose content is `content`, the raw bytes inside the JSON string."""
    message = b'{"role":"assistant","content":"' + content + b'"}'
    choice = b'{"index":0,"message":' + message + b',"finish_reason":"stop"}'
    return whole_reply(
        prefix + b'{"id":"chatcmpl-t1","object":"chat.completion","choices":[' + choice + b"]," + USAGE + b"}"
    )


def whole_text(text: bytes) -> Reply:
    """A whole legacy completion whose text is `text`, raw bytes inside the JSON string."""
    choice = b'{"index":0,"text":"' + text + b'","finish_reason":"stop"}'
    return whole_reply(b'{"id":"cmpl-t1","object":"text_completion","choices":[' + choice + b"]," + USAGE + b"}")


def byte_by_byte(stream: bytes) -> Reply:
    """An event stream written one byte per write (each its own chunk on the wire)."""
    chunks = [stream[i : i + 1] for i in range(len(stream))]
    return Reply(
        status=200, headers=[("content-type", "text/event-stream")], chunks=chunks, chunked=True, chunk_delay_s=0.001
    )


def chat_events(*contents: bytes) -> bytes:
    head = b'data: {"id":"chatcmpl-t1","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    events = [head + b'{"content":"' + content + b'"},"finish_reason":null}]}\n\n' for content in contents]
    events.append(head + b'{},"finish_reason":"stop"}]}\n\n')
    events.append(b'data: {"id":"chatcmpl-t1","object":"chat.completion.chunk","choices":[],' + USAGE + b"}\n\n")
    return b"".join(events) + b"data: [DONE]\n\n"


async def answer_text(gw: GatewayHandle, door: str) -> str:
    """The whole answer's text as each door's client reads it."""
    if door == "native":
        response = await gw.client.post(COMPLETIONS, json=body())
        assert response.status_code == 200, response.text
        return "".join(part["data"] for part in response.json()["message"]["content"] if part["kind"] == "text")
    if door == "anthropic":
        async with anthropic.AsyncAnthropic(base_url=gw.url, api_key="unused", max_retries=0) as claude:
            message = await claude.messages.create(
                model="chat-1", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
            )
            return "".join(block.text for block in message.content if block.type == "text")
    async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0) as sdk:
        if door == "legacy":
            completion = await sdk.completions.create(model="chat-1", prompt="hi")
            return completion.choices[0].text
        chat = await sdk.chat.completions.create(model="chat-1", messages=[{"role": "user", "content": "hi"}])
        return chat.choices[0].message.content or ""


@pytest.mark.parametrize("door", ["native", "chat", "legacy", "anthropic"])
async def test_a_whole_answer_with_bytes_that_are_no_utf8_reads_as_its_stream_does(
    gw: GatewayHandle, primary: ReplayUpstream, secondary: ReplayUpstream, door: str
) -> None:
    """`a\\xff\\xfeb`: streamed, the client gets `a��b`; whole, it was a 502 "malformed response", the
    request failed over to the secondary (billed twice) and the row lost the primary's usage."""
    primary.enqueue(whole_text(b"a\xff\xfeb") if door == "legacy" else whole_chat(b"a\xff\xfeb"))

    assert await answer_text(gw, door) == "a\ufffd\ufffdb"

    assert secondary.requests == []
    [row] = await gw.ledger_rows()
    assert (row["status"], row["provider"], row["attempts"]) == ("ok", "primary", 1)
    assert (row["input_tokens"], row["output_tokens"]) == (3, 2)


async def test_a_whole_answer_after_a_byte_order_mark_is_read(
    gw: GatewayHandle, primary: ReplayUpstream, secondary: ReplayUpstream
) -> None:
    """RFC 8259 lets a parser ignore a leading BOM, and the stream parser does: a whole answer
    with one was a 502 and a failover."""
    primary.enqueue(whole_chat("héllo 😀".encode(), prefix=BOM))

    assert await answer_text(gw, "native") == "héllo 😀"

    assert secondary.requests == []
    [row] = await gw.ledger_rows()
    assert (row["status"], row["input_tokens"], row["output_tokens"]) == ("ok", 3, 2)


async def test_a_byte_order_mark_cut_between_reads_loses_no_event(gw: GatewayHandle, primary: ReplayUpstream) -> None:
    """A BOM whose three bytes came in separate reads was not recognised: the first event's line
    began with its bytes, read as an unknown field and dropped — the answer's first words lost,
    silently, with a clean finish."""
    primary.enqueue(byte_by_byte(BOM + chat_events("日本".encode(), "語 😀".encode())))

    response = await gw.client.post(COMPLETIONS, json=body(stream=True))

    assert response.status_code == 200, response.text
    frames = parse_sse(response.text)
    assert types(frames) == ["stream_start", "text_start", "text_delta", "text_delta", "text_end", "finish"]
    assert [data["delta"] for _, data in frames if data["type"] == "text_delta"] == ["日本", "語 😀"]


def envelope(message: bytes) -> bytes:
    return b'{"error":{"message":"' + message + b'","type":"invalid_request_error","code":400}}'


ERROR_BODIES = {
    "lone surrogate": (envelope(b"no tool named \\ud83d"), "no tool named \ufffd"),
    "latin-1": (envelope(b"param\xe8tre invalide"), "param\ufffdtre invalide"),
    "byte-order mark": (BOM + envelope(b"prompt too long"), "prompt too long"),
    "fastapi detail": (b'{"detail":"caf\xe9 is not a model"}', "caf\ufffd is not a model"),
}


@pytest.mark.parametrize("case", list(ERROR_BODIES))
@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_error_message_that_is_no_strict_json_reaches_the_client(
    gw: GatewayHandle, primary: ReplayUpstream, case: str, stream: bool
) -> None:
    """The 400 carried "upstream returned 400" instead of the upstream's reason."""
    raw, message = ERROR_BODIES[case]
    primary.enqueue(Reply(status=400, headers=[("content-type", "application/json")], chunks=[raw]))

    response = await gw.client.post(COMPLETIONS, json=body(stream=stream))

    assert response.status_code == 400
    error: dict[str, Any] = response.json()["error"]
    assert (error["message"], error["type"]) == (message, "invalid_request_error")
    assert response.json()["errors"][0]["detail"] == message
    [row] = await gw.ledger_rows()
    assert (row["status"], row["error_type"], row["error_status"]) == ("error", "invalid_request_error", 400)


def error_in_200(stream: bool) -> Reply:
    """A 200 whose answer is an error (llama.cpp, vLLM), its message holding a lone surrogate."""
    error = b'{"error":{"message":"bad \\ud83d thing","type":"invalid_request_error","code":400}}'
    if stream:
        return Reply(status=200, headers=[("content-type", "text/event-stream")], chunks=[b"data: " + error + b"\n\n"])
    return whole_reply(error)


DOOR_PATHS = {"native": COMPLETIONS, "chat": "/v1/chat/completions", "anthropic": "/v1/messages"}


def door_body(door: str, stream: bool) -> dict[str, Any]:
    if door == "native":
        return body(stream=stream)
    return {"model": "chat-1", "max_tokens": 16, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("door", list(DOOR_PATHS))
@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_error_with_a_lone_surrogate_is_a_400_not_a_500(
    gw: GatewayHandle, primary: ReplayUpstream, door: str, stream: bool
) -> None:
    """The message, decoded by the stdlib (msgspec refuses the escape), kept its lone surrogate,
    which no JSON encoder takes: the error body failed to encode, and the client got a bare
    `500 Internal Server Error` in plain text (api.md: every error is JSON)."""
    primary.enqueue(error_in_200(stream))

    response = await gw.client.post(DOOR_PATHS[door], json=door_body(door, stream))

    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert (error["type"], error["message"]) == ("invalid_request_error", "bad \ufffd thing")
    [row] = await gw.ledger_rows()
    assert (row["status"], row["error_type"], row["error_status"]) == ("error", "invalid_request_error", 400)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_string_with_a_lone_surrogate_reaches_the_anthropic_client(
    gw: GatewayHandle, primary: ReplayUpstream, stream: bool
) -> None:
    """vLLM names the stop string met (`stop_reason`); the Anthropic door reports it as
    `stop_sequence`. One with a lone surrogate was a 500 (whole) or an `internal error` event
    after the text (streamed)."""
    content = b'{"role":"assistant","content":"hi"}'
    finish = b'"finish_reason":"stop","stop_reason":"\\ud83d"'
    if stream:
        head = b'data: {"id":"chatcmpl-t1","object":"chat.completion.chunk","choices":[{"index":0,'
        events = head + b'"delta":' + content + b',"finish_reason":null}]}\n\n'
        events += head + b'"delta":{},' + finish + b"}]}\n\ndata: [DONE]\n\n"
        primary.enqueue(Reply(status=200, headers=[("content-type", "text/event-stream")], chunks=[events]))
    else:
        answer = b'{"id":"chatcmpl-t1","object":"chat.completion","choices":[{"index":0,"message":' + content
        primary.enqueue(whole_reply(answer + b"," + finish + b"}]}"))

    async with anthropic.AsyncAnthropic(base_url=gw.url, api_key="unused", max_retries=0) as claude:
        ask: Any = {"model": "chat-1", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        if stream:
            async with claude.messages.stream(**ask) as events_in:
                message = await events_in.get_final_message()
        else:
            message = await claude.messages.create(**ask)

    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "\ufffd")
    assert [block.text for block in message.content if block.type == "text"] == ["hi"]
