"""OpenAI chat wire format: the pure request builder and the pure answer → events parser.

Every kind of provider speaks this dialect, so this is the one place that knows it:
`build_chat_body` turns a `CompletionRequest` into a `/chat/completions` body, and
`ChatStreamParser` turns what comes back, streamed or whole (`parse_whole`), into the same
`providers.events` sequence, so the app has one fold path.

Wire quirks resolved here (see providers.md):
- reasoning text arrives as `delta.reasoning` (vLLM, Ollama) or `delta.reasoning_content`
  (SGLang, llama.cpp); both are read; `content` may be a list of parts (Mistral: `text` parts,
  and `thinking` parts whose text is reasoning);
- tool-call deltas are matched by `id` first, then `index`: `id`/`name` are set once (llama.cpp
  repeats them in every delta), parallel calls may all claim `index: 0` and differ only by `id`,
  and a delta with a new `id` but no name continues the call at its index (a server that invents a
  fresh id per delta); a delta naming a function at a known id and index starts a new call after a
  finish reason (the calls before it are closed) or when it begins a JSON value where the call's
  arguments are a whole one already: `transformers serve` sends every call at index 0 under one
  id (whole, or name first and then arguments, each call closed by `finish_reason: "tool_calls"`);
- `ToolCallStart` waits until the name is known (a call still without an id then gets `call_`
  and 24 random hex digits, unique across answers as OpenAI's and Anthropic's ids are: an agent's
  history holds many answers' calls; one whose id an earlier call has gets `<id>_<key>`); argument
  fragments seen before are buffered and sent as one `ToolCallArgs`;
- a call never named by the end of the stream is still started (its arguments kept), and `stop`
  with calls returned reads as `tool_calls`.

What any OpenAI-style stream shares with the text dialect (`[DONE]` and EOF, keep-alives, errors
inside a 200, usage on any chunk, whole answers) is `providers.openai_stream.OpenAIStreamParser`.

The request side (its wire Structs and the mapping from `CompletionRequest`) lives in
`openai_request.py` to keep both modules small; `build_chat_body` is re-exported here so callers
import one module for the whole dialect.
"""

from __future__ import annotations

import secrets
from typing import Any

import msgspec
from msgspec import Struct

from providers.events import (
    Event,
    Logprobs,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    TokenLogprob,
    ToolCallArgs,
    ToolCallStart,
)
from providers.openai_request import build_chat_body
from providers.openai_stream import ChunkBase, OpenAIStreamParser, answer_choice, matched_stop, normalise_finish

__all__ = ["ChatStreamParser", "build_chat_body", "normalise_finish"]


class _Function(Struct):
    name: str | None = None
    arguments: str | dict[str, Any] | None = None  # a whole answer may carry an object (Ollama)


class _ToolCallDelta(Struct):
    index: int | None = None
    id: str | None = None
    function: _Function | None = None


class _Part(Struct):
    """A part of a `content` given as a list (Mistral): `text`, or `thinking` (its reasoning, as
    text parts); other kinds of parts carry nothing to relay."""

    type: str = "text"
    text: str | None = None
    thinking: str | list[_Part] | None = None


class _Delta(Struct):
    content: str | list[_Part] | None = None
    refusal: str | None = None  # OpenAI: the model declined (structured outputs); text, streamed too
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
    stop_reason: str | int | None = None  # vLLM: the stop string (or token id) met
    matched_stop: str | int | None = None  # SGLang: the same


class _Chunk(ChunkBase):
    """One streamed chunk or one whole answer (`ChunkBase`: id, usage, an error inside a 200)."""

    choices: list[_Choice] | None = None


class _Call:
    __slots__ = ("fragments", "id", "index", "key", "name", "started", "text")

    def __init__(self, key: int, index: int | None, call_id: str | None) -> None:
        self.key = key
        self.index = index
        self.id = call_id
        self.name: str | None = None
        self.started = False
        self.fragments: list[str] = []  # the arguments until the call starts
        self.text: list[str] = []  # all its arguments (`ChatStreamParser._another`)


