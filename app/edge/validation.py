"""Request validation: decode once with msgspec, then the rules a type cannot express.

Every rejection is an `InvalidRequest` whose `param` is the JSON path of the failing field in the
same notation api.md uses (`messages[0].content[1].kind`). Nothing is silently dropped: a part that
a role cannot carry (a `tool_call` in a user message) is a 400, not a quiet omission.

msgspec reports the path of a validation failure as "... - at `$.a.b[0]`"; that suffix becomes
`param`. Three of msgspec's phrasings are also recognised, to say them in api.md's words
(`validation_error`): "Expected `object`" with no path (the body is not a JSON object), "Invalid
value" at a union's tag (an unknown `kind`), and "Object missing required field" (`param` then
names the field: "field required"); any other message is passed on as msgspec wrote it, except
that client-supplied values quoted in it (msgspec's "Invalid enum value '...'" included) are cut
to a short prefix (`app.errors.clip`). The server never reads a client-named file or fetches a
client-named URL: media URLs must be `https://` or `data:` and are passed through.

Nesting: a request body may nest at most `MAX_JSON_DEPTH` (64) arrays and objects deep, counting the
body's own object as level 1; deeper is a 400 whose `param` names the free-form field holding the
nesting (`schema`, `tools[0].parameters`, `messages[0].content[0].data.arguments`,
`provider_options.local.top_k`, or an unknown key). Without the limit a body nested ~1,000 deep
makes msgspec raise `RecursionError` (a 500), and one a little shallower decodes but fails later,
when the pipeline re-encodes it a few frames deeper. The typed part of a request is at most six
levels deep, so only the free-form values can be deep, and only those present are walked, in the
loops that check them anyway: nothing for a plain chat request, about a microsecond per tool
definition. The raw body is scanned only after msgspec has raised `RecursionError`, to name the
field. (msgspec skips unknown keys, keeping none: one is refused only when deep enough to stop msgspec.)

`max_tokens` above `MAX_TOKENS_LIMIT` (2**31 - 1) is a 400 for every model; `max_output` is admission's.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Collection, Iterable
from typing import TypeVar, cast
from urllib.parse import urlsplit

import msgspec

from app.edge.error_paths import with_dict_keys
from app.errors import ECHO_CHARS, InvalidRequest, clip
from providers.openai_request import BOUNDING_OPTIONS
from providers.types import (
    MEDIA_PARTS,
    AudioPart,
    CompletionRequest,
    ContentPart,
    DocumentPart,
    FileData,
    ImageData,
    ImagePart,
    MediaPart,
    Message,
    RedactedThinkingPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    prefill,
)

_decoder = msgspec.json.Decoder(CompletionRequest)
_AT = re.compile(r"^(?P<msg>.*?) - at `\$(?P<path>[^`]*)`$")
_RESERVED_OPTIONS = frozenset({"model", "messages", "stream", "stream_options"})
_PART_ROLES: dict[type, frozenset[str]] = {
    ToolCallPart: frozenset({"assistant"}),
    ToolResultPart: frozenset({"tool", "user"}),
    ThinkingPart: frozenset({"assistant"}),
    RedactedThinkingPart: frozenset({"assistant"}),
    # media are the user's: no upstream API carries them in an assistant's turn (they were dropped)
    ImagePart: frozenset({"user"}),
    AudioPart: frozenset({"user"}),
    DocumentPart: frozenset({"user"}),
}
_TEXT_ONLY_ROLES = frozenset({"system", "developer"})
_QUOTED = re.compile(r"(['\"])(.*)\1", re.DOTALL)

MAX_JSON_DEPTH = 64
T = TypeVar("T")
MAX_TOKENS_LIMIT = 2**31 - 1


def decode_request(body: bytes, providers: Collection[str]) -> CompletionRequest:
    request = decode_body(_decoder, body)
    check_request(request, providers)
    return request


def decode_body(decoder: msgspec.json.Decoder[T], body: bytes, tag: str = "kind") -> T:
    """`body` decoded by a door's prebuilt decoder; every failure a 400 naming the field (`tag` is
    the door's union tag field, named in an unknown-variant message)."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        try:  # naming the key decodes the body again, whole: too deep for it is too deep (a 500 before)
            message = with_dict_keys(decoder, body, str(exc))
        except RecursionError:
            raise nesting_error(body) from None
        raise validation_error(message, tag) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise nesting_error(body) from None


