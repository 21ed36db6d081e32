"""SSEParser: framing only — payloads out of arbitrary network reads."""

from __future__ import annotations

import pytest

from providers.sse import SSEParser
from tests.support.transcripts import TRANSCRIPTS, read_transcript

STREAMS = sorted(
    path.name
    for path in TRANSCRIPTS.glob("*.json")
    if path.name.endswith("_stream.json") and not path.name.startswith("mock_")
)


def chunks_of(name: str) -> list[str]:
    return read_transcript(name).chunks


def feed_all(reads: list[bytes]) -> list[str]:
    parser = SSEParser()
    payloads: list[str] = []
    for data in reads:
        payloads.extend(parser.feed(data))
    return payloads + parser.finish()


def test_vllm_stream_payloads() -> None:
    payloads = feed_all([chunk.encode() for chunk in chunks_of("vllm_text_stream.json")])
    assert len(payloads) == 7
    assert payloads[1] == (
        '{"id":"chatcmpl-7f3a9c2e1b0d4e5f","object":"chat.completion.chunk","created":1767225600,'
        '"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,'
        '"finish_reason":null}],"usage":null}'
    )
    assert payloads[-1] == "[DONE]"


@pytest.mark.parametrize("name", STREAMS)
def test_any_split_gives_the_same_payloads(name: str) -> None:
    """A transcript's writes, one read of everything, and one read per byte all agree."""
    raw = "".join(chunks_of(name)).encode()
    as_recorded = feed_all([chunk.encode() for chunk in chunks_of(name)])
    assert feed_all([raw]) == as_recorded
    assert feed_all([raw[i : i + 1] for i in range(len(raw))]) == as_recorded
    assert all(payload and "\r" not in payload for payload in as_recorded)


def test_crlf_split_between_cr_and_lf() -> None:
    chunks = chunks_of("sglang_reasoning_content_stream.json")
    assert chunks[1].endswith("\r")
    assert chunks[2].startswith("\n")
    parser = SSEParser()
    assert len(parser.feed(chunks[0].encode())) == 1
    assert parser.feed(chunks[1].encode()) == []
    [payload] = parser.feed(chunks[2].encode())
    assert '"reasoning_content":"Think"' in payload


def test_comments_and_ignored_fields() -> None:
    parser = SSEParser()
    data = b': ping\n\nevent: message\nid: 7\nretry: 100\ndata: {"a":1}\n\n: OPENROUTER PROCESSING\n\n'
    assert parser.feed(data) == ['{"a":1}']
    assert parser.feed(b"event: only\nid: 8\n\n") == []


def test_multiline_data_is_joined_with_newlines() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: first\ndata:second\ndata\ndata:  two spaces\n\n") == ["first\nsecond\n\n two spaces"]


def test_line_split_across_reads() -> None:
    parser = SSEParser()
    assert parser.feed(b"da") == []
    assert parser.feed(b'ta: {"x"') == []
    assert parser.feed(b":2}\n") == []
    assert parser.feed(b"\ndata: y\n\n") == ['{"x":2}', "y"]


def test_utf8_character_split_across_reads() -> None:
    encoded = 'data: {"t":"héllo ☃"}\n\n'.encode()
    cut = encoded.index("☃".encode()) + 1
    parser = SSEParser()
    assert parser.feed(encoded[:cut]) == []
    assert parser.feed(encoded[cut:]) == ['{"t":"héllo ☃"}']


def test_bare_cr_line_endings() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r\rdata: b\r") == ["a"]
    assert parser.feed(b"\r") == ["b"]
    parser = SSEParser()
    assert parser.feed(b"data: a\r\r") == ["a"]
    assert parser.feed(b"\ndata: c\r") == []  # that \n completed the \r\n: no blank line
    assert parser.feed(b"\n\r\n") == ["c"]


def test_finish_dispatches_an_event_without_a_trailing_blank_line() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"done":true}\n\ndata: last') == ['{"done":true}']
    assert parser.finish() == ["last"]
    assert parser.finish() == []
    parser = SSEParser()
    assert parser.feed(b"data: last\n") == []
    assert parser.finish() == ["last"]


def test_finish_with_nothing_pending() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: x\n\n") == ["x"]
    assert parser.finish() == []
    assert SSEParser().finish() == []


def test_byte_order_mark_and_blank_lines_between_events() -> None:
    parser = SSEParser()
    assert parser.feed(b"") == []
    assert parser.feed(b"\xef\xbb\xbfdata: a\n\n\n\n\ndata: b\n\n") == ["a", "b"]


def test_every_stream_transcript_is_covered() -> None:
    assert len(STREAMS) == 18


@pytest.mark.parametrize(
    ("reads", "payloads"),
    [
        ([b'error: {"code":500,"message":"boom"}\n\n'], ['{"error":{"code":500,"message":"boom"}}']),
        ([b"error: engine crashed\r\n\r\n"], ['{"error":"engine crashed"}']),
        ([b'error: {"code":500,"mess\n\n'], ['{"error":"{\\"code\\":500,\\"mess"}']),  # cut off: a string
        ([b'error: {"code":1}\nevent: x\n\n', b"data: [DONE]\n\n"], ['{"error":{"code":1}}', "[DONE]"]),
        ([b'event: error\ndata: {"a":1}\nerror: {"b":2}\n\n'], ['{"a":1}']),  # data, when there is some, wins
        ([b"error:\n\n"], []),
    ],
)
def test_an_error_field_alone_is_an_error_chunk(reads: list[bytes], payloads: list[str]) -> None:
    """llama.cpp's `error: {json}` events (late 2024 to October 2025) come out as the in-stream
    error chunk `{"error": …}` the stream parsers already read."""
    assert feed_all(reads) == payloads
