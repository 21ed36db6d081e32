"""An Anthropic Messages request → the canonical `CompletionRequest`: decode once, translate, then
the gateway's own request rules (`app.edge.validation.check_request`).

Every rejection is an `InvalidRequest` whose `param` is the path of the failing field in the
Anthropic request (`messages[0].content[1].source.url`, `max_tokens`), in api.md's notation.

Mapping decisions (README, "Anthropic Messages ingress"):
- blocks map one to one, so content indexes agree: `text` → text, `image` and `document` (a
  `base64` or `url` source) → image and document parts, a `document` with a plain-text source →
  text, `tool_use` → a tool call (`raw_arguments` the JSON of `input`), `tool_result` → a tool
  result (text blocks joined by newlines), `thinking` / `redacted_thinking` → thinking parts;
  the images and documents inside a `tool_result` (a screenshot tool's) follow the message's own
  blocks as parts of that user message: an OpenAI-style `tool` message carries text only, so the
  upstream gets them in the user message right after the tool messages (a 400 named them before);
  a block in a role that cannot carry it (a `tool_use` from the user) is a 400, as Anthropic says;
- consecutive messages of one role are one turn, as Anthropic combines them (`_placed`); a
  rejection still names the block where the client sent it (`moved`);
- `thinking: {type: "enabled", budget_tokens}` → `reasoning_effort` by budget: under 4096 `low`,
  under 16384 `medium`, else `high`; the budget must be below `max_tokens`, as Anthropic requires.
  `disabled` and `adaptive` send no effort (the canonical request has no "none": the upstream's
  default applies). An explicit `output_config.effort` wins over the budget;
- `output_config.format` (`json_schema`) → the canonical `schema`; so does the top-level
  `output_format` of the structured-outputs beta (`client.beta.messages.create(output_format=…)`,
  before the format moved into `output_config`) when `output_config.format` is absent: dropped,
  the client asking for JSON got free text;
- `tool_choice`: `auto`, `any` → `required`, `tool` → named, `none`; `disable_parallel_tool_use`
  → `parallel_tool_calls: false`;
- `metadata.user_id` → `user`; `top_k`, `stop_sequences`, `temperature`, `top_p` as they are.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import msgspec

from app.edge import anthropic_format as fmt
from app.edge.validation import check_request, decode_body
from app.errors import InvalidRequest, clip
from providers.types import (
    CompletionRequest,
    ContentPart,
    DocumentPart,
    FileData,
    ImageData,
    ImagePart,
    Message,
    ReasoningEffort,
    RedactedThinkingData,
    RedactedThinkingPart,
    TextPart,
    ThinkingData,
    ThinkingPart,
    ToolCallData,
    ToolCallPart,
    ToolChoice,
    ToolDefinition,
    ToolResultData,
    ToolResultPart,
    prefill,
)

_decoder = msgspec.json.Decoder(fmt.MessagesRequest)
_encoder = msgspec.json.Encoder()
_CANONICAL_PART = re.compile(r"(content\[\d+\])\.data(\.arguments|\.content)?(?=\.|$)")
_CANONICAL_TOOL = re.compile(r"^(tools\[\d+\])\.parameters$")
_BLOCK_FIELDS = {".arguments": ".input", ".content": ".content"}  # else a media part's `data`: `.source`
_ASSISTANT_ONLY = (fmt.ToolUseBlock, fmt.ThinkingBlock, fmt.RedactedThinkingBlock)


def decode_messages(body: bytes, providers: Collection[str]) -> tuple[CompletionRequest, dict[str, str]]:
    """The checked canonical request, and its moved parts' paths (`to_request`)."""
    wire = decode_body(_decoder, body, tag="type")
    request, moved = to_request(wire)
    try:
        check_request(request, providers)
    except InvalidRequest as exc:
        raise _in_anthropic_terms(exc, moved) from None
    return request, moved