def validation_error(message: str, tag: str = "kind") -> InvalidRequest:
    """A msgspec validation message as a 400 whose `param` is the failing field's path."""
    match = _AT.match(message)
    if match is None:  # the top level: no path in the message
        if message.startswith("Expected `object`"):
            return InvalidRequest("request body must be a JSON object")
        param, detail = "", _clip_quoted(message)
    else:
        param, detail = match["path"].lstrip("."), _clip_quoted(match["msg"])
    if param.endswith(f".{tag}") and detail.startswith("Invalid value"):
        unknown = "unknown content kind " if tag == "kind" else f"unknown {tag} "
        detail = unknown + detail.removeprefix("Invalid value ")
    elif detail.startswith("Object missing required field"):
        field_name = detail.split("`")[1]
        param = f"{param}.{field_name}" if param else field_name
        detail = "field required"
    if not param:
        return InvalidRequest(detail)
    return InvalidRequest(f"{param}: {detail}", param=param)


def _clip_quoted(detail: str) -> str:
    """msgspec quotes the offending value ("Invalid enum value 'xyz'"): keep a prefix of it."""
    quoted = _QUOTED.search(detail)
    if quoted is None or len(quoted[2]) <= ECHO_CHARS:
        return detail
    mark = quoted[1]
    return f"{detail[: quoted.start()]}{mark}{clip(quoted[2])}{mark}{detail[quoted.end() :]}"


def check_request(request: CompletionRequest, providers: Collection[str]) -> None:
    if request.schema is not None and deeper(request.schema, MAX_JSON_DEPTH - 1):
        raise too_deep("schema")
    if request.max_tokens is not None and request.max_tokens > MAX_TOKENS_LIMIT:
        raise _invalid("max_tokens", f"must be at most {MAX_TOKENS_LIMIT}")
    for index, stop in enumerate(request.stop_sequences or ()):
        if not stop:  # it would end every answer before its first token, or be ignored: a mistake
            raise _invalid(f"stop_sequences[{index}]", "must not be empty")
    _check_tools(request)
    for index, message in enumerate(request.messages):
        _check_message(message, f"messages[{index}]")
    check_prefill(request.continue_final_message, request.messages)
    _check_provider_options(request, providers)


def check_prefill(asked: bool | None, messages: list[Message]) -> None:
    """`continue_final_message` asks to continue the last message: an assistant one with text."""
    if asked and not prefill(messages[-1]):
        raise _invalid("continue_final_message", "the last message must be an assistant message with text")


def _check_tools(request: CompletionRequest) -> None:
    names: set[str] = set()
    for index, tool in enumerate(request.tools or ()):
        if tool.name in names:
            raise _invalid(f"tools[{index}].name", f"duplicate tool name '{clip(tool.name)}'")
        names.add(tool.name)
        if tool.parameters is not None and deeper(tool.parameters, MAX_JSON_DEPTH - 3):
            raise too_deep(f"tools[{index}].parameters")
    choice = request.tool_choice
    if choice is None:
        return
    if choice.mode == "named":
        if not choice.tool_name:
            raise _invalid("tool_choice.tool_name", "required when mode is 'named'")
        if choice.tool_name not in names:
            raise _invalid("tool_choice.tool_name", f"names no declared tool: '{clip(choice.tool_name)}'")
    elif choice.tool_name is not None:
        raise _invalid("tool_choice.tool_name", "only allowed when mode is 'named'")
    if choice.mode == "required" and not names:
        raise _invalid("tool_choice.mode", "'required' needs at least one tool in `tools`")


