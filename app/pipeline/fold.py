"""The fold of one attempt's upstream events into canonical events and the assistant message.

One `Fold` per attempt. With `emit=True` (streaming) every upstream event also appends the
canonical events it causes to `out` (`app.pipeline.events`), which the pipeline takes (`take`)
after each batch of upstream events; with `emit=False` (a JSON answer) only the message is
built. Either way the message and the usage come from the same fold, so there is one
accounting path.

Block rules (api.md): text and reasoning blocks open on their first non-empty delta and close when
another kind of block starts or the answer ends; every tool call is its own block, correlated by
id, and all calls are closed (arguments parsed) at the end, in order of appearance.

The fold also counts what it relayed (`relayed_output`, `relayed_reasoning`: one per delta, the
usual size of a streamed chunk), the usage of last resort for a cancelled stream whose upstream
never reported any.
"""

from __future__ import annotations

from typing import Any

import msgspec

from app.pipeline import events as out
from app.pipeline.events import FinishReason
from providers import events as ev
from providers.types import ContentPart, Message, TextPart, ThinkingData, ThinkingPart, ToolCallData, ToolCallPart

_json_decoder = msgspec.json.Decoder()
_DeltaKind = type[ev.TextDelta] | type[ev.ReasoningDelta] | type[ev.RefusalDelta]
_FINISH_REASONS = frozenset(("stop", "length", "tool_calls", "content_filter"))


class _Call:
    __slots__ = ("fragments", "id", "index", "name")

    def __init__(self, index: int, call_id: str, name: str) -> None:
        self.index = index
        self.id = call_id
        self.name = name
        self.fragments: list[str] = []


class Fold:
    __slots__ = (
        "_block",
        "_block_parts",
        "_calls",
        "_texts",
        "emit",
        "finish_reason",
        "logprobs",
        "out",
        "parts",
        "refusals",
        "relayed_output",
        "relayed_reasoning",
        "stop_sequence",
        "upstream_request_id",
        "usage",
    )

    def __init__(self, *, emit: bool) -> None:
        self.emit = emit
        self.out: list[out.Event] = []
        self.parts: list[ContentPart | _Call] = []
        self.usage: ev.UsageReport | None = None
        self.finish_reason: str | None = None
        self.stop_sequence: str | None = None
        self.upstream_request_id: str | None = None
        self.logprobs: list[ev.TokenLogprob] | None = None
        self.relayed_output = 0
        self.relayed_reasoning = 0
        self.refusals: list[TextPart] = []  # the text parts made of refusal deltas (`out.Outcome.refusals`)
        self._block: _DeltaKind | None = None
        self._block_parts: list[str] = []
        self._texts = 0
        self._calls: dict[int, _Call] = {}

    def feed(self, event: ev.Event) -> None:
        """One adapter event into the message. Dispatched by exact type, the per-chunk deltas
        first: the events are final Structs (`providers.types.MEDIA_PARTS` on why not `isinstance`)."""
        kind = type(event)
        if kind is ev.TextDelta or kind is ev.ReasoningDelta or kind is ev.RefusalDelta:
            if event.text:  # type: ignore[union-attr]
                self._delta(event, kind)  # type: ignore[arg-type]
        elif type(event) is ev.ToolCallStart:
            self._close_block()
            call = _Call(len(self._calls), event.id, event.name)
            self._calls[event.key] = call
            self.parts.append(call)
            if self.emit:
                self.out.append(out.ToolCallStart(call.index, call.id, call.name))
        elif type(event) is ev.ToolCallArgs:
            call = self._calls[event.key]
            call.fragments.append(event.fragment)
            self.relayed_output += 1
            if self.emit:
                self.out.append(out.ToolCallDelta(call.index, call.id, call.name, event.fragment))
        elif type(event) is ev.UsageReport:
            self.usage = event
        elif type(event) is ev.Finish:
            self.finish_reason = event.reason
            self.stop_sequence = event.stop_sequence
        elif type(event) is ev.Logprobs:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(event.tokens)
            if self.emit:
                self.out.append(event)
        elif type(event) is ev.UpstreamMeta:
            self.upstream_request_id = event.upstream_request_id

    def _delta(self, event: ev.TextDelta | ev.ReasoningDelta | ev.RefusalDelta, kind: _DeltaKind) -> None:
        """A delta into its block; a refusal is a text block of its own (text and a refusal never share one)."""
        if self._block is not kind:
            self._close_block()
            self._block = kind
            if self.emit:
                self.out.append(out.ReasoningStart() if kind is ev.ReasoningDelta else out.TextStart(self._texts))
        self._block_parts.append(event.text)
        if kind is ev.ReasoningDelta:
            self.relayed_reasoning += 1
        else:
            self.relayed_output += 1
        if self.emit:
            self.out.append(event)

    def _close_block(self) -> None:
        if self._block is None:
            return
        text = "".join(self._block_parts)
        self._block_parts = []
        if self._block is not ev.ReasoningDelta:
            part = TextPart(text)
            self.parts.append(part)
            if self._block is ev.RefusalDelta:
                self.refusals.append(part)
            if self.emit:
                self.out.append(out.TextEnd(self._texts, text))
            self._texts += 1
        else:
            self.parts.append(ThinkingPart(ThinkingData(text=text)))
            if self.emit:
                self.out.append(out.ReasoningEnd(text))
        self._block = None

    def take(self) -> list[out.Event]:
        """The canonical events emitted since the last `take`; `out` starts over."""
        taken, self.out = self.out, []
        return taken

    def close(self) -> Message:
        """Close every open block (emitting the `*End` events) and return the assistant message."""
        self._close_block()
        content: list[ContentPart] = []
        for part in self.parts:
            if isinstance(part, _Call):  # a plain class: the fast path
                raw = "".join(part.fragments)
                call = ToolCallData(part.id, part.name, _parse_arguments(raw), raw_arguments=raw)
                if self.emit:
                    self.out.append(out.ToolCallEnd(part.index, call))
                content.append(ToolCallPart(call))
            else:
                content.append(part)
        return Message(role="assistant", content=content)

    def final_finish_reason(self) -> FinishReason | None:
        """`tool_calls` whenever calls were returned; an unknown reason reads as `stop`; None when
        the upstream never said it finished."""
        reason = self.finish_reason
        if reason is None:
            return None
        if self._calls:
            return "tool_calls"
        return reason if reason in _FINISH_REASONS else "stop"  # type: ignore[return-value]


def _parse_arguments(raw: str) -> Any:
    if not raw.strip():
        return {}
    try:
        return _json_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):  # nested past msgspec's depth: not arguments to read
        return {}