def to_request(wire: fmt.MessagesRequest) -> tuple[CompletionRequest, dict[str, str]]:
    """The canonical request, and for each part that is not where its block was (a tool result's
    media) its canonical path → the Anthropic one."""
    tool_choice, parallel = _tool_choice(wire)
    output = wire.output_config.format if wire.output_config is not None else None
    moved: dict[str, str] = {}
    if output is None and wire.output_format is not None:
        output = wire.output_format
        moved["schema"] = "output_format.schema"
    messages: list[Message] = []
    for i, turn in enumerate(_turns(wire.messages)):
        message = _message(turn, f"messages[{i}]", moved)
        if messages and messages[-1].role == message.role:  # Anthropic combines them into one turn
            into = messages[-1]
            _placed(moved, len(messages) - 1, len(into.content), i, len(message.content))
            into.content.extend(message.content)
        else:
            if len(messages) != i:  # after a combined turn: this message's canonical index is lower
                moved[f"messages[{len(messages)}]"] = f"messages[{i}]"  # before its parts: the last match wins
                _placed(moved, len(messages), 0, i, len(message.content))
            messages.append(message)
    request = CompletionRequest(
        messages=messages,
        model=wire.model,
        system=_system(wire.system),
        tools=[ToolDefinition(t.name, t.description, t.input_schema) for t in wire.tools] if wire.tools else None,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        schema=output.schema if output is not None else None,
        stream=wire.stream,
        temperature=wire.temperature,
        top_p=wire.top_p,
        top_k=wire.top_k,
        max_tokens=wire.max_tokens,
        stop_sequences=wire.stop_sequences or None,
        reasoning_effort=_effort(wire),
        user=wire.metadata.user_id if wire.metadata is not None else None,
    )  # at most 15 keywords (`catalog.records.POSITIONAL`)
    if prefill(messages[-1]):  # Anthropic continues a prefill
        request.continue_final_message = True
    return request, moved


