"""The request half of the OpenAI chat dialect: `CompletionRequest` → a `/chat/completions` body.

Pure and typed: the body is a tree of msgspec Structs (fields left `UNSET` are not sent) encoded
by one reused encoder. Only when `provider_options.<provider>` is given is it turned into builtins
to merge those extras last; `model`, `messages`, `stream` and `stream_options` are never
replaced (the app rejects such options already; this is the second lock).

Mapping decisions (providers.md, "Request mapping"):
- `system` and `system`/`developer` messages → `role: "system"` (`developer` is kept only where
  the wire profile says the host accepts it); only their text is sent;
- text-only content → one string (parts joined with `\\n`, as vLLM joins text parts); with media
  → content parts (`providers.openai_media`);
- assistant `tool_call` parts → `tool_calls` with JSON-string arguments (`raw_arguments` verbatim
  when the client gave them); assistant `thinking` → `reasoning_content` only where the host takes
  it back; redacted thinking is never sent to an OpenAI-style host;
- each `tool_result` part → its own `role: "tool"` message (non-string content JSON-encoded),
  placed before the rest of the message it came in;
- `continue_final_message` (a prefill to continue) → `continue_final_message: true` and
  `add_generation_prompt: false` where the wire profile says the host takes them (`local`); a
  host that does not gets the prefill as a plain last turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

from providers.config import ProviderConfig, WireProfile
from providers.openai_media import Text, WirePart, audio_part, document_part, image_part
from providers.types import (
    AudioPart,
    CompletionRequest,
    ContentPart,
    DocumentPart,
    ImagePart,
    Message,
    TextPart,
    ThinkingPart,
    ToolCallData,
    ToolCallPart,
    ToolChoice,
    ToolDefinition,
    ToolResultData,
    ToolResultPart,
)

# `provider_options` may not set these: they bound how much an answer may cost (its length, how
# many answers), and a key's budget and `tpm` reserve the request's own `max_tokens` (or the
# model's max output) as that bound (access.md, "Budgets never overshoot"). `max_tokens` goes in
# the request itself; one answer per request. Refused at the edge (a 400); never merged here.
BOUNDING_OPTIONS = frozenset(
    {"max_tokens", "max_completion_tokens", "max_new_tokens", "n_predict", "num_predict", "n", "best_of"}
)
_PROTECTED = frozenset({"model", "messages", "stream", "stream_options"}) | BOUNDING_OPTIONS


class WireFunctionCall(Struct):
    name: str
    arguments: str


class WireToolCall(Struct):
    id: str
    function: WireFunctionCall
    type: str = "function"


class WireMessage(Struct):
    role: str
    content: str | list[WirePart] | None = None
    name: str | UnsetType = UNSET
    tool_calls: list[WireToolCall] | UnsetType = UNSET
    tool_call_id: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET


class WireFunction(Struct):
    name: str
    description: str | UnsetType = UNSET
    parameters: dict[str, Any] | UnsetType = UNSET
    strict: bool | UnsetType = UNSET


class WireTool(Struct):
    function: WireFunction
    type: str = "function"


class WireNamedFunction(Struct):
    name: str


class WireNamedChoice(Struct):
    function: WireNamedFunction
    type: str = "function"


class WireJSONSchema(Struct):
    schema: dict[str, Any]
    name: str = "response"
    strict: bool = True
    description: str | UnsetType = UNSET


class WireResponseFormat(Struct):
    json_schema: WireJSONSchema | UnsetType = UNSET
    type: str = "json_schema"


class WireStreamOptions(Struct):
    include_usage: bool = True


class ChatBody(Struct):
    model: str
    messages: list[WireMessage]
    stream: bool = False
    stream_options: WireStreamOptions | UnsetType = UNSET
    tools: list[WireTool] | UnsetType = UNSET
    tool_choice: str | WireNamedChoice | UnsetType = UNSET
    response_format: WireResponseFormat | UnsetType = UNSET
    stop: list[str] | UnsetType = UNSET
    max_tokens: int | UnsetType = UNSET
    max_completion_tokens: int | UnsetType = UNSET
    reasoning_effort: str | UnsetType = UNSET
    temperature: float | UnsetType = UNSET
    top_p: float | UnsetType = UNSET
    seed: int | UnsetType = UNSET
    top_k: int | UnsetType = UNSET
    min_p: float | UnsetType = UNSET
    repetition_penalty: float | UnsetType = UNSET
    presence_penalty: float | UnsetType = UNSET
    frequency_penalty: float | UnsetType = UNSET
    logprobs: bool | UnsetType = UNSET
    top_logprobs: int | UnsetType = UNSET
    parallel_tool_calls: bool | UnsetType = UNSET
    user: str | UnsetType = UNSET
    continue_final_message: bool | UnsetType = UNSET
    add_generation_prompt: bool | UnsetType = UNSET


_encoder = msgspec.json.Encoder()


def build_chat_body(req: CompletionRequest, upstream_model: str, cfg: ProviderConfig, *, stream: bool) -> bytes:
    """The encoded `/chat/completions` body for `req` on provider `cfg`."""
    body = chat_body(req, upstream_model, cfg.wire, stream=stream)
    options = req.provider_options.get(cfg.name) if req.provider_options else None
    return encode_with_options(body, options, _PROTECTED)


def encode_with_options(body: Struct, options: dict[str, Any] | None, protected: frozenset[str]) -> bytes:
    """`body` encoded, with the serving provider's `provider_options` merged last (never the
    `protected` keys); the Struct is encoded directly when there are none, the usual case."""
    if not options:
        return _encoder.encode(body)
    merged: dict[str, Any] = msgspec.to_builtins(body)
    for key, value in options.items():
        if key not in protected:
            merged[key] = value
    return _encoder.encode(merged)


def chat_body(req: CompletionRequest, upstream_model: str, wire: WireProfile, *, stream: bool) -> ChatBody:
    body = ChatBody(model=upstream_model, messages=_messages(req, wire), stream=stream)
    if stream and wire.stream_usage:
        body.stream_options = WireStreamOptions()
    if req.tools:
        body.tools = [_tool(tool) for tool in req.tools]
    if req.tool_choice is not None and req.tools:  # a choice among no tools: hosts refuse it (vLLM: 400)
        body.tool_choice = _tool_choice(req.tool_choice)
    if req.schema is not None:
        name, strict = req.schema_name or "response", req.schema_strict is not False
        description = UNSET if req.schema_description is None else req.schema_description
        body.response_format = WireResponseFormat(json_schema=WireJSONSchema(req.schema, name, strict, description))
    elif req.json_object:
        body.response_format = WireResponseFormat(type="json_object")
    if req.stop_sequences:
        body.stop = req.stop_sequences
    if req.max_tokens is not None:
        if wire.max_completion_tokens:
            body.max_completion_tokens = req.max_tokens
        else:
            body.max_tokens = req.max_tokens
    if req.reasoning_effort is not None:
        body.reasoning_effort = req.reasoning_effort
    if req.temperature is not None:
        body.temperature = req.temperature
    if req.top_p is not None:
        body.top_p = req.top_p
    _sampling_extras(req, body, wire)
    if req.continue_final_message and wire.continue_final_message:  # a prefill (checked at the edge)
        body.continue_final_message, body.add_generation_prompt = True, False
    return body


_EXTRAS: tuple[str, ...] = ("seed", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
_EXTRAS += ("logprobs", "top_logprobs", "parallel_tool_calls", "user")
_NONE = (None,) * 5


def _sampling_extras(req: CompletionRequest, body: ChatBody, wire: WireProfile) -> None:
    """The options sent under their own names when the client gave them (ChatBody's and
    CompletionRequest's field names are the same); `parallel_tool_calls` only with tools, as
    `tool_choice` (OpenAI: "only allowed when 'tools' are specified")."""
    head = (req.seed, req.top_k, req.min_p, req.repetition_penalty, req.presence_penalty)
    tail = (req.frequency_penalty, req.logprobs, req.top_logprobs, req.parallel_tool_calls, req.user)
    if head == _NONE and tail == _NONE:  # the usual request: two comparisons, not ten lookups by name
        return
    for name, value in zip(_EXTRAS, head + tail, strict=True):
        if value is not None:
            setattr(body, name, value)
    if not req.tools:
        body.parallel_tool_calls = UNSET
    if not wire.sampling_extras:
        body.top_k = body.min_p = body.repetition_penalty = UNSET


def _tool(tool: ToolDefinition) -> WireTool:
    return WireTool(
        function=WireFunction(
            name=tool.name,
            description=UNSET if tool.description is None else tool.description,
            parameters=UNSET if tool.parameters is None else tool.parameters,
            strict=UNSET if tool.strict is None else tool.strict,
        )
    )


def _tool_choice(choice: ToolChoice) -> str | WireNamedChoice:
    if choice.mode == "named" and choice.tool_name:
        return WireNamedChoice(function=WireNamedFunction(name=choice.tool_name))
    return "required" if choice.mode == "named" else choice.mode


def _messages(req: CompletionRequest, wire: WireProfile) -> list[WireMessage]:
    messages: list[WireMessage] = []
    if req.system:
        messages.append(WireMessage(role="system", content=req.system))
    for message in req.messages:
        messages.extend(_message(message, wire))
    return messages


def _message(message: Message, wire: WireProfile) -> list[WireMessage]:
    if message.role in ("system", "developer"):
        role = "developer" if message.role == "developer" and wire.developer_role else "system"
        name = message.name if message.name is not None else UNSET
        return [WireMessage(role=role, content=_joined_text(message.content), name=name)]
    results = [_tool_message(part.data) for part in message.content if type(part) is ToolResultPart]  # exact
    rest = [part for part in message.content if type(part) is not ToolResultPart]  # (`types.MEDIA_PARTS`)
    if not rest:
        return results
    if message.role == "tool":
        call_id = message.tool_call_id or ""
        return [*results, WireMessage(role="tool", content=_joined_text(rest), tool_call_id=call_id)]
    if message.role == "assistant":
        wire_message = _assistant(rest, wire)
    else:
        wire_message = WireMessage(role="user", content=_user_content(rest))
    if message.name is not None:
        wire_message.name = message.name
    return [*results, wire_message]


def _joined_text(parts: Sequence[ContentPart]) -> str:
    return "\n".join(part.data for part in parts if isinstance(part, TextPart))


def _tool_message(result: ToolResultData) -> WireMessage:
    content = result.content
    if not isinstance(content, str):
        content = "" if content is None else _encoder.encode(content).decode()
    return WireMessage(role="tool", content=content, tool_call_id=result.tool_call_id)


def _assistant(parts: Sequence[ContentPart], wire: WireProfile) -> WireMessage:
    calls = [_wire_call(part.data) for part in parts if isinstance(part, ToolCallPart)]
    has_text = any(isinstance(part, TextPart) for part in parts)
    message = WireMessage(role="assistant", content=_joined_text(parts) if has_text or not calls else None)
    if calls:
        message.tool_calls = calls
    if wire.reasoning_history:
        thinking = [part.data.text for part in parts if isinstance(part, ThinkingPart)]
        if thinking:
            message.reasoning_content = "".join(thinking)
    return message


def _wire_call(call: ToolCallData) -> WireToolCall:
    arguments = call.raw_arguments
    if arguments is None:
        arguments = _encoder.encode(call.arguments).decode()
    return WireToolCall(id=call.id, function=WireFunctionCall(name=call.name, arguments=arguments))


def _user_content(parts: Sequence[ContentPart]) -> str | list[WirePart]:
    if all(isinstance(part, TextPart) for part in parts):
        return _joined_text(parts)
    wire_parts: list[WirePart] = []
    for part in parts:
        if isinstance(part, TextPart):
            wire_parts.append(Text(text=part.data))
        elif isinstance(part, ImagePart):
            wire_parts.append(image_part(part))
        elif isinstance(part, AudioPart):
            wire_parts.append(audio_part(part.data))
        elif isinstance(part, DocumentPart):
            wire_parts.append(document_part(part.data))
    return wire_parts
