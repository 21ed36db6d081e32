"""OpenAI chat wire format: the pure request builder and the pure answer → events parser.

Every kind of provider speaks this dialect, so this is the one place that knows it:
`build_chat_body` turns a `CompletionRequest` into a `/chat/completions` body, and
`ChatStreamParser` / `parse_chat_response` turn what comes back, streamed or whole, into the same
`providers.events` sequence, so the app has one fold path.

Wire quirks resolved here (see providers.md):
- reasoning text arrives as `delta.reasoning` (vLLM, Ollama) or `delta.reasoning_content`
  (SGLang, llama.cpp); both are read;
- tool-call deltas are matched by `id` first, then `index`: `id`/`name` are set once (llama.cpp
  repeats them in every delta), parallel calls may all claim `index: 0` and differ only by `id`,
  and a delta with a new `id` but no name continues the call at its index (a server that invents a
  fresh id per delta);
- `ToolCallStart` waits until the name is known (a call still without an id then gets
  `call_<key>`); argument fragments seen before are buffered and sent as one `ToolCallArgs`;
- usage may come on any chunk (the last report wins) and is yielded once, at the end, followed by
  `Finish`; the end is `[DONE]` or EOF after a `finish_reason` (`transformers serve` sends no
  `[DONE]`); EOF before either is a truncated stream;
- `data:` payloads that are not JSON objects (keep-alives) are ignored; an `{"error": ...}`
  payload inside a 200 stream raises.

The request side (its wire Structs and the mapping from `CompletionRequest`) lives in
`openai_request.py` to keep both modules small; `build_chat_body` is re-exported here so callers
import one module for the whole dialect.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct

from providers.errors import ErrorBody, Failure, UpstreamError, classify_error_chunk
from providers.events import (
    Event,
    Finish,
    Logprobs,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallArgs,
    ToolCallStart,
    UpstreamMeta,
)
from providers.openai_request import build_chat_body
from providers.usage import OpenAIUsage, openai_report

__all__ = ["ChatStreamParser", "build_chat_body", "normalise_finish", "parse_chat_response"]

_FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "max_tokens": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}


def normalise_finish(reason: str) -> str:
    """stop | length | tool_calls | content_filter; anything unknown (`eos`, `end_turn`) is stop."""
    return _FINISH_REASONS.get(reason, "stop")


class _Function(Struct):
    name: str | None = None
    arguments: str | dict[str, Any] | None = None  # a whole answer may carry an object (Ollama)


class _ToolCallDelta(Struct):
    index: int | None = None
    id: str | None = None
    function: _Function | None = None


class _Delta(Struct):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None


class _ChoiceLogprobs(Struct):
    content: list[TokenLogprob] | None = None


class _Choice(Struct):
    index: int = 0
    delta: _Delta | None = None
    message: _Delta | None = None  # non-streamed answers
    finish_reason: str | None = None
    logprobs: _ChoiceLogprobs | None = None


class _Chunk(Struct):
    """One streamed chunk or one whole answer; also the shapes of an error inside a 200."""

    id: str | None = None
    object: str | None = None
    choices: list[_Choice] | None = None
    usage: OpenAIUsage | None = None
    error: ErrorBody | str | None = None
    message: str | None = None
    type: str | None = None
    code: int | str | None = None


_chunk_decoder = msgspec.json.Decoder(_Chunk, strict=False)


class _Call:
    __slots__ = ("fragments", "id", "index", "key", "name", "started")

    def __init__(self, key: int, index: int | None, call_id: str | None) -> None:
        self.key = key
        self.index = index
        self.id = call_id
        self.name: str | None = None
        self.started = False
        self.fragments: list[str] = []


class ChatStreamParser:
    """Feed it the `data` payloads of one `/chat/completions` stream; it returns events."""

    __slots__ = ("_by_id", "_calls", "_closed", "_done", "_finish", "_first", "_usage")

    def __init__(self) -> None:
        self._calls: list[_Call] = []
        self._by_id: dict[str, _Call] = {}
        self._usage: OpenAIUsage | None = None
        self._finish: str | None = None
        self._first = True
        self._done = False
        self._closed = False

    @property
    def done(self) -> bool:
        """`[DONE]` was seen, or a chunk carried a finish reason: EOF now is a clean end."""
        return self._done or self._finish is not None

    def feed(self, payload: str | bytes) -> list[Event]:
        """The events of one `data` payload; `[DONE]` yields the closing events."""
        if payload == "[DONE]" or payload == b"[DONE]":
            self._done = True
            return self.finish()
        if payload[:1] not in ("{", b"{"):
            stripped = payload.strip()
            if stripped[:1] not in ("{", b"{"):
                return []  # keep-alive text, empty data
            payload = stripped
        try:
            chunk = _chunk_decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise UpstreamError(Failure.TRANSIENT, "upstream sent a malformed chunk", status=502) from None
        return self._apply(chunk)

    def _apply(self, chunk: _Chunk) -> list[Event]:
        _raise_error(chunk)
        events: list[Event] = []
        if self._first:
            self._first = False
            if chunk.id:
                events.append(UpstreamMeta(upstream_request_id=chunk.id))
        if chunk.usage is not None:
            self._usage = chunk.usage
        if chunk.choices:
            choice = chunk.choices[0]
            delta = choice.delta if choice.delta is not None else choice.message
            if delta is not None:
                self._delta(delta, events)
            if choice.logprobs is not None and choice.logprobs.content:
                events.append(Logprobs(choice.logprobs.content))
            if choice.finish_reason:
                self._finish = normalise_finish(choice.finish_reason)
        return events

    def finish(self) -> list[Event]:
        """The closing events at the end of the stream; raises if it was truncated."""
        if self._closed:
            return []
        if not self.done:
            raise UpstreamError(Failure.TRANSIENT, "upstream stream ended before a finish reason", status=502)
        self._closed = True
        events: list[Event] = []
        for call in self._calls:
            if not call.started:
                self._start(call, events, force=True)
        if self._usage is not None:
            events.append(openai_report(self._usage))
        reason = self._finish or "stop"
        if reason == "stop" and self._calls:
            reason = "tool_calls"
        events.append(Finish(reason=reason))
        return events

    def _delta(self, delta: _Delta, events: list[Event]) -> None:
        reasoning = delta.reasoning or delta.reasoning_content
        if reasoning:
            events.append(ReasoningDelta(text=reasoning))
        if delta.content:
            events.append(TextDelta(text=delta.content))
        if delta.tool_calls:
            for position, tool_delta in enumerate(delta.tool_calls):
                self._tool_delta(tool_delta, position, events)

    def _tool_delta(self, delta: _ToolCallDelta, position: int, events: list[Event]) -> None:
        call = self._call_for(delta, position)
        function = delta.function
        if function is not None:
            if call.name is None and function.name:
                call.name = function.name
            arguments = function.arguments
            if isinstance(arguments, dict):
                arguments = msgspec.json.encode(arguments).decode()
            if arguments:
                if call.started:
                    events.append(ToolCallArgs(key=call.key, fragment=arguments))
                else:
                    call.fragments.append(arguments)
        if not call.started and call.name is not None:
            self._start(call, events, force=False)

    def _call_for(self, delta: _ToolCallDelta, position: int) -> _Call:
        if delta.id is not None and delta.id in self._by_id:
            return self._by_id[delta.id]
        index = delta.index if delta.index is not None else position
        latest = self._latest_at(index)
        if latest is not None and _continues(latest, delta):
            if latest.id is None and delta.id is not None:
                latest.id = delta.id
                self._by_id[delta.id] = latest
            return latest
        call = _Call(len(self._calls), index, delta.id)
        self._calls.append(call)
        if delta.id is not None:
            self._by_id[delta.id] = call
        return call

    def _latest_at(self, index: int) -> _Call | None:
        for call in reversed(self._calls):
            if call.index == index:
                return call
        return None

    def _start(self, call: _Call, events: list[Event], *, force: bool) -> None:
        if call.id is None:
            if not force and call.name is None:
                return
            call.id = f"call_{call.key}"
        call.started = True
        events.append(ToolCallStart(key=call.key, id=call.id, name=call.name or ""))
        if call.fragments:
            events.append(ToolCallArgs(key=call.key, fragment="".join(call.fragments)))
            call.fragments = []


def _continues(latest: _Call, delta: _ToolCallDelta) -> bool:
    """Does a delta at `latest`'s index (whose id, if any, is new) continue that call? A new
    parallel call comes with its name; a fresh id without a name is a server inventing ids."""
    if delta.id is None or (latest.name is None and latest.id is None):
        return True
    return delta.function is None or not delta.function.name


def _raise_error(chunk: _Chunk) -> None:
    error = chunk.error
    if error is None and chunk.object != "error":
        return
    if isinstance(error, ErrorBody):
        raise classify_error_chunk(error)
    message = error if isinstance(error, str) else chunk.message
    raise classify_error_chunk(ErrorBody(message=message, type=chunk.type, code=chunk.code))


def parse_chat_response(body: bytes) -> list[Event]:
    """The events of a whole (non-streamed) answer: what its stream would have yielded."""
    try:
        answer = _chunk_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise UpstreamError(Failure.TRANSIENT, "upstream sent a malformed answer", status=502) from None
    if not answer.choices and answer.error is None and answer.object != "error":
        raise UpstreamError(Failure.TRANSIENT, "upstream answer has no choices", status=502)
    parser = ChatStreamParser()
    events = parser._apply(answer)
    parser._done = True  # a whole answer is complete even without a finish_reason
    return events + parser.finish()