def _system(system: str | list[fmt.TextBlock] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    return "\n".join(block.text for block in system) or None


def _turns(messages: list[fmt.InputMessage]) -> list[fmt.InputMessage]:
    """The messages, checked as Anthropic checks them: every one has content, but a last assistant
    message may be empty (a prefill of nothing: left out); `_message` refuses an empty text block."""
    last = len(messages) - 1
    for index, message in enumerate(messages):
        if not message.content and not (index == last and message.role == "assistant"):
            detail = "all messages must have non-empty content except for the optional final assistant message"
            raise _invalid(f"messages[{index}].content", detail)
    if messages[last].content:
        return messages
    if not last:  # nothing but an empty assistant message
        raise _invalid("messages[0].content", "the only message is empty")
    return messages[:last]


def _placed(moved: dict[str, str], at: int, start: int, origin: int, count: int) -> None:
    """The `count` parts of the Anthropic request's message `origin` are now the canonical message
    `at`'s from index `start` (a combined turn: Anthropic combines consecutive turns of one role,
    and a chat template that wants roles to alternate, Gemma's, refuses them apart; or a message
    after one): their paths noted in `moved`, a tool result's media moved once already included."""
    for index in range(count):
        path = f"messages[{origin}].content[{index}]"
        moved[f"messages[{at}].content[{start + index}]"] = moved.pop(path, path)


def _message(message: fmt.InputMessage, path: str, moved: dict[str, str]) -> Message:
    """The canonical message; its tool results' media, after its own blocks, noted in `moved`."""
    content = message.content
    if isinstance(content, str):
        return Message(role=message.role, content=[TextPart(content)])
    parts: list[ContentPart] = []
    media: list[tuple[ContentPart, str]] = []  # a tool result's images and documents, and where they were
    for index, block in enumerate(content):
        if isinstance(block, fmt.TextBlock):  # the common case first
            if not block.text:
                raise _invalid(f"{path}.content[{index}].text", "text content blocks must be non-empty")
            parts.append(TextPart(block.text))
            continue
        allowed = "assistant" if isinstance(block, _ASSISTANT_ONLY) else "user"
        if message.role != allowed:
            kind = type(block).__struct_config__.tag
            detail = f"a '{kind}' block cannot appear in a '{message.role}' message"
            raise _invalid(f"{path}.content[{index}].type", detail)
        if isinstance(block, fmt.ToolResultBlock) and isinstance(block.content, list):
            where = f"{path}.content[{index}].content"
            items = enumerate(block.content)
            media += [(_part(item), f"{where}[{j}]") for j, item in items if type(item) is not fmt.TextBlock]
        parts.append(_part(block))
    for part, origin in media:  # after the message's own blocks, so those keep their indexes
        moved[f"{path}.content[{len(parts)}]"] = origin
        parts.append(part)
    return Message(role=message.role, content=parts)


def _part(block: fmt.InputBlock) -> ContentPart:
    if isinstance(block, fmt.ImageBlock):
        source = block.source
        if isinstance(source, fmt.URLSource):
            return ImagePart(ImageData(url=source.url))
        return ImagePart(ImageData(data=source.data, media_type=source.media_type))
    if isinstance(block, fmt.DocumentBlock):
        return _document(block)
    if isinstance(block, fmt.ToolUseBlock):
        raw = _encoder.encode(block.input).decode()
        return ToolCallPart(ToolCallData(block.id, block.name, block.input, raw_arguments=raw))
    if isinstance(block, fmt.ToolResultBlock):
        content = block.content
        if isinstance(content, list):  # its text; `_message` moves its media after the message's blocks
            content = "\n".join(text.text for text in content if isinstance(text, fmt.TextBlock))
        return ToolResultPart(ToolResultData(block.tool_use_id, content, block.is_error))
    if isinstance(block, fmt.ThinkingBlock):
        return ThinkingPart(ThinkingData(block.thinking, block.signature or None))
    if isinstance(block, fmt.RedactedThinkingBlock):
        return RedactedThinkingPart(RedactedThinkingData(block.data))
    return TextPart(block.text)


def _document(block: fmt.DocumentBlock) -> ContentPart:
    source = block.source
    if isinstance(source, fmt.PlainTextSource):
        return TextPart(source.data)
    if isinstance(source, fmt.URLSource):
        return DocumentPart(FileData(url=source.url, file_name=block.title))
    return DocumentPart(FileData(data=source.data, media_type=source.media_type, file_name=block.title))


def _tool_choice(wire: fmt.MessagesRequest) -> tuple[ToolChoice | None, bool | None]:
    choice = wire.tool_choice
    if choice is None:
        return None, None
    if isinstance(choice, fmt.ToolChoiceNone):
        return ToolChoice("none"), None
    names = {tool.name for tool in wire.tools or ()}
    parallel = False if choice.disable_parallel_tool_use else None
    if isinstance(choice, fmt.ToolChoiceAuto):
        return ToolChoice("auto"), parallel
    if not names:
        raise _invalid("tool_choice.type", f"'{choice.__struct_config__.tag}' needs at least one tool in `tools`")
    if isinstance(choice, fmt.ToolChoiceAny):
        return ToolChoice("required"), parallel
    if choice.name not in names:
        raise _invalid("tool_choice.name", f"names no declared tool: '{clip(choice.name)}'")
    return ToolChoice("named", choice.name), parallel


def _effort(wire: fmt.MessagesRequest) -> ReasoningEffort | None:
    thinking = wire.thinking  # its type exactly: usually None (`providers.types.MEDIA_PARTS` on why)
    if type(thinking) is fmt.ThinkingEnabled and thinking.budget_tokens >= wire.max_tokens:
        raise _invalid("thinking.budget_tokens", f"must be less than max_tokens ({wire.max_tokens})")
    if wire.output_config is not None and wire.output_config.effort is not None:
        return wire.output_config.effort
    if type(thinking) is not fmt.ThinkingEnabled:
        return None
    if thinking.budget_tokens < 4096:
        return "low"
    return "medium" if thinking.budget_tokens < 16384 else "high"


def _in_anthropic_terms(exc: InvalidRequest, moved: dict[str, str]) -> InvalidRequest:
    """A rule of `check_request` broken, named by the Anthropic path: a tool call's `data.arguments`
    is its block's `input`, a tool result's `data.content` its `content`, a media part's `data`
    its `source`, a part moved out of a tool result the block it was there; a tool's `parameters`
    is its `input_schema`, the `schema` is `output_config.format.schema`; every other path is the
    same in both requests."""
    param = exc.param
    if param is None:
        return exc
    renamed = param
    for canonical, origin in moved.items():
        if param == canonical or param.startswith(f"{canonical}."):
            renamed = origin + param[len(canonical) :]
    renamed = _CANONICAL_PART.sub(_anthropic_part, renamed)
    renamed = _CANONICAL_TOOL.sub(r"\1.input_schema", renamed)
    if renamed == "schema":
        renamed = "output_config.format.schema"
    if renamed == param:
        return exc
    return _invalid(renamed, exc.message.removeprefix(f"{param}: "))


def _anthropic_part(match: re.Match[str]) -> str:
    """`content[j].data…` of a canonical path as the Anthropic block's own field."""
    return match[1] + _BLOCK_FIELDS.get(match[2] or "", ".source")


def _invalid(param: str, detail: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {detail}", param=param)
