"""The OpenAI Chat Completions wire format (ingress.md): the request as clients send it, the
`chat.completion` answer, the `chat.completion.chunk` SSE lines and the `/v1/models` list.

`usage_of` renders an `Outcome`'s usage in OpenAI's inclusive convention, with its cost: the chat
and the legacy text door (`app.edge.openai_completions`) answer with the same object.

Request Structs follow msgspec's policy as `providers.types` does: an explicit `null` is absent,
unknown fields are ignored, numeric ranges are `Meta` constraints, and the unions are tagged
(`role` on messages, `type` on content parts and `response_format`), so a wrong type, an unknown
role or part type fails decoding with the OpenAI field path (`messages[1].content[0].type`).

Stream lines are built from bytes: the per-request prefix of every chunk (`id`, `created`,
`model`, up to the delta) is encoded once when the answer starts (`ChunkBytes`), and a content
chunk is that prefix, one encoded string and a constant tail.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from app.context import RequestContext
from app.edge.unified_format import json_number
from app.edge.validation import MAX_TOKENS_LIMIT
from app.errors import StreamErrorView
from app.pipeline.events import Outcome
from catalog.records import CostSource
from providers.events import TopLogprob, Usage

# --- request ------------------------------------------------------------------------------------


class TextContent(Struct, tag_field="type", tag="text"):
    text: str


class RefusalContent(Struct, tag_field="type", tag="refusal"):
    refusal: str


class ImageURL(Struct):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImageContent(Struct, tag_field="type", tag="image_url"):
    image_url: ImageURL


class InputAudio(Struct):
    data: str
    format: Literal["wav", "mp3"]


class AudioContent(Struct, tag_field="type", tag="input_audio"):
    input_audio: InputAudio


class FileRef(Struct):
    file_data: str | None = None
    file_id: str | None = None
    filename: str | None = None


class FileContent(Struct, tag_field="type", tag="file"):
    file: FileRef


UserPart = TextContent | ImageContent | AudioContent | FileContent


class FunctionCall(Struct):
    name: str
    arguments: str


class ToolCall(Struct):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class SystemMessage(Struct, tag_field="role", tag="system"):
    content: str | list[TextContent]
    name: str | None = None


class DeveloperMessage(Struct, tag_field="role", tag="developer"):
    content: str | list[TextContent]
    name: str | None = None


class UserMessage(Struct, tag_field="role", tag="user"):
    content: str | list[UserPart]
    name: str | None = None


class AssistantMessage(Struct, tag_field="role", tag="assistant"):
    content: str | list[TextContent | RefusalContent] | None = None
    refusal: str | None = None  # what the gateway answered a refusal with (`message.refusal`), sent back
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    name: str | None = None


class ToolMessage(Struct, tag_field="role", tag="tool"):
    content: str | list[TextContent]
    tool_call_id: str


ChatMessage = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


Name = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]  # OpenAI's, and `.`
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]  # OpenAI's (and vLLM's) is a 64-bit integer


class FunctionDefinition(Struct):
    name: Name
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Struct):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(Struct):
    name: str


class NamedToolChoice(Struct):
    type: Literal["function"]
    function: FunctionName


class TextFormat(Struct, tag_field="type", tag="text"):
    pass


class JSONObjectFormat(Struct, tag_field="type", tag="json_object"):
    pass


class JSONSchemaSpec(Struct):
    # 1 to 64 characters: OpenAI's bounds, without its character set, which the SDK's own
    # `.parse()` breaks for generic models (`Page[Item]`) and local servers never read
    name: Annotated[str, Meta(min_length=1, max_length=64)]
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class JSONSchemaFormat(Struct, tag_field="type", tag="json_schema"):
    json_schema: JSONSchemaSpec


class StreamOptions(Struct):
    include_usage: bool | None = None


Penalty = Annotated[float, Meta(ge=-2, le=2)]


class ChatRequest(Struct):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    model: str | None = None
    tools: Annotated[list[Tool], Meta(min_length=1)] | None = None  # OpenAI refuses `[]`
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: TextFormat | JSONObjectFormat | JSONSchemaFormat | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Meta(ge=1, le=MAX_TOKENS_LIMIT)] | None = None  # both checked, whichever wins
    max_completion_tokens: Annotated[int, Meta(ge=1, le=MAX_TOKENS_LIMIT)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0)] | None = None
    continue_final_message: bool | None = None  # vLLM's: continue the last (assistant) message
    modalities: list[str] | None = None  # only `["text"]` is served (`openai_translate._check`)
    audio: dict[str, Any] | None = None  # audio output parameters: refused, as audio output is


request_decoder = msgspec.json.Decoder(ChatRequest)

# --- response -----------------------------------------------------------------------------------


class FunctionOut(Struct):
    name: str
    arguments: str  # a JSON string, as OpenAI sends it


class ToolCallOut(Struct):
    id: str
    type: str
    function: FunctionOut


class AssistantOut(Struct):
    role: str
    content: str | None
    refusal: str | UnsetType = UNSET
    tool_calls: list[ToolCallOut] | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET


class TokenLogprobOut(Struct):
    token: str
    logprob: float | None
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Struct):
    content: list[TokenLogprobOut]


class Choice(Struct):
    index: int
    message: AssistantOut
    logprobs: ChoiceLogprobs | None
    finish_reason: str


class PromptTokensDetails(Struct):
    cached_tokens: int
    cache_write_tokens: int


class CompletionTokensDetails(Struct):
    reasoning_tokens: int


class UsageOut(Struct):
    """OpenAI's inclusive convention over the five disjoint buckets, with the cost."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails
    cost: msgspec.Raw | None  # `json_number`
    cost_source: CostSource | None


