"""The provider-neutral request model: what a client asks for, before any upstream sees it.

These Structs are both the wire format of `POST /api/v1/completions` (the app decodes request bodies
straight into `CompletionRequest`) and the input of every adapter's request builder, so there is one
typed representation of a request in the whole service. `TextCompletionRequest` is the other kind
of request: a raw prompt for an upstream's own `/completions` endpoint (the legacy OpenAI text
completion), never wrapped in a chat template; `AnyRequest` is what the pipeline and the adapter take.

Policy (set once here, as msgspec recommends):
- every optional field is `T | None = None`: a client's explicit `null` means "absent";
- unknown top-level keys are ignored (agent frameworks send their internal structs);
- content parts are a tagged union on `kind`, so an unknown kind fails decoding with the path
  `$.messages[i].content[j].kind` instead of being dropped;
- numeric ranges live in `Annotated[..., Meta(...)]` so validation and the schema agree.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

Role = Literal["system", "user", "assistant", "tool", "developer"]
ReasoningEffort = Literal["low", "medium", "high", "xhigh", "max"]
ToolChoiceMode = Literal["auto", "none", "required", "named"]


class ImageData(Struct, omit_defaults=True):
    url: str | None = None
    data: str | list[Annotated[int, Meta(ge=0, le=255)]] | None = None
    media_type: str | None = None
    detail: Literal["auto", "low", "high"] | None = None


class FileData(Struct, omit_defaults=True):
    url: str | None = None
    data: str | list[Annotated[int, Meta(ge=0, le=255)]] | None = None
    media_type: str | None = None
    file_name: str | None = None


class ToolCallData(Struct):
    id: str
    name: str
    arguments: Any = msgspec.field(default_factory=dict)
    type: Literal["function"] | None = "function"  # null is absent (api.md); never read: always a function
    raw_arguments: str | None = None


class ToolResultData(Struct, omit_defaults=True):
    tool_call_id: str
    content: Any = None
    is_error: bool | None = None


class ThinkingData(Struct):
    text: str
    signature: str | None = None
    redacted: bool | None = False  # null is absent (api.md); `true` only on a `redacted_thinking` part


class RedactedThinkingData(Struct):
    """api.md: `{text, signature?, redacted: true}`: absent or null is true, false a 400 (as `true` is on a
    `thinking` part): a client that says the blob is readable reasoning text means a `thinking` part."""

    text: str
    signature: str | None = None
    redacted: Literal[True] | None = True


class TextPart(Struct, tag_field="kind", tag="text"):
    data: str


class ImagePart(Struct, tag_field="kind", tag="image"):
    data: ImageData


class AudioPart(Struct, tag_field="kind", tag="audio"):
    data: FileData


class DocumentPart(Struct, tag_field="kind", tag="document"):
    data: FileData


class ToolCallPart(Struct, tag_field="kind", tag="tool_call"):
    data: ToolCallData


class ToolResultPart(Struct, tag_field="kind", tag="tool_result"):
    data: ToolResultData


class ThinkingPart(Struct, tag_field="kind", tag="thinking"):
    data: ThinkingData


class RedactedThinkingPart(Struct, tag_field="kind", tag="redacted_thinking"):
    data: RedactedThinkingData


ContentPart = (
    TextPart
    | ImagePart
    | AudioPart
    | DocumentPart
    | ToolCallPart
    | ToolResultPart
    | ThinkingPart
    | RedactedThinkingPart
)
MediaPart = ImagePart | AudioPart | DocumentPart
# The media classes for exact-type tests (`type(part) in MEDIA_PARTS`) on the per-request path: the
# decoder makes these classes and none has subclasses, and an `isinstance` against a msgspec Struct
# class that does not match leaves CPython's fast path (the metaclass): ~80 ns a check, against ~20.
MEDIA_PARTS: frozenset[type] = frozenset({ImagePart, AudioPart, DocumentPart})


class Message(Struct, omit_defaults=True):
    role: Role
    content: list[ContentPart]
    name: str | None = None
    tool_call_id: str | None = None


class ToolDefinition(Struct, omit_defaults=True):
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # OpenAI's `function.strict`: arguments that follow `parameters` exactly


class ToolChoice(Struct, omit_defaults=True):
    mode: ToolChoiceMode
    tool_name: str | None = None


class CompletionRequest(Struct, omit_defaults=True):
    messages: Annotated[list[Message], Meta(min_length=1)]
    model: str | None = None
    system: str | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    schema: dict[str, Any] | None = None
    stream: bool | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    stop_sequences: list[str] | None = None
    reasoning_effort: ReasoningEffort | None = None
    provider: str | None = None
    provider_options: dict[str, dict[str, Any]] | None = None
    # Sampling and output options OpenAI-compatible servers take, passed on when given (the
    # OpenAI-compatible ingress fills them; native clients may send them too).
    json_object: bool | None = None  # answer with a JSON object, no schema (`response_format: json_object`)
    # `schema`'s `response_format.json_schema.name` and `strict` upstream; absent: "response", strict
    # (providers.md). The OpenAI door fills them from the client's own (its `strict` absent: false, as OpenAI's).
    schema_name: str | None = None
    schema_strict: bool | None = None
    schema_description: str | None = None  # `response_format.json_schema.description`, sent when given
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None = None  # a 64-bit integer, as vLLM's
    top_k: Annotated[int, Meta(ge=-1)] | None = None  # -1 or 0: off (vLLM / llama.cpp conventions)
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0)] | None = None
    presence_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    # the last message, an assistant one with text (`prefill`), is the start of the answer, which
    # the host continues (vLLM's field, sent where the wire profile says the host takes it); the
    # Anthropic door sets it for every prefill, as Anthropic's API continues one
    continue_final_message: bool | None = None


def prefill(message: Message) -> bool:
    """An assistant message with text and no tool call: as the last message, the start of the answer."""
    if message.role != "assistant":
        return False
    kinds = {type(part) for part in message.content}
    return TextPart in kinds and ToolCallPart not in kinds


MAX_TEXT_TOKENS = 16384  # the fastrun/primalabs `/completions` range, 1..16384
MAX_STOP = 4


class TextCompletionRequest(Struct, omit_defaults=True):
    """A raw-prompt completion (`POST /v1/completions`). `max_tokens` has the legacy API's default
    (16) and is always sent upstream: hosts differ in what they assume when it is absent."""

    prompt: str
    model: str | None = None
    provider: str | None = None
    max_tokens: Annotated[int, Meta(ge=1, le=MAX_TEXT_TOKENS)] = 16
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    seed: int | None = None
    stop: Annotated[list[str], Meta(max_length=MAX_STOP)] | None = None
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None  # how many top alternatives per token
    echo: bool | None = None
    presence_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None
    stream: bool | None = None
    provider_options: dict[str, dict[str, Any]] | None = None


AnyRequest = CompletionRequest | TextCompletionRequest
