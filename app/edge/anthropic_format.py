"""Anthropic Messages on the wire: the request Structs, the `message` response, the SSE frames and
the error body (ingress.md, `POST /v1/messages`).

The request side follows the gateway's msgspec policy (`providers.types`): optional fields are
`T | None = None`, unknown keys are ignored, content blocks and `tool_choice`/`thinking` are tagged
unions on `type` (an unknown block type is a 400 naming its path), ranges live in `Meta` as
Anthropic documents them (`temperature` and `top_p` in [0, 1], `budget_tokens` ≥ 1024). The
content block Structs serve both directions: what a client sends back in `messages` is what the
response gave it.

Frames are pre-framed bytes. A streamed delta is its block's constant prefix (built once when the
block opens), the JSON-encoded string and a constant suffix: no Struct per chunk.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from catalog.records import CostSource
from providers.types import ReasoningEffort

ToolName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
UnitInterval = Annotated[float, Meta(ge=0, le=1)]


# Content blocks (request and response).


class TextBlock(Struct, tag_field="type", tag="text"):
    text: str


class Base64Source(Struct, tag_field="type", tag="base64"):
    media_type: str
    data: str


class URLSource(Struct, tag_field="type", tag="url"):
    url: str


class PlainTextSource(Struct, tag_field="type", tag="text"):
    data: str
    media_type: str | None = None


ImageType = Literal["image/jpeg", "image/png", "image/gif", "image/webp"]  # what Anthropic's API takes


class ImageBase64Source(Struct, tag_field="type", tag="base64"):
    media_type: ImageType
    data: str


class ImageBlock(Struct, tag_field="type", tag="image"):
    source: ImageBase64Source | URLSource


class DocumentBlock(Struct, tag_field="type", tag="document"):
    source: Base64Source | URLSource | PlainTextSource
    title: str | None = None


class ToolUseBlock(Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(Struct, tag_field="type", tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None  # media: `anthropic_request`
    is_error: bool | None = None


class ThinkingBlock(Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(Struct, tag_field="type", tag="redacted_thinking"):
    data: str


InputBlock = (
    TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)
OutputBlock = TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock


# The request.


class InputMessage(Struct):
    role: Literal["user", "assistant"]
    content: str | list[InputBlock]


class Tool(Struct):
    name: ToolName
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None  # a server tool's type (`web_search_…`) is refused naming it


class ToolChoiceAuto(Struct, tag_field="type", tag="auto"):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(Struct, tag_field="type", tag="any"):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(Struct, tag_field="type", tag="tool"):
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(Struct, tag_field="type", tag="none"):
    pass


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


class ThinkingEnabled(Struct, tag_field="type", tag="enabled"):
    budget_tokens: Annotated[int, Meta(ge=1024)]


class ThinkingDisabled(Struct, tag_field="type", tag="disabled"):
    pass


class ThinkingAdaptive(Struct, tag_field="type", tag="adaptive"):
    pass


class JSONOutputFormat(Struct, tag_field="type", tag="json_schema"):
    schema: dict[str, Any]


class OutputConfig(Struct):
    effort: ReasoningEffort | None = None
    format: JSONOutputFormat | None = None


class Metadata(Struct):
    user_id: str | None = None


class MessagesRequest(Struct):
    max_tokens: Annotated[int, Meta(ge=1)]
    messages: Annotated[list[InputMessage], Meta(min_length=1)]
    model: str | None = None
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: UnitInterval | None = None
    top_p: UnitInterval | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    thinking: ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive | None = None
    output_config: OutputConfig | None = None
    output_format: JSONOutputFormat | None = None  # the structured-outputs beta's name for output_config.format
    metadata: Metadata | None = None
    stream: bool | None = None


# The response.

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"]


class OutputTokensDetails(Struct):
    thinking_tokens: int


class Usage(Struct):
    """Anthropic's additive convention: `input_tokens` excludes cache reads and writes,
    `output_tokens` includes reasoning (`output_tokens_details.thinking_tokens`)."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    output_tokens_details: OutputTokensDetails


class Message(Struct, tag_field="type", tag="message"):
    id: str
    role: Literal["assistant"]
    model: str
    content: list[OutputBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: Usage
    # `json_number`; the gateway's own fields, as in the native API; Anthropic's SDK ignores them
    cost_usd: msgspec.Raw | None
    cost_source: CostSource | None


# Stream events.


class MessageStart(Struct, tag_field="type", tag="message_start"):
    message: Message


class Delta(Struct):
    stop_reason: StopReason | None
    stop_sequence: str | None


class MessageDelta(Struct, tag_field="type", tag="message_delta"):
    delta: Delta
    usage: Usage
    cost_usd: msgspec.Raw | None  # `json_number`
    cost_source: CostSource | None


class ErrorDetail(Struct, omit_defaults=True):
    type: str
    message: str
    param: str | None = None  # the failing field's path, as in the gateway's other error bodies


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


class ErrorBody(Struct, tag_field="type", tag="error"):
    error: ErrorDetail


class ErrorResponse(Struct, tag_field="type", tag="error"):
    error: ErrorDetail
    request_id: str


_encoder = msgspec.json.Encoder(decimal_format="number")
encode = _encoder.encode


def error_document(status: int, message: str, param: str | None, request_id: str) -> bytes:
    """An error's body in Anthropic's shape, with the gateway's request id and failing field."""
    detail = ErrorDetail(type=error_type(status), message=message, param=param)
    return encode(ErrorResponse(error=detail, request_id=request_id))


PING_FRAME = b'event: ping\ndata: {"type":"ping"}\n\n'
MESSAGE_STOP_FRAME = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
DELTA_END = b"}}\n\n"


def frame(event: str, payload: Struct) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + _encoder.encode(payload) + b"\n\n"


def block_start(index: int, block: OutputBlock) -> bytes:
    return (
        b'event: content_block_start\ndata: {"type":"content_block_start","index":%d,"content_block":' % index
        + _encoder.encode(block)
        + b"}\n\n"
    )


def block_stop(index: int) -> bytes:
    return b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n' % index


def delta_prefix(index: int, kind: str, field: str) -> bytes:
    """The constant head of a block's `content_block_delta` frames; the JSON string and
    `DELTA_END` complete one."""
    head = f'{{"type":"content_block_delta","index":{index},"delta":{{"type":"{kind}","{field}":'
    return b"event: content_block_delta\ndata: " + head.encode()
