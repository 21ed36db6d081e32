"""What `switchyard mock-upstream` says: its options and its OpenAI-compatible reply bytes.

For one (endpoint, model) every byte of a completion reply is built once, into a `Plan`: the SSE
frames up to the finish chunk, and the JSON body cut around its usage object. Per request only the
usage (prompt tokens are estimated from the request body's size) is encoded and spliced in, so the
mock stays many times cheaper than the gateway it stands behind. Deciding which reply a request
gets (routes, injected faults, pacing) is `devtools.mock_upstream.ScriptedResponder`'s business.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog."
REASONING_TEXT = "Let me think about this step by step."
TOOL_ARGUMENTS = '{"city": "Ljubljana", "unit": "celsius"}'
CHAT_PATH = "/v1/chat/completions"
TEXT_PATH = "/v1/completions"
DONE_FRAME = b"data: [DONE]\n\n"


class ScriptedOptions(Struct, frozen=True):
    model: str = "mock-model"
    latency_ms: float = 0.0
    chunk_delay_ms: float = 0.0
    chunks: int = 64
    tokens_per_chunk: int = 1
    text: str = DEFAULT_TEXT
    reasoning_chunks: int = 0
    tool_call: str | None = None  # a function name: the reply ends with one call to it
    fail_status: int | None = None
    fail_every: int = 1
    retry_after: int | None = None
    reset_after: int | None = None
    metrics_waiting: int = 0


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: _CompletionDetails | UnsetType = UNSET


class _CompletionDetails(Struct):
    reasoning_tokens: int


class _Function(Struct, kw_only=True):
    name: str | UnsetType = UNSET
    arguments: str


class _ToolCall(Struct, kw_only=True):
    index: int | UnsetType = UNSET
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET
    function: _Function


class _Delta(Struct):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[_ToolCall] | UnsetType = UNSET


class _Message(Struct):
    role: str
    content: str | None
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[_ToolCall] | UnsetType = UNSET


class _StreamChoice(Struct):
    index: int
    delta: _Delta
    finish_reason: str | None


class _Choice(Struct):
    index: int
    message: _Message
    finish_reason: str


class _TextLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class _TextChoice(Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: _TextLogprobs | UnsetType = UNSET  # only when the request asked for them


class _Body(Struct):
    id: str
    object: str
    created: int
    model: str
    choices: Sequence[Struct]
    usage: Usage | UnsetType = UNSET


class _StreamOptions(Struct):
    include_usage: bool = False


class CompletionRequest(Struct):
    """The only fields of an upstream request the mock reads (`prompt`, `logprobs` and `echo` on
    `/v1/completions` only)."""

    model: str = ""
    stream: bool = False
    stream_options: _StreamOptions | None = None
    prompt: str | list[Any] | None = None
    logprobs: int | bool | None = None  # an int on /v1/completions, a bool on chat (not simulated there)
    echo: bool = False
    max_tokens: int | None = None  # reported completion tokens never exceed it, as no real server's do
    max_completion_tokens: int | None = None


class Plan(Struct):
    """Everything about one (endpoint, model) reply that does not depend on the request."""

    frames: list[bytes]  # SSE events up to and including the finish chunk
    joined: bytes  # the same, as one chunk
    json_head: bytes  # the JSON body before and after its usage object
    json_tail: bytes
    completion_tokens: int
    reasoning_tokens: int


_SENTINEL = Usage(-987654321, -1, -1)


def estimate_prompt_tokens(body: bytes) -> int:
    """The mock's prompt token count: one token per four bytes of request body, at least one."""
    return max(1, len(body) // 4)


def usage_for(plan: Plan, body: bytes, limit: int | None = None) -> Usage:
    """The usage of one request: its estimated prompt, the plan's completion, at most `limit` (the
    request's `max_tokens`: the text is the plan's all the same, the count is what a server that
    stopped there would bill)."""
    prompt = estimate_prompt_tokens(body)
    completion = plan.completion_tokens if limit is None else min(plan.completion_tokens, max(0, limit))
    usage = Usage(prompt, completion, prompt + completion)
    if plan.reasoning_tokens:
        usage.completion_tokens_details = _CompletionDetails(min(plan.reasoning_tokens, completion))
    return usage


def json_body(plan: Plan, usage: Usage) -> bytes:
    return plan.json_head + msgspec.json.encode(usage) + plan.json_tail


def usage_frame(path: str, created: int, model: str, usage: Usage) -> bytes:
    """The trailing usage-only chunk a stream gets with `stream_options.include_usage`."""
    if path == CHAT_PATH:
        return _sse(_Body("chatcmpl-mock", "chat.completion.chunk", created, model, [], usage))
    return _sse(_Body("cmpl-mock", "text_completion", created, model, [], usage))


def _tokens(text: str, count: int) -> list[str]:
    """`count` words cycling through `text` (one word, one token)."""
    words = re.findall(r"\s*\S+", text) or ["x"]
    again = [" " + words[0].lstrip(), *words[1:]]  # after the first pass, every word follows a space
    return [(words if k < len(words) else again)[k % len(words)] for k in range(count)]


def _pieces(text: str, count: int, per_chunk: int) -> list[str]:
    """`count` chunks of `per_chunk` words each, cycling through `text`."""
    tokens = _tokens(text, count * per_chunk)
    return ["".join(tokens[i * per_chunk : (i + 1) * per_chunk]) for i in range(count)]


def _sse(obj: Struct) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def build_plan(
    opts: ScriptedOptions, created: int, path: str, model: str, logprobs: int | None = None, echo: str | None = None
) -> Plan:
    """The reply bytes for `path` (chat or text completions) naming `model`; a text completion
    carries `logprobs` alternatives per token when asked, and starts with the prompt `echo`."""
    content = _pieces(opts.text, opts.chunks, opts.tokens_per_chunk)
    if path == TEXT_PATH:
        return _text_plan(opts, created, model, logprobs, echo)
    reasoning = _pieces(REASONING_TEXT, opts.reasoning_chunks, opts.tokens_per_chunk)
    deltas = [_Delta(reasoning_content=p) for p in reasoning] + [_Delta(content=p) for p in content]
    if opts.tool_call is not None:
        named = _Function(name=opts.tool_call, arguments="")
        opening = _ToolCall(index=0, id="call_mock_0", type="function", function=named)
        rest = _ToolCall(index=0, function=_Function(arguments=TOOL_ARGUMENTS))
        deltas += [_Delta(tool_calls=[opening]), _Delta(tool_calls=[rest])]
    finish = "stop" if opts.tool_call is None else "tool_calls"
    deltas.append(_Delta())
    deltas[0].role = "assistant"
    head = _Body("chatcmpl-mock", "chat.completion.chunk", created, model, [])
    frames = [_sse(msgspec.structs.replace(head, choices=[_StreamChoice(0, d, None)])) for d in deltas[:-1]]
    frames.append(_sse(msgspec.structs.replace(head, choices=[_StreamChoice(0, deltas[-1], finish)])))
    message = _Message("assistant", "".join(content) if content or opts.tool_call is None else None)
    if reasoning:
        message.reasoning_content = "".join(reasoning)
    if opts.tool_call is not None:
        call = _Function(name=opts.tool_call, arguments=TOOL_ARGUMENTS)
        message.tool_calls = [_ToolCall(id="call_mock_0", type="function", function=call)]
    whole = _Body("chatcmpl-mock", "chat.completion", created, model, [_Choice(0, message, finish)])
    tool_tokens = opts.tokens_per_chunk if opts.tool_call is not None else 0
    reasoning_tokens = len(reasoning) * opts.tokens_per_chunk
    completion = len(content) * opts.tokens_per_chunk + reasoning_tokens + tool_tokens
    return _plan_of(frames, whole, completion, reasoning_tokens)


def _text_plan(opts: ScriptedOptions, created: int, model: str, logprobs: int | None, echo: str | None) -> Plan:
    """A text completion: one chunk per `tokens_per_chunk` words, then the finish chunk; with `echo`
    the prompt comes first (one token without a probability, like OpenAI's first prompt token);
    with `logprobs`, the k-th word has -(k % 7 + 1) / 10 and `logprobs - 1` made-up alternatives."""
    per_chunk = opts.tokens_per_chunk
    tokens = _tokens(opts.text, opts.chunks * per_chunk)
    groups = [tokens[i * per_chunk : (i + 1) * per_chunk] for i in range(opts.chunks)]
    choices = [_TextChoice(0, "".join(group), None) for group in groups]
    whole = _TextChoice(0, "".join(tokens), "stop")
    if echo is not None:
        choices.insert(0, _TextChoice(0, echo, None))
        whole.text = echo + whole.text
    if logprobs is not None:
        offset = 0
        whole.logprobs = _TextLogprobs([], [], [], [])
        if echo is not None:
            choices[0].logprobs = _TextLogprobs([echo], [None], [None], [0])
            offset = len(echo)
        for index, group in enumerate(groups):
            floats = [-((index * per_chunk + j) % 7 + 1) / 10 for j in range(len(group))]
            values: list[float | None] = list(floats)
            pairs = zip(group, floats, strict=True)
            tops: list[dict[str, float] | None] = [_alternatives(token, value, logprobs) for token, value in pairs]
            offsets = [offset + len("".join(group[:j])) for j in range(len(group))]
            offset += len("".join(group))
            choices[index + (echo is not None)].logprobs = _TextLogprobs(group, values, tops, offsets)
        for choice in choices:
            assert not isinstance(choice.logprobs, UnsetType)
            whole.logprobs.tokens += choice.logprobs.tokens
            whole.logprobs.token_logprobs += choice.logprobs.token_logprobs
            whole.logprobs.top_logprobs += choice.logprobs.top_logprobs
            whole.logprobs.text_offset += choice.logprobs.text_offset
    head = _Body("cmpl-mock", "text_completion", created, model, [])
    frames = [_sse(msgspec.structs.replace(head, choices=[choice])) for choice in choices]
    frames.append(_sse(msgspec.structs.replace(head, choices=[_TextChoice(0, "", "stop")])))
    return _plan_of(frames, msgspec.structs.replace(head, choices=[whole]), len(tokens), 0)


def _alternatives(token: str, value: float, count: int) -> dict[str, float]:
    top = {token: value} if count else {}
    for j in range(1, count):
        top[f"{token.strip()}~{j}"] = round(value - j, 4)
    return top


def _plan_of(frames: list[bytes], whole: _Body, completion: int, reasoning: int) -> Plan:
    encoded = msgspec.json.encode(msgspec.structs.replace(whole, usage=_SENTINEL))
    head, tail = encoded.split(msgspec.json.encode(_SENTINEL))
    return Plan(frames, b"".join(frames), head, tail, completion, reasoning)
