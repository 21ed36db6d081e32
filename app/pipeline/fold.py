"""The fold of canonical upstream events into `stream_event` frames and the final message.

One `Assembly` per attempt that produced content. Streaming and non-streaming requests share it:
with `emit=True` each event also appends its SSE frames to `out` (drained by the pipeline after
every event); with `emit=False` only the message is built. So the JSON response is literally the
fold of the same event stream, and there is one accounting path.

Block rules (api.md): text and reasoning blocks open on their first delta and close when another
kind of block starts or the stream finishes; every tool call is its own block, correlated by id,
and all open calls are closed (with their arguments parsed) at the end, in order of appearance.
"""

from __future__ import annotations

from typing import Any

import msgspec

from app.edge import unified_format as wire
from providers import events as ev
from providers.types import (
    ContentPart,
    Message,
    TextPart,
    ThinkingData,
    ThinkingPart,
    ToolCallData,
    ToolCallPart,
)

STOP_REASONS: dict[str, wire.StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_calls",
    "content_filter": "content_filter",
}
_json_decoder = msgspec.json.Decoder()


class _Call:
    __slots__ = ("fragments", "id", "name")

    def __init__(self, call_id: str, name: str) -> None:
        self.id = call_id
        self.name = name
        self.fragments: list[str] = []


class Assembly:
    __slots__ = (
        "_block",
        "_block_parts",
        "_calls",
        "_texts",
        "emit",
        "finish_reason",
        "out",
        "parts",
        "upstream_request_id",
        "usage",
    )

    def __init__(self, *, emit: bool) -> None:
        self.emit = emit
        self.out: list[bytes] = []
        self.parts: list[ContentPart | _Call] = []
        self.usage: ev.UsageReport | None = None
        self.finish_reason: str | None = None
        self.upstream_request_id: str | None = None
        self._block: str | None = None  # "text" | "reasoning" | None
        self._block_parts: list[str] = []
        self._texts = 0
        self._calls: dict[int, _Call] = {}

    def feed(self, event: ev.Event) -> None:
        if isinstance(event, ev.TextDelta):
            if event.text:
                self._delta("text", event.text)
        elif isinstance(event, ev.ReasoningDelta):
            if event.text:
                self._delta("reasoning", event.text)
        elif isinstance(event, ev.ToolCallStart):
            self._close_block()
            call = _Call(event.id, event.name)
            self._calls[event.key] = call
            self.parts.append(call)
            if self.emit:
                self.out.append(wire.frame(wire.ToolCallStart(_view(call, {}, ""))))
        elif isinstance(event, ev.ToolCallArgs):
            call = self._calls[event.key]
            call.fragments.append(event.fragment)
            if self.emit:
                self.out.append(wire.frame(wire.ToolCallDelta(_view(call, {}, event.fragment))))
        elif isinstance(event, ev.UsageReport):
            self.usage = event
        elif isinstance(event, ev.Finish):
            self.finish_reason = event.reason
        else:
            self.upstream_request_id = event.upstream_request_id

    def _delta(self, kind: str, text: str) -> None:
        if self._block != kind:
            self._close_block()
            self._block = kind
            if self.emit:
                start: wire.StreamEvent = (
                    wire.TextStart(f"text_{self._texts}") if kind == "text" else wire.ReasoningStart()
                )
                self.out.append(wire.frame(start))
        self._block_parts.append(text)
        if self.emit:
            delta: wire.StreamEvent = (
                wire.TextDelta(f"text_{self._texts}", text) if kind == "text" else wire.ReasoningDelta(text)
            )
            self.out.append(wire.frame(delta))

    def _close_block(self) -> None:
        if self._block is None:
            return
        text = "".join(self._block_parts)
        self._block_parts = []
        if self._block == "text":
            self.parts.append(TextPart(text))
            if self.emit:
                self.out.append(wire.frame(wire.TextEnd(f"text_{self._texts}")))
            self._texts += 1
        else:
            self.parts.append(ThinkingPart(ThinkingData(text=text)))
            if self.emit:
                self.out.append(wire.frame(wire.ReasoningEnd()))
        self._block = None

    def close(self) -> Message:
        """Close every open block (emitting the `*_end` frames) and return the assistant message."""
        self._close_block()
        content: list[ContentPart] = []
        for part in self.parts:
            if isinstance(part, _Call):
                raw = "".join(part.fragments)
                call = _view(part, _parse_arguments(raw), raw)
                if self.emit:
                    self.out.append(wire.frame(wire.ToolCallEnd(call)))
                content.append(ToolCallPart(ToolCallData(call.id, call.name, call.arguments, raw_arguments=raw)))
            else:
                content.append(part)
        return Message(role="assistant", content=content)

    def final_finish_reason(self) -> str:
        if self._calls:
            return "tool_calls"
        reason = self.finish_reason or "stop"
        return reason if reason in STOP_REASONS else "stop"

    def structured_output(self, message: Message) -> Any:
        """The parsed JSON of the answer's text, or None when it is not JSON (the text stays in
        the message either way, so nothing is lost)."""
        text = "".join(part.data for part in message.content if isinstance(part, TextPart))
        try:
            return _json_decoder.decode(text)
        except msgspec.DecodeError:
            return None


def _view(call: _Call, arguments: Any, raw: str) -> wire.ToolCallView:
    return wire.ToolCallView(id=call.id, name=call.name, type="function", arguments=arguments, raw_arguments=raw)


def _parse_arguments(raw: str) -> Any:
    if not raw.strip():
        return {}
    try:
        return _json_decoder.decode(raw)
    except msgspec.DecodeError:
        return {}