def _check_message(message: Message, path: str) -> None:
    if not message.content:  # on every door: OpenAI's `content: null` without calls, Anthropic's `[]`
        raise _invalid(f"{path}.content", "a message needs at least one part")
    for index, part in enumerate(message.content):
        part_path = f"{path}.content[{index}]"
        allowed = _PART_ROLES.get(type(part))
        if allowed is not None:
            if message.role not in allowed:
                kind = type(part).__struct_config__.tag
                raise _invalid(f"{part_path}.kind", f"a '{kind}' part cannot appear in a '{message.role}' message")
            _check_part_nesting(part, part_path)
        if message.role in _TEXT_ONLY_ROLES and type(part) is not TextPart:
            raise _invalid(f"{part_path}.kind", f"'{message.role}' messages carry only text parts")
        if type(part) in MEDIA_PARTS:
            _check_media(cast(MediaPart, part).data, f"{part_path}.data")
        elif type(part) is ThinkingPart and part.data.redacted:  # an opaque blob is no reasoning text to send on
            raise _invalid(f"{part_path}.data.redacted", "must be false on a 'thinking' part ('redacted_thinking')")
        elif message.role == "tool" and not message.tool_call_id and type(part) is TextPart:
            raise _invalid(f"{path}.tool_call_id", "a 'tool' message with text needs the id of the call it answers")


def _check_part_nesting(part: ContentPart, path: str) -> None:
    """A tool call's `arguments` and a tool result's `content` sit in level 6 of the body."""
    if isinstance(part, ToolCallPart) and deeper(part.data.arguments, MAX_JSON_DEPTH - 6):
        raise too_deep(f"{path}.data.arguments")
    if isinstance(part, ToolResultPart) and deeper(part.data.content, MAX_JSON_DEPTH - 6):
        raise too_deep(f"{path}.data.content")


def _check_media(data: ImageData | FileData, path: str) -> None:
    if data.url is None and data.data is None:
        raise _invalid(path, "needs `url` or `data`")
    if data.url is not None and data.data is not None:
        raise _invalid(path, "give `url` or `data`, not both")
    if data.media_type is not None and not _MEDIA_TYPE.fullmatch(data.media_type):
        raise _invalid(f"{path}.media_type", "is not a media type (`type/subtype`)")
    if data.url is not None:
        check_url(data.url, f"{path}.url")
    elif not data.data:
        raise _invalid(f"{path}.data", "is empty")
    elif isinstance(data.data, str):
        check_base64(data.data, f"{path}.data")


_MEDIA_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*")
# RFC 2397: data:[<media type>][;<parameter>=<value>]*[;base64],<data>
_DATA_URL = re.compile(r"data:(?:[\w!#$&^.+-]+/[\w!#$&^.+-]+)?((?:;[\w!#$&^.+-]+=[^;,]*)*)(;base64)?,(.*)", re.DOTALL)


def check_url(url: str, path: str) -> None:
    """A media URL the gateway passes on: `https://` with a host, or a well-formed `data:` URL
    whose base64 payload decodes (it never reads its own disk, and an upstream would only
    refuse the rest later, as a 400 from far away)."""
    url = url.strip()
    if url[:8].lower() == "https://":  # a scheme is case-insensitive (RFC 3986)
        try:
            parts = urlsplit(url)
            host, _port = parts.hostname, parts.port
        except ValueError:  # a malformed IPv6 host, a port out of range, a netloc NFKC normalization changes
            raise _invalid(path, "is not a valid URL") from None
        if not host:
            raise _invalid(path, "names no host")
        return
    if not url.startswith("data:"):
        detail = "must be an https:// or data: URL (local paths and other schemes are refused)"
        raise _invalid(path, detail)
    parsed = _DATA_URL.fullmatch(url)
    if parsed is None:
        raise _invalid(path, "is not a data: URL (`data:<type>;base64,<data>`)")
    if not parsed[3]:
        raise _invalid(path, "is an empty data: URL")
    if parsed[2]:
        check_base64(parsed[3], path)


def check_base64(data: str, path: str) -> None:
    if not data:
        raise _invalid(path, "is empty")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid(path, "is not valid base64") from None


def _check_provider_options(request: CompletionRequest, providers: Collection[str]) -> None:
    for name, options in (request.provider_options or {}).items():
        if name not in providers:
            raise _invalid(f"provider_options.{clip(name)}", f"names no configured provider '{clip(name)}'")
        for key, value in options.items():
            if key in _RESERVED_OPTIONS:
                raise _invalid(f"provider_options.{name}.{key}", f"may not override '{key}'")
            if key in BOUNDING_OPTIONS:
                detail = f"may not set '{key}': it bounds the answer's cost (set `max_tokens` in the request)"
                raise _invalid(f"provider_options.{name}.{key}", detail)
            if deeper(value, MAX_JSON_DEPTH - 3):
                raise too_deep(f"provider_options.{name}.{clip(key)}")


