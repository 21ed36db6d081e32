"""The public output formats: the completion response and the `stream_event` SSE frames.

The request format lives in `providers.types` (it is also the adapters' input); this module holds
what the gateway sends back. Encoders are built once; a cost goes out as a JSON number with every
digit kept and no exponent (`json_number`), so `cost_usd` is exact on the wire and reads as people
write money: `0.000183`, `0`, never `1.83E-4` or `0E-10`.

Frames are pre-framed bytes (`event: stream_event\\ndata: {...}\\n\\n`): the per-chunk path is one
Struct construction, one encode and one concatenation.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgspec
from msgspec import Struct

from app.errors import StreamErrorView
from app.pipeline.events import StopReason
from catalog.exact_sum import decimal_text
from catalog.records import CostSource
from providers.events import Usage
from providers.types import Message


def json_number(value: Decimal | None) -> msgspec.Raw | None:
    """A cost for the wire: a JSON number, exact, without the exponent `str(Decimal)` gives below
    1e-6 (msgspec's `decimal_format="number"` writes that text as it is)."""
    return None if value is None else msgspec.Raw(decimal_text(value).encode())


class CompletionResponse(Struct):
    id: str
    model: str
    provider: str
    message: Message
    stop_reason: StopReason
    usage: Usage
    output: Any
    cost_usd: msgspec.Raw | None  # `json_number`
    cost_source: CostSource | None


class ToolCallView(Struct):
    id: str
    name: str
    type: str
    arguments: Any
    raw_arguments: str


class StreamStart(Struct, tag_field="type", tag="stream_start"):
    id: str
    model: str
    provider: str


class ReasoningStart(Struct, tag_field="type", tag="reasoning_start"):
    pass


class ReasoningDelta(Struct, tag_field="type", tag="reasoning_delta"):
    delta: str


class ReasoningEnd(Struct, tag_field="type", tag="reasoning_end"):
    pass


class TextStart(Struct, tag_field="type", tag="text_start"):
    text_id: str


class TextDelta(Struct, tag_field="type", tag="text_delta"):
    text_id: str
    delta: str


class TextEnd(Struct, tag_field="type", tag="text_end"):
    text_id: str


class ToolCallStart(Struct, tag_field="type", tag="tool_call_start"):
    tool_call: ToolCallView


class ToolCallDelta(Struct, tag_field="type", tag="tool_call_delta"):
    tool_call: ToolCallView


class ToolCallEnd(Struct, tag_field="type", tag="tool_call_end"):
    tool_call: ToolCallView


class FinishEvent(Struct, tag_field="type", tag="finish"):
    finish_reason: str
    stop_reason: StopReason
    usage: Usage
    response: CompletionResponse


class ErrorEvent(Struct, tag_field="type", tag="error"):
    error: StreamErrorView


StreamEvent = (
    StreamStart
    | ReasoningStart
    | ReasoningDelta
    | ReasoningEnd
    | TextStart
    | TextDelta
    | TextEnd
    | ToolCallStart
    | ToolCallDelta
    | ToolCallEnd
    | FinishEvent
    | ErrorEvent
)

_encoder = msgspec.json.Encoder(decimal_format="number")
_FRAME_HEAD = b"event: stream_event\ndata: "
PING_FRAME = b'event: ping\ndata: {"type":"ping"}\n\n'


def frame(event: StreamEvent) -> bytes:
    return _FRAME_HEAD + _encoder.encode(event) + b"\n\n"


def encode_response(response: CompletionResponse) -> bytes:
    return _encoder.encode(response)
