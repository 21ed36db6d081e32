"""Fixtures for the provider tests: recorded upstream transcripts (`tests.support.transcripts`),
and replaying them through the pure parsers exactly as the adapter does (SSE framing, then
chunk → events)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from providers.errors import UpstreamError
from providers.events import Event
from providers.openai_chat import ChatStreamParser
from providers.openai_stream import OpenAIStreamParser
from providers.sse import SSEParser
from tests.support.transcripts import Transcript, read_transcript


class Replay(msgspec.Struct):
    """What a stream transcript turned into: its events, and the error that ended it, if any."""

    events: list[Event]
    error: UpstreamError | None = None


def replay_stream(chunks: list[bytes], parser: OpenAIStreamParser[Any] | None = None) -> Replay:
    """`chunks` through `SSEParser` and `parser` (a fresh `ChatStreamParser` by default)."""
    sse = SSEParser()
    parser = parser if parser is not None else ChatStreamParser()
    events: list[Event] = []
    try:
        for chunk in chunks:
            for payload in sse.feed(chunk):
                events.extend(parser.feed(payload))
        for payload in sse.finish():
            events.extend(parser.feed(payload))
        events.extend(parser.finish())
    except UpstreamError as exc:
        return Replay(events, exc)
    return Replay(events)


@pytest.fixture
def transcript() -> Callable[[str], Transcript]:
    return read_transcript


@pytest.fixture
def replay() -> Callable[[str], Replay]:
    """Replay a stream transcript's writes through SSEParser + ChatStreamParser."""

    def run(name: str) -> Replay:
        return replay_stream([chunk.encode() for chunk in read_transcript(name).chunks])

    return run