def deeper(value: object, levels: int) -> bool:
    """Whether `value` (decoded JSON) nests more than `levels` arrays and objects."""
    items: Iterable[object]
    if type(value) is dict:
        items = value.values()
    elif type(value) is list:
        items = value
    else:
        return False
    if levels <= 0:
        return True
    levels -= 1
    for item in items:  # a loop, not any(<generator>): a third of the cost
        kind = type(item)
        if (kind is dict or kind is list) and deeper(item, levels):
            return True
    return False


def nesting_error(body: bytes) -> InvalidRequest:
    """The 400 for a body msgspec could not decode for its depth (`RecursionError`). Error path
    only: scans the raw bytes for the first value that opens level `MAX_JSON_DEPTH + 1`."""
    path = _deep_path(body)
    if path is None:
        return InvalidRequest(f"request body nests deeper than {MAX_JSON_DEPTH} levels")
    return too_deep(_param(_free_form_root(path)))


def too_deep(param: str) -> InvalidRequest:
    return _invalid(param, f"nests deeper than {MAX_JSON_DEPTH} levels (the request body counts as one)")


# A string (unrolled, so linear), an opening, a closing, a comma: the structure, strings skipped whole.
_TOKEN = re.compile(rb'("[^"\\]*(?:\\.[^"\\]*)*")|([\[{])|([\]}])|(,)')
_Path = list[str | int]


def _deep_path(body: bytes) -> _Path | None:
    """The keys and indexes leading to the first container at depth `MAX_JSON_DEPTH + 1`."""
    objects: list[bool] = []  # per open container: an object?
    steps: list[int] = []  # per open container: the current index, or where the current key starts
    expect_key = False
    for token in _TOKEN.finditer(body):
        kind = token.lastindex
        if kind == 1:
            if expect_key:
                steps[-1] = token.start()
                expect_key = False
        elif kind == 2:
            if len(objects) >= MAX_JSON_DEPTH:
                return [_key(body, step) if obj else step for obj, step in zip(objects, steps, strict=True)]
            expect_key = body[token.start()] == 0x7B  # {
            objects.append(expect_key)
            steps.append(0)
        elif kind == 3:
            if objects:
                objects.pop()
                steps.pop()
            expect_key = False
        elif objects:
            if objects[-1]:
                expect_key = True
            else:
                steps[-1] += 1
    return None


def _key(body: bytes, start: int) -> str:
    string = _TOKEN.match(body, start)
    if string is None or string.lastindex != 1:
        return "?"
    try:
        return str(json.loads(string[0]))
    except ValueError:
        return string[0][1:-1].decode("utf-8", "replace")


# Containers of the typed part of a request, on every door that decodes with `decode_body` (an
# index stands for any index, "*" for any key): the first step out of them is the free-form field
# that `param` names — native `tools[0].parameters`, chat `tools[0].function.parameters` and
# `response_format.json_schema.schema`, Anthropic `output_config.format.schema`, `output_format.schema`.
_TYPED: frozenset[tuple[str | int, ...]] = frozenset(
    {
        (),
        ("messages",),
        ("messages", 0),
        ("messages", 0, "content"),
        ("messages", 0, "content", 0),
        ("messages", 0, "content", 0, "data"),
        ("tools",),
        ("tools", 0),
        ("tools", 0, "function"),
        ("response_format",),
        ("response_format", "json_schema"),
        ("output_config",),
        ("output_config", "format"),
        ("output_format",),
        ("provider_options",),
        ("provider_options", "*"),
    }
)


def _free_form_root(path: _Path) -> _Path:
    shape: tuple[str | int, ...] = ()
    for length, step in enumerate(path, start=1):
        key = 0 if isinstance(step, int) else "*" if shape == ("provider_options",) else step
        shape = (*shape, key)
        if shape not in _TYPED:
            return path[:length]
    return path


def _param(path: _Path) -> str:
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else f".{clip(step)}" if text else clip(step)
    return text


def _invalid(param: str, detail: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {detail}", param=param)
