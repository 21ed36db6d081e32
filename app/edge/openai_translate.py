"""OpenAI Chat Completions request → `CompletionRequest`: the chat ingress's translator in.

Pure: decode with the prebuilt decoder, check what a type cannot express, map field by field.
Every rejection is a 400 whose `param` is the OpenAI field path (`tool_choice.function.name`,
`messages[2].content[0].image_url.url`). The native checks on canonical paths
(`app.edge.validation.check_request`) are not run again: this module makes the ones that apply
here, on the OpenAI paths — the media checks (`check_url`, `check_base64`) and the nesting limit
on the free-form values (a tool's `parameters`, `response_format`'s schema; tool call arguments
are strings here, `metadata` is flat).

Mapping decisions (ingress.md; where it is silent, what OpenAI does):
- messages map one to one and keep their content parts in order, so a canonical path
  `messages[i].content[j]` (the capability check at admission) is also the OpenAI path;
- string content is one text part; `system`/`developer` stay their own role; an assistant's
  `reasoning_content` becomes a thinking part before its text, `refusal` parts and the `refusal`
  field (the gateway's own answer sent back) are text, tool calls keep their argument string
  verbatim (`raw_arguments`, parsed into `arguments` when JSON);
  a `tool` message is one `tool_result` part (its text parts joined by newlines, as a user
  message's are on the way upstream: `providers.openai_request`);
- `image_url` → image (https:// or data: URLs only), `input_audio` → audio (`wav` as audio/wav,
  `mp3` as audio/mpeg), `file` → document (`file_data` a data: URL or base64; `file_id`, an
  upload on OpenAI's side, cannot be served here: 400);
- `max_completion_tokens` wins over `max_tokens`; `stop` a string or at most 4; `n` other than 1
  is a 400; `top_logprobs` needs `logprobs: true` (as OpenAI says);
- `response_format` `json_schema` → `schema` with its name, strictness and description (one
  without a schema → `json_object`), `json_object` → `json_object`; `reasoning_effort` `minimal`
  → `low`, `none` → not sent (the canonical effort has no "off");
- `modalities` other than `["text"]` and the `audio` output parameters are a 400: the answer is
  text only, and a 200 without the audio asked for would fail the client later;
- `stream_options.include_usage` is the renderer's business (the pipeline always asks upstreams for
  usage); `metadata` is validated and not forwarded.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from app.edge import openai_format as wire
from app.edge.validation import (
    MAX_JSON_DEPTH,
    check_base64,
    check_prefill,
    check_url,
    decode_body,
    deeper,
    too_deep,
)
from app.errors import InvalidRequest, clip
from providers.types import (
    AudioPart,
    CompletionRequest,
    ContentPart,
    DocumentPart,
    FileData,
    ImageData,
    ImagePart,
    Message,
    ReasoningEffort,
    TextPart,
    ThinkingData,
    ThinkingPart,
    ToolCallData,
    ToolCallPart,
    ToolChoice,
    ToolDefinition,
    ToolResultData,
    ToolResultPart,
)

_arguments_decoder = msgspec.json.Decoder()
_AUDIO_TYPES = {"wav": "audio/wav", "mp3": "audio/mpeg"}
_EFFORTS: dict[str, ReasoningEffort | None] = {
    "none": None,
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "xhigh",
    "max": "max",  # api.md's top effort (vLLM and SGLang take it too)
}
MAX_STOP = 4


def decode_chat(body: bytes) -> wire.ChatRequest:
    chat = decode_body(wire.request_decoder, body, tag="type")
    _check(chat)
    return chat


def check_stop_and_stream(stop: str | list[str] | None, stream: bool | None, stream_options: object) -> None:
    """What both OpenAI doors (chat and legacy completions) require of `stop` and streaming, as
    OpenAI's own API: at most `MAX_STOP` stop sequences, none empty; `stream_options` only when
    streaming."""
    if stream_options is not None and not stream:
        raise _invalid("stream_options", "only allowed when `stream` is true")
    if isinstance(stop, list) and len(stop) > MAX_STOP:
        raise _invalid("stop", f"at most {MAX_STOP} stop sequences are allowed")
    if stop == "" or (isinstance(stop, list) and "" in stop):
        raise _invalid("stop", "a stop sequence must not be empty")


def _check(chat: wire.ChatRequest) -> None:
    check_stop_and_stream(chat.stop, chat.stream, chat.stream_options)
    if chat.n is not None and chat.n != 1:
        raise _invalid("n", "only one choice per request is supported (n must be 1)")
    if chat.top_logprobs is not None and not chat.logprobs:
        raise _invalid("top_logprobs", "requires `logprobs: true`")
    if chat.modalities is not None and set(chat.modalities) - {"text"}:  # a 200 in text would drop what was asked
        raise _invalid("modalities", 'only text output is served here (`modalities: ["text"]`)')
    if chat.audio is not None:
        raise _invalid("audio", "audio output is not served here (only text)")
    schema = _schema(chat.response_format)
    if schema is not None and deeper(schema.schema, MAX_JSON_DEPTH - 3):
        raise too_deep("response_format.json_schema.schema")  # the body's level 4 (the native door's 2)
    _check_tools(chat)


def _check_tools(chat: wire.ChatRequest) -> None:
    names: set[str] = set()
    for index, tool in enumerate(chat.tools or ()):
        name = tool.function.name
        if name in names:
            raise _invalid(f"tools[{index}].function.name", f"duplicate tool name '{clip(name)}'")
        names.add(name)
        parameters = tool.function.parameters
        if parameters is not None and deeper(parameters, MAX_JSON_DEPTH - 4):
            raise too_deep(f"tools[{index}].function.parameters")  # the body's level 5 (the native door's 4)
        if parameters is not None and parameters.get("type", "object") != "object":  # OpenAI's rule
            raise _invalid(f"tools[{index}].function.parameters", "must be a JSON Schema of type 'object'")
    choice = chat.tool_choice
    if type(choice) is wire.NamedToolChoice and choice.function.name not in names:  # exact (`_schema`)
        raise _invalid("tool_choice.function.name", f"names no declared tool: '{clip(choice.function.name)}'")
    if choice == "required" and not names:
        raise _invalid("tool_choice", "'required' needs at least one tool in `tools`")


def to_request(chat: wire.ChatRequest) -> CompletionRequest:
    """The canonical request for a decoded, checked chat request."""
    stop = chat.stop
    schema = _schema(chat.response_format)
    messages = [_message(message, index) for index, message in enumerate(chat.messages)]
    check_prefill(chat.continue_final_message, messages)
    request = CompletionRequest(  # at most 15 keywords, the options after (`catalog.records.POSITIONAL`)
        messages=messages,
        model=chat.model,
        tools=[_tool(tool) for tool in chat.tools] if chat.tools else None,
        tool_choice=_tool_choice(chat.tool_choice),
        schema=schema.schema if schema is not None else None,
        schema_name=schema.name if schema is not None else None,
        schema_strict=bool(schema.strict) if schema is not None else None,  # OpenAI's default: not strict
        json_object=_json_object(chat.response_format),
        stream=chat.stream,
        temperature=chat.temperature,
        top_p=chat.top_p,
        max_tokens=chat.max_completion_tokens if chat.max_completion_tokens is not None else chat.max_tokens,
        stop_sequences=[stop] if isinstance(stop, str) else stop or None,
        reasoning_effort=_EFFORTS[chat.reasoning_effort] if chat.reasoning_effort is not None else None,
    )
    if schema is not None and schema.description is not None:
        request.schema_description = schema.description
    head = (chat.seed, chat.top_k, chat.min_p, chat.repetition_penalty, chat.presence_penalty, chat.frequency_penalty)
    tail = (chat.logprobs, chat.top_logprobs, chat.parallel_tool_calls, chat.user, chat.continue_final_message)
    if head != _NO_HEAD or tail != _NO_TAIL:  # the usual request has none of them: two comparisons
        for name, value in zip(_OPTIONS, head + tail, strict=True):
            if value is not None:
                setattr(request, name, value)
    return request


# the options named alike in both requests, in `to_request`'s order
_OPTIONS: tuple[str, ...] = ("seed", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
_OPTIONS += ("logprobs", "top_logprobs", "parallel_tool_calls", "user", "continue_final_message")
_NO_HEAD, _NO_TAIL = (None,) * 6, (None,) * 5


def _message(message: wire.ChatMessage, index: int) -> Message:
    converted = _converted(message, index)
    if not converted.content:  # `content: null` without calls, `[]`: a 400, as OpenAI's own
        raise _invalid(f"messages[{index}].content", "a message needs at least one part")
    return converted


def _converted(message: wire.ChatMessage, index: int) -> Message:
    if isinstance(message, wire.UserMessage):
        return Message("user", _user_parts(message.content, f"messages[{index}].content"), name=message.name)
    if isinstance(message, wire.AssistantMessage):
        return Message("assistant", _assistant_parts(message), name=message.name)
    if isinstance(message, wire.ToolMessage):
        result = ToolResultData(message.tool_call_id, _text(message.content))
        return Message("tool", [ToolResultPart(result)], tool_call_id=message.tool_call_id)
    if isinstance(message, wire.SystemMessage):
        return Message("system", _text_parts(message.content), name=message.name)
    return Message("developer", _text_parts(message.content), name=message.name)


def _text(content: str | list[wire.TextContent]) -> str:
    return content if isinstance(content, str) else "\n".join(part.text for part in content)


def _text_parts(content: str | list[wire.TextContent]) -> list[ContentPart]:
    if isinstance(content, str):
        return [TextPart(content)]
    return [TextPart(part.text) for part in content]


def _user_parts(content: str | list[wire.UserPart], path: str) -> list[ContentPart]:
    if isinstance(content, str):
        return [TextPart(content)]
    return [_user_part(part, f"{path}[{index}]") for index, part in enumerate(content)]


def _user_part(part: wire.UserPart, path: str) -> ContentPart:
    if isinstance(part, wire.TextContent):
        return TextPart(part.text)
    if isinstance(part, wire.ImageContent):
        url = part.image_url.url
        check_url(url, f"{path}.image_url.url")
        if url.lstrip()[:5] == "data:" and url.lstrip()[5:11].lower() != "image/":  # OpenAI: 400 too
            raise _invalid(f"{path}.image_url.url", "a data: URL here holds an image (`data:image/png;base64,...`)")
        return ImagePart(ImageData(url=part.image_url.url, detail=part.image_url.detail))
    if isinstance(part, wire.AudioContent):
        audio = part.input_audio
        check_base64(audio.data, f"{path}.input_audio.data")
        return AudioPart(FileData(data=audio.data, media_type=_AUDIO_TYPES[audio.format]))
    return DocumentPart(_file(part.file, f"{path}.file"))


def _file(file: wire.FileRef, path: str) -> FileData:
    if file.file_id is not None:
        raise _invalid(f"{path}.file_id", "uploaded file ids cannot be served here; send `file_data`")
    if file.file_data is None:
        raise _invalid(f"{path}.file_data", "field required")
    if file.file_data.startswith("data:"):
        check_url(file.file_data, f"{path}.file_data")
        return FileData(url=file.file_data, file_name=file.filename)
    check_base64(file.file_data, f"{path}.file_data")
    return FileData(data=file.file_data, media_type="application/pdf", file_name=file.filename)


def _assistant_parts(message: wire.AssistantMessage) -> list[ContentPart]:
    parts: list[ContentPart] = []
    if message.reasoning_content:
        parts.append(ThinkingPart(ThinkingData(text=message.reasoning_content)))
    content, refusal = message.content, message.refusal  # `refusal`: the answer's, sent back as it came
    if isinstance(content, str):
        if content or not refusal:  # `""` beside a refusal is no text of its own
            parts.append(TextPart(content))
    elif content is not None:
        parts += [TextPart(p.text if isinstance(p, wire.TextContent) else p.refusal) for p in content]
        if any(not isinstance(p, wire.TextContent) for p in content):
            refusal = None  # it came as a part already
    if refusal:
        parts.append(TextPart(refusal))
    for call in message.tool_calls or ():
        raw = call.function.arguments
        data = ToolCallData(call.id, call.function.name, _arguments(raw), raw_arguments=raw)
        parts.append(ToolCallPart(data))
    return parts


def _arguments(raw: str) -> object:
    try:
        return _arguments_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):  # nested past msgspec's depth: not arguments to read
        return {}


def _tool(tool: wire.Tool) -> ToolDefinition:
    function = tool.function
    return ToolDefinition(function.name, function.description, function.parameters, function.strict)


def _tool_choice(choice: Literal["auto", "none", "required"] | wire.NamedToolChoice | None) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, wire.NamedToolChoice):
        return ToolChoice("named", choice.function.name)
    return ToolChoice(choice)


def _schema(response_format: object) -> wire.JSONSchemaSpec | None:
    """The `json_schema` format's spec when it has a schema (one without is `json_object`).
    This and `_json_object` test the format's type exactly (the decoder's classes, none
    subclassed): most requests have none, and `isinstance(None, <a Struct class>)` is the slow path
    (`providers.types.MEDIA_PARTS`)."""
    if type(response_format) is wire.JSONSchemaFormat and response_format.json_schema.schema is not None:
        return response_format.json_schema
    return None


def _json_object(response_format: object) -> bool | None:
    if type(response_format) is wire.JSONObjectFormat:
        return True
    if type(response_format) is wire.JSONSchemaFormat and response_format.json_schema.schema is None:
        return True
    return None


def _invalid(param: str, detail: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {detail}", param=param)
