"""Work and memory that must grow with the request or the answer, not faster (the size audit).

Each test states a bound that does not depend on the machine's speed where it can: bytes decoded,
references kept, copies alive; the SSE framing, which has no seam to count through, compares its
CPU on one long event with its CPU on the same bytes as many short ones (linear: about equal;
re-joining the open event at every read: a hundred times more).
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import msgspec
import pytest

from providers.adapter import Provider, make_client
from providers.config import ProviderConfig
from providers.events import ToolCallArgs, ToolCallStart
from providers.openai_chat import ChatStreamParser
from providers.sse import SSEParser
from providers.types import CompletionRequest
from tests.support.replies import answer
from tests.support.upstream import ReplayUpstream


def _llama_delta(fragment: str) -> bytes:
    """A llama.cpp tool-call delta: the id and the name repeated beside every fragment."""
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "write", "arguments": fragment}}
    return msgspec.json.encode({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})


def test_tool_arguments_named_in_every_delta_are_not_decoded_again_at_each_fragment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A list of objects in 2,000 fragments, each object's fragment opening with `{`: the parser
    asks whether the call is whole before it takes such a fragment for a new call; answering by
    decoding all the arguments so far each time was quadratic (10,000 fragments: 8 s of CPU)."""
    fragments = ['{"items": [', *(f'{{"k": {i}}}, ' for i in range(2_000)), '{"k": -1}]}']
    decoded = 0
    decode = msgspec.json.decode

    def counting(data: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal decoded
        decoded += len(data)
        return decode(data, *args, **kwargs)

    monkeypatch.setattr(msgspec.json, "decode", counting)
    parser = ChatStreamParser()
    events = [event for fragment in fragments for event in parser.feed(_llama_delta(fragment))]
    events += parser.feed(b'{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}')
    arguments = "".join(fragments)
    assert [event for event in events if isinstance(event, ToolCallStart)] == [ToolCallStart(0, "call_1", "write")]
    assert "".join(event.fragment for event in events if isinstance(event, ToolCallArgs)) == arguments
    assert decoded <= 2 * len(arguments), f"{decoded:,} characters decoded for {len(arguments):,} of arguments"


def _cpu(reads: list[bytes]) -> float:
    best = float("inf")
    for _ in range(3):
        parser = SSEParser()
        parser.feed(b": open\n\n")
        started = time.process_time()
        for read in reads:
            parser.feed(read)
        best = min(best, time.process_time() - started)
    return best


def test_a_long_event_is_not_joined_and_scanned_again_at_every_read() -> None:
    """6 MiB in 16 KiB reads: one event (a whole tool call's arguments in one delta, a long answer
    sent whole) costs about what 384 events of 16 KiB cost, not 384 copies of the growing event."""
    size, step = 6 << 20, 16 << 10
    payload = b'{"choices":[{"delta":{"content":"' + b"x" * size + b'"}}]}'
    long_event = b"data: " + payload + b"\n\n"
    short_events = b"".join(b"data: " + b"x" * (step - 8) + b"\n\n" for _ in range(len(long_event) // step))
    one = _cpu([long_event[i : i + step] for i in range(0, len(long_event), step)])
    many = _cpu([short_events[i : i + step] for i in range(0, len(short_events), step)])
    parser = SSEParser()
    parser.feed(b": open\n\n")
    out = [data for i in range(0, len(long_event), step) for data in parser.feed(long_event[i : i + step])]
    assert out == [payload.decode()]
    assert one <= 10 * many + 0.05, (
        f"one 6 MiB event: {one * 1000:.0f} ms; the same bytes as short events: {many * 1000:.0f} ms"
    )


async def test_a_large_request_body_is_not_copied_behind_its_head() -> None:
    """A 4 MB prompt: when the upstream has the request, the gateway's provider layer holds its
    encoded body once (msgspec's buffer: 1.5 times the body), not a second copy joined to
    the head (`b"%s%s" % (head, body)`)."""
    prompt = "lorem ipsum " * (4_000_000 // 12)
    request = msgspec.convert(
        {"messages": [{"role": "user", "content": [{"kind": "text", "data": prompt}]}]}, CompletionRequest
    )
    held: list[int] = []
    async with ReplayUpstream() as upstream:
        respond = upstream.respond

        def measured(received: Any) -> Any:
            snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*/providers/*")])
            held.append(sum(stat.size for stat in snapshot.statistics("filename") if stat.size >= 1 << 20))
            return respond(received)

        upstream.respond = measured  # type: ignore[method-assign,assignment]
        upstream.enqueue(answer("ok"))
        client = make_client()
        config = ProviderConfig(name="local", kind="openai_compatible", base_url=upstream.url)
        tracemalloc.start()
        try:
            [_ async for _ in Provider(config, client).events(request, "m", stream=False)]
        finally:
            tracemalloc.stop()
            await client.aclose()
    assert held
    assert held[0] <= 2 * len(prompt), f"{held[0]:,} bytes held for a {len(prompt):,}-byte prompt"


def test_a_long_event_in_small_reads_holds_about_its_size() -> None:
    """An event that comes in one-byte reads (a chunked body of one-byte chunks: one read each)
    holds about its own bytes until its blank line, as `MAX_EVENT_BYTES` bounds it; kept as a
    list of its reads, each read cost a bytes object and a list slot, forty times the event."""
    parser = SSEParser()
    parser.feed(b": open\n\n")
    parser.feed(b"data: ")
    size = 100_000
    tracemalloc.start()
    try:
        for _ in range(size):
            parser.feed(bytes(bytearray(b"x")))  # a new object at each read, as the socket gives
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held <= 4 * size, f"{held:,} bytes held for a {size:,}-byte event"
    assert parser.feed(b"\n\n") == ["x" * size]