class ChatStreamParser(OpenAIStreamParser[_Chunk]):
    """Feed it the `data` payloads of one `/chat/completions` stream; it returns events."""

    __slots__ = ("_by_id", "_calls", "_closed_calls", "_ids", "_refused")
    decoder = msgspec.json.Decoder(_Chunk, strict=False)

    def __init__(self, secret: str | None = None) -> None:
        super().__init__(secret)
        self._calls: list[_Call] = []
        self._by_id: dict[str, _Call] = {}
        self._ids: set[str] = set()  # the ids the calls were started with: one each
        self._closed_calls = 0  # the calls a finish reason came after: a new name starts a new call
        self._refused = False

    def _choice(self, chunk: _Chunk, events: list[Event]) -> str | None:
        if not chunk.choices:
            return None
        choice = answer_choice(chunk.choices)
        if choice is None:
            return None
        delta = choice.delta if choice.delta is not None else choice.message
        if delta is not None:
            self._delta(delta, events)
        if choice.logprobs is not None and choice.logprobs.content:
            events.append(Logprobs(choice.logprobs.content))
        if choice.finish_reason:  # `""` is none (`apply`): SGLang 0.4 and Ollama sent it on every chunk
            self._matched = matched_stop(choice.stop_reason, choice.matched_stop)
            self._closed_calls = len(self._calls)
        return choice.finish_reason

    def _closing(self) -> list[Event]:
        events: list[Event] = []
        for call in self._calls:
            if not call.started:
                self._start(call, events, force=True)
        return events

    def _final_reason(self, reason: str) -> str:
        if self._calls:
            return "tool_calls" if reason == "stop" else reason
        if self._refused and reason == "stop":  # the answer is a refusal: no clean `stop`
            return "content_filter"
        return "stop" if reason == "tool_calls" else reason

    def _delta(self, delta: _Delta, events: list[Event]) -> None:
        reasoning = delta.reasoning or delta.reasoning_content
        if reasoning:
            events.append(ReasoningDelta(text=reasoning))
        content = delta.content
        if content:
            if isinstance(content, str):
                events.append(TextDelta(text=content))
            else:
                _parts(content, events)
        if delta.refusal:  # the client reads why; the finish is `content_filter` (OpenAI Chat's door: `stop`)
            self._refused = True
            events.append(RefusalDelta(text=delta.refusal))
        if delta.tool_calls:
            seen: list[_Call] = []  # the calls this list has named already
            for position, tool_delta in enumerate(delta.tool_calls):
                self._tool_delta(tool_delta, position, events, seen)

    def _tool_delta(self, delta: _ToolCallDelta, position: int, events: list[Event], seen: list[_Call]) -> None:
        call = self._call_for(delta, position, seen)
        seen.append(call)
        function = delta.function
        if function is not None:
            if call.name is None and function.name:
                call.name = function.name
            arguments = function.arguments
            if isinstance(arguments, dict):
                arguments = msgspec.json.encode(arguments).decode()
            if arguments:
                call.text.append(arguments)
                if call.started:
                    events.append(ToolCallArgs(key=call.key, fragment=arguments))
                else:
                    call.fragments.append(arguments)
        if not call.started and call.name is not None:
            self._start(call, events, force=False)

    def _call_for(self, delta: _ToolCallDelta, position: int, seen: list[_Call]) -> _Call:
        """The call `delta` belongs to: by its id (a server repeating the id in every delta), unless
        the delta says another index than that call's or its list named that call already; else
        by its index (its position in the list when it has none). So two calls a server gave one
        id — at two indexes, or two entries of one answer's list — stay two calls: merged, the
        second one's name and arguments were lost."""
        if delta.id == "":  # an empty id is no id (one is made up when the call starts)
            delta.id = None
        index = delta.index if delta.index is not None else position
        named = delta.function is not None and bool(delta.function.name)
        known = self._by_id.get(delta.id) if delta.id is not None else None
        at_index = delta.index is None or (known is not None and known.index == delta.index)
        if known is not None and known not in seen and at_index and not (named and self._another(known, delta)):
            return known
        latest = self._latest_at(index)
        if latest is not None and _continues(latest, delta) and not (named and self._another(latest, delta)):
            if latest.id is None and delta.id is not None:
                latest.id = delta.id
                self._by_id[delta.id] = latest
            return latest
        call = _Call(len(self._calls), index, delta.id)
        self._calls.append(call)
        if delta.id is not None:
            self._by_id[delta.id] = call
        return call

    def _another(self, call: _Call, delta: _ToolCallDelta) -> bool:
        """Does `delta`, which names a function, start another call than `call` (met by its id or
        index)? After a finish reason, yes; else when `call` is named, its arguments are a whole
        JSON value already and the delta's begin one (llama.cpp repeats the name in every delta of
        one call; only the first can begin an object, and then the call has no whole value yet)."""
        if call.key < self._closed_calls:
            return True
        assert delta.function is not None  # named
        arguments = delta.function.arguments
        begins = isinstance(arguments, dict) or (isinstance(arguments, str) and arguments.lstrip()[:1] == "{")
        return begins and call.name is not None and _whole_json(call.text)

    def _latest_at(self, index: int) -> _Call | None:
        for call in reversed(self._calls):
            if call.index == index:
                return call
        return None

    def _start(self, call: _Call, events: list[Event], *, force: bool) -> None:
        """Start `call` once it has a name (`force`: without). Its id is its own: a call with none
        gets a random one (module doc), and one whose id an earlier call has `<id>_<key>` (again,
        until no call has it), since a client pairs each result with its call by id (`tool_call_id`)."""
        if call.id is None:
            if not force and call.name is None:
                return
            call.id = f"call_{secrets.token_hex(12)}"
        while call.id in self._ids:  # an upstream may have sent `a_2` before `a`, `a` twice
            call.id = f"{call.id}_{call.key}"
        self._ids.add(call.id)
        call.started = True
        events.append(ToolCallStart(key=call.key, id=call.id, name=call.name or ""))
        if call.fragments:
            events.append(ToolCallArgs(key=call.key, fragment="".join(call.fragments)))
            call.fragments = []


def _parts(parts: list[_Part], events: list[Event]) -> None:
    for part in parts:
        if part.type == "thinking" and part.thinking:
            thinking = part.thinking
            text = thinking if isinstance(thinking, str) else "".join(inner.text or "" for inner in thinking)
            if text:
                events.append(ReasoningDelta(text=text))
        elif part.type == "text" and part.text:
            events.append(TextDelta(text=part.text))


def _whole_json(fragments: list[str]) -> bool:
    """Are a call's arguments a whole JSON object? Decoded only when they end as one (`}`): this
    runs for each delta of a named call that begins an object (llama.cpp names every delta), and
    decoding all the arguments each time was quadratic in their length."""
    tail = next((fragment for fragment in reversed(fragments) if not fragment.isspace()), "")
    if not tail.rstrip().endswith("}"):
        return False
    try:
        msgspec.json.decode("".join(fragments))
    except (msgspec.DecodeError, RecursionError):  # nested past msgspec's depth: no arguments to read
        return False
    return True


def _continues(latest: _Call, delta: _ToolCallDelta) -> bool:
    """Does a delta at `latest`'s index (whose id, if any, is new) continue that call? A new
    parallel call comes with its name; a fresh id without a name is a server inventing ids."""
    if delta.id is None or (latest.name is None and latest.id is None):
        return True
    return delta.function is None or not delta.function.name