_NO_USAGE = Usage()


def usage_of(outcome: Outcome) -> UsageOut:
    """The `usage` object of an answer (chat or text completion) from its `Outcome`."""
    usage = outcome.usage or _NO_USAGE
    prompt = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    completion = usage.output_tokens + usage.reasoning_tokens
    return UsageOut(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(usage.cache_read_tokens, usage.cache_write_tokens),
        completion_tokens_details=CompletionTokensDetails(usage.reasoning_tokens),
        cost=json_number(outcome.cost.usd),
        cost_source=outcome.cost.source,
    )


def created_of(ctx: RequestContext) -> int:
    """`created`: the request's start, in Unix seconds."""
    return int(ctx.started_at.timestamp())


class ChatCompletion(Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: UsageOut | UnsetType = UNSET


class UsageChunk(Struct, kw_only=True):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: tuple[()] = ()
    usage: UsageOut


class ErrorChunk(Struct):
    error: StreamErrorView


class ModelCard(Struct, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "switchyard"


class ModelCards(Struct, kw_only=True):
    object: str = "list"
    data: list[ModelCard]


encoder = msgspec.json.Encoder(decimal_format="number")
_encode = encoder.encode

# --- stream lines -------------------------------------------------------------------------------

KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"
CHUNK_TAIL = b'},"logprobs":null,"finish_reason":null}]}\n\n'  # after a delta object
_NO_ARGUMENTS = b',"arguments":""}}]' + CHUNK_TAIL


def data_line(payload: Struct) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


class ChunkBytes:
    """The chunk lines of one answer. `_head` is everything before the delta object:
    `data: {"id":…,"object":"chat.completion.chunk","created":…,"model":…,"choices":[{"index":0,"delta":`;
    `content_head` goes on to `{"content":`, so a content chunk is it, the encoded text and `CHUNK_TAIL`."""

    __slots__ = ("_head", "content_head")

    def __init__(self, request_id: str, created: int, model: str) -> None:
        self._head = b"".join(
            (
                b'data: {"id":',
                _encode(request_id),
                b',"object":"chat.completion.chunk","created":%d,"model":' % created,
                _encode(model),
                b',"choices":[{"index":0,"delta":',
            )
        )
        self.content_head = self._head + b'{"content":'

    def role(self) -> bytes:
        return self._head + b'{"role":"assistant"' + CHUNK_TAIL

    def content(self, text: str) -> bytes:
        return self.content_head + _encode(text) + CHUNK_TAIL

    def reasoning(self, text: str) -> bytes:
        return self._head + b'{"reasoning_content":' + _encode(text) + CHUNK_TAIL

    def refusal(self, text: str) -> bytes:
        return self._head + b'{"refusal":' + _encode(text) + CHUNK_TAIL

    def tool_call_start(self, index: int, call_id: str, name: str) -> bytes:
        start = b'{"tool_calls":[{"index":%d,"id":' % index + _encode(call_id)
        return self._head + start + b',"type":"function","function":{"name":' + _encode(name) + _NO_ARGUMENTS

    def tool_call_args(self, index: int, fragment: str) -> bytes:
        start = b'{"tool_calls":[{"index":%d,"function":{"arguments":' % index
        return self._head + start + _encode(fragment) + b"}}]" + CHUNK_TAIL

    def logprobs(self, text: str | None, tokens: ChoiceLogprobs) -> bytes:
        delta = b"{" if text is None else b'{"content":' + _encode(text)
        return self._head + delta + b'},"logprobs":' + _encode(tokens) + b',"finish_reason":null}]}\n\n'

    def finish(self, reason: str) -> bytes:
        return self._head + b'{},"logprobs":null,"finish_reason":' + _encode(reason) + b"}]}\n\n"
