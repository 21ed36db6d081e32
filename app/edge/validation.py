"""Request validation: decode once with msgspec, then the rules a type cannot express.

Every rejection is an `InvalidRequest` whose `param` is the JSON path of the failing field in the
same notation api.md uses (`messages[0].content[1].kind`). Nothing is silently dropped: a part that
a role cannot carry (a `tool_call` in a user message) is a 400, not a quiet omission.

msgspec reports the path of a validation failure as "... - at `$.a.b[0]`"; that suffix is the only
thing parsed from its message, turning it into `param`. The server never reads a client-named file
or fetches a client-named URL: media URLs must be `https://` or `data:` and are passed through.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Collection

import msgspec

from app.errors import InvalidRequest
from providers.types import (
    AudioPart,
    CompletionRequest,
    DocumentPart,
    FileData,
    ImageData,
    ImagePart,
    Message,
    RedactedThinkingPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
)

_decoder = msgspec.json.Decoder(CompletionRequest)
_AT = re.compile(r"^(?P<msg>.*?) - at `\$(?P<path>[^`]*)`$")
_RESERVED_OPTIONS = frozenset({"model", "messages", "stream", "stream_options"})
_PART_ROLES: dict[type, frozenset[str]] = {
    ToolCallPart: frozenset({"assistant"}),
    ToolResultPart: frozenset({"tool", "user"}),
    ThinkingPart: frozenset({"assistant"}),
    RedactedThinkingPart: frozenset({"assistant"}),
}
_TEXT_ONLY_ROLES = frozenset({"system", "developer"})


def decode_request(body: bytes, providers: Collection[str]) -> CompletionRequest:
    try:
        request = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise validation_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    check_request(request, providers)
    return request


def validation_error(message: str) -> InvalidRequest:
    """A msgspec validation message as a 400 whose `param` is the failing field's path."""
    match = _AT.match(message)
    if match is None:  # the top level: no path in the message
        if message.startswith("Expected `object`"):
            return InvalidRequest("request body must be a JSON object")
        param, detail = "", message
    else:
        param, detail = match["path"].lstrip("."), match["msg"]
    if param.endswith(".kind") and detail.startswith("Invalid value"):
        detail = "unknown content kind " + detail.removeprefix("Invalid value ")
    elif detail.startswith("Object missing required field"):
        field_name = detail.split("`")[1]
        param = f"{param}.{field_name}" if param else field_name
        detail = "field required"
    if not param:
        return InvalidRequest(detail)
    return InvalidRequest(f"{param}: {detail}", param=param)


def check_request(request: CompletionRequest, providers: Collection[str]) -> None:
    _check_tools(request)
    for index, message in enumerate(request.messages):
        _check_message(message, f"messages[{index}]")
    _check_provider_options(request, providers)


def _check_tools(request: CompletionRequest) -> None:
    names: set[str] = set()
    for index, tool in enumerate(request.tools or ()):
        if tool.name in names:
            raise _invalid(f"tools[{index}].name", f"duplicate tool name '{tool.name}'")
        names.add(tool.name)
    choice = request.tool_choice
    if choice is None:
        return
    if choice.mode == "named":
        if not choice.tool_name:
            raise _invalid("tool_choice.tool_name", "required when mode is 'named'")
        if choice.tool_name not in names:
            raise _invalid("tool_choice.tool_name", f"names no declared tool: '{choice.tool_name}'")
    elif choice.tool_name is not None:
        raise _invalid("tool_choice.tool_name", "only allowed when mode is 'named'")
    if choice.mode == "required" and not names:
        raise _invalid("tool_choice.mode", "'required' needs at least one tool in `tools`")


def _check_message(message: Message, path: str) -> None:
    for index, part in enumerate(message.content):
        part_path = f"{path}.content[{index}]"
        allowed = _PART_ROLES.get(type(part))
        if allowed is not None and message.role not in allowed:
            kind = type(part).__struct_config__.tag
            raise _invalid(f"{part_path}.kind", f"a '{kind}' part cannot appear in a '{message.role}' message")
        if message.role in _TEXT_ONLY_ROLES and not isinstance(part, TextPart):
            raise _invalid(f"{part_path}.kind", f"'{message.role}' messages carry only text parts")
        if isinstance(part, ImagePart | AudioPart | DocumentPart):
            _check_media(part.data, f"{part_path}.data")


def _check_media(data: ImageData | FileData, path: str) -> None:
    if data.url is None and data.data is None:
        raise _invalid(path, "needs `url` or `data`")
    if data.url is not None and data.data is not None:
        raise _invalid(path, "give `url` or `data`, not both")
    if data.url is not None:
        check_url(data.url, f"{path}.url")
    elif isinstance(data.data, str):
        check_base64(data.data, f"{path}.data")


def check_url(url: str, path: str) -> None:
    """A media URL the gateway passes on: `https://` or `data:` only (it never reads its own disk)."""
    if not url.strip().startswith(("https://", "data:")):
        detail = "must be an https:// or data: URL (local paths and other schemes are refused)"
        raise _invalid(path, detail)


def check_base64(data: str, path: str) -> None:
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid(path, "is not valid base64") from None


def _check_provider_options(request: CompletionRequest, providers: Collection[str]) -> None:
    for name, options in (request.provider_options or {}).items():
        if name not in providers:
            raise _invalid(f"provider_options.{name}", f"names no configured provider '{name}'")
        for key in options:
            if key in _RESERVED_OPTIONS:
                raise _invalid(f"provider_options.{name}.{key}", f"may not override '{key}'")


def _invalid(param: str, detail: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {detail}", param=param)
