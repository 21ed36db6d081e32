"""What every OpenAI-style answer shares, chat (`/chat/completions`) or text (`/completions`).

`OpenAIStreamParser` is the skeleton both dialects' parsers fill in (`ChatStreamParser` in
`openai_chat.py`, `TextStreamParser` in `openai_text.py`): it owns the rules of a stream that do
not depend on what a choice carries, so they are written once:
- a `data` payload that is not a JSON object (a keep-alive, empty data) is ignored; `[DONE]` ends
  the stream; a payload that does not decode (nested too deep included) is a malformed answer
  (502, try the next backend);
- an `{"error": ...}` payload inside a 200 (or vLLM's flat `{"object": "error", ...}`) raises,
  classified by its structured fields (`raise_error_chunk`);
- the first chunk's `id` becomes `UpstreamMeta`;
- usage may come on any chunk (the last report wins; a `usage` without both totals is no report,
  `providers.usage.counts_tokens`) and is yielded once, at the end, followed by
  `Finish`; the end is `[DONE]` or EOF after a `finish_reason` (`transformers serve` sends no
  `[DONE]`); EOF before either is a truncated stream;
- a whole (non-streamed) answer is parsed as a stream of one chunk that is complete even without
  a finish reason (`parse_whole`);
- the stop string an answer met is kept when the upstream names it (the chat dialect: vLLM's
  `stop_reason` or SGLang's `matched_stop` beside `finish_reason: "stop"`; a token id there is not a
  sequence). Only the Anthropic door reports it, and it never takes a text request;
- a string with a lone UTF-16 surrogate escape (`"\\ud83d"`, which msgspec refuses: a server that
  slices text by UTF-16 code units can split an emoji's pair between two chunks) is decoded by the
  stdlib instead, on that error path only (so is a whole answer with bytes that are no UTF-8,
  read as U+FFFD as its stream would be, or with a byte-order mark: `providers.lenient_json`);
  from then on the parser joins a high surrogate ending a text, reasoning or tool-argument delta
  with the low one starting the next delta of the same channel, and any surrogate still alone
  (and one in another field) becomes U+FFFD (`_mend`);
- the finish reason `tool_calls` is kept only when calls were returned (a server whose tool-call
  parser failed says `tool_calls` over plain text: that answer stopped, `stop`); vLLM's `abort`
  (the engine gave the request up) and OpenRouter's `error` (its provider failed mid-answer) are a
  failure, 502, never a clean finish of a truncated answer. The failure is raised at the end of
  the stream, not at that chunk: the usage chunk that follows is read first (content and errors
  after it are not), so the tokens the upstream billed reach the ledger (`unreported`); the
  adapter waits `FAILED_GRACE_S` at most for that end (`providers.adapter`).

A dialect subclasses it with its chunk Struct (a `ChunkBase` with `choices`), its decoder, and
`_choice` (the events of one chunk's first choice); `_closing` and `_final_reason` are the hooks
the chat dialect needs for tool calls.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import msgspec
from msgspec import Struct

from providers.errors import ErrorBody, Failure, UpstreamError, classify_error_chunk
from providers.events import Event, Finish, ReasoningDelta, RefusalDelta, TextDelta, ToolCallArgs, UpstreamMeta
from providers.lenient_json import lenient_json, paired, scrubbed
from providers.usage import OpenAIUsage, counts_tokens, openai_report

_FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "max_tokens": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}


_FAILED_FINISHES = {
    "abort": "upstream aborted the request",  # vLLM: the engine gave it up; what came is truncated
    "error": "upstream ended its answer with an error",  # OpenRouter: its provider failed mid-answer
}


def normalise_finish(reason: str) -> str:
    """stop | length | tool_calls | content_filter; anything unknown (`eos`, `end_turn`) is stop."""
    return _FINISH_REASONS.get(reason, "stop")


class ChunkBase(Struct):
    """The fields of a chunk (or a whole answer) that every dialect reads, including the shapes of
    an error inside a 200. A dialect's chunk narrows `choices` to its own choice Struct."""

    id: str | None = None
    choices: list[Any] | None = None
    object: str | None = None
    usage: OpenAIUsage | None = None
    error: ErrorBody | str | None = None
    message: str | None = None
    type: str | None = None
    code: int | str | None = None


ChunkT = TypeVar("ChunkT", bound=ChunkBase)
# What decoding an upstream's JSON raises for JSON it cannot take: msgspec raises RecursionError
# for nesting deeper than it goes (`[[[…]]]` a thousand deep), which was a 500, a bug's answer.
_UNREADABLE = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)
# An upstream's request id as upstreams write one (`chatcmpl-…`, `gen-…`, `cmpl-…`, a UUID): it is
# logged and stored (`upstream_request_id`), so never prose, nor the upstream's echo of the request.
_UPSTREAM_ID = re.compile(r"[A-Za-z0-9_.:/+=|~@#-]+")  # no space, quote or brace: no prose, no JSON
SECRET_MIN = 8  # a key shorter than this (a local server's "x") is no secret worth an id dropped


def upstream_id(value: str | None, secret: str | None = None) -> str | None:
    """`value` when it reads as a request id (and does not hold `secret`, the provider's key); else
    None. Without NUL and cut to the column's 300 characters, as `catalog.records.storable_id` keeps it."""
    if not value:
        return None
    value = value.replace("\x00", "")[:300]
    if not _UPSTREAM_ID.fullmatch(value) or (secret and len(secret) >= SECRET_MIN and secret in value):
        return None
    return value


def raise_error_chunk(chunk: ChunkBase) -> None:
    """Raise the classified `UpstreamError` when `chunk` is an error; nothing otherwise."""
    error = chunk.error
    if error is None and chunk.object != "error":
        return
    if isinstance(error, ErrorBody):
        raise classify_error_chunk(error)
    message = error if isinstance(error, str) else chunk.message
    raise classify_error_chunk(ErrorBody(message=message, type=chunk.type, code=chunk.code))


class OpenAIStreamParser(ABC, Generic[ChunkT]):
    """Feed it the `data` payloads of one stream; it returns events (module doc)."""

    __slots__ = (
        "_closed",
        "_done",
        "_failed",
        "_finish",
        "_first",
        "_held",
        "_matched",
        "_secret",
        "_upstream_id",
        "_usage",
    )
    decoder: ClassVar[msgspec.json.Decoder[Any]]

    def __init__(self, secret: str | None = None) -> None:
        """`secret`: the provider's key; an upstream id holding it is no id (`upstream_id`)."""
        self._usage: OpenAIUsage | None = None
        self._finish: str | None = None
        self._failed: str | None = None  # why the answer ended in failure (`abort`, `error`): raised at the end
        self._matched: str | None = None  # the stop string the upstream says it met (vLLM, SGLang)
        self._first = True
        self._upstream_id: str | None = None  # a whole answer's `id`, for `unreported`
        self._done = False
        self._closed = False
        self._held: dict[Any, str] | None = None  # once a lone surrogate came: the halves held (`_mend`)
        self._secret = secret

    @property
    def done(self) -> bool:
        """`[DONE]` was seen, or a chunk carried a finish reason: EOF now is a clean end."""
        return self._done or self._finish is not None or self._failed is not None

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
            chunk: ChunkT = self.decoder.decode(payload)
        except _UNREADABLE:
            if self._failed is not None:
                return []  # after a failed finish: what cannot be read changes nothing
            chunk = self._without_usage(payload, "upstream sent a malformed chunk")
        events = self.apply(chunk)
        return events if self._held is None else self._mend(events)

    def _without_usage(self, data: str | bytes, malformed: str) -> ChunkT:
        """A chunk or answer the decoder refused, decoded again with its `usage` left out: a usage
        report of the wrong shape (a count that is a word, a list) is no report — the usage stays
        unknown (providers.md), the content is kept. Anything else wrong is `malformed` (502).
        The error path only: a valid chunk never comes here."""
        refused = UpstreamError(Failure.TRANSIENT, malformed, status=502)
        try:
            value = msgspec.json.decode(data)
        except RecursionError:  # nested deeper than any decoder goes: no answer of anyone's
            raise refused from None
        except msgspec.DecodeError:
            value = lenient_json(data)
            if value is None:
                raise refused from None
            if self._held is None:
                self._held = {}
            try:
                converted: ChunkT = msgspec.convert(value, self.decoder.type, strict=False)
                return converted
            except msgspec.ValidationError:
                pass  # a usage of the wrong shape too, maybe: as below
        if not isinstance(value, dict) or value.pop("usage", None) is None:
            raise refused
        try:
            chunk: ChunkT = msgspec.convert(value, self.decoder.type, strict=False)
        except msgspec.ValidationError:
            raise refused from None
        return chunk

    @property
    def failed(self) -> bool:
        """The answer ended in failure (`abort`, `error`); only its usage is still read."""
        return self._failed is not None

    def apply(self, chunk: ChunkT) -> list[Event]:
        if self._failed is not None:  # after a failed finish only its usage is read: not an error, not content
            if chunk.usage is not None and counts_tokens(chunk.usage):
                self._usage = chunk.usage
            return []
        if chunk.error is not None or chunk.object == "error":  # checked here: this runs per chunk
            raise_error_chunk(chunk)
        events: list[Event] = []
        if self._first:
            self._first = False
            found = upstream_id(chunk.id, self._secret)
            if found is not None:
                events.append(UpstreamMeta(upstream_request_id=found))
        if chunk.usage is not None and counts_tokens(chunk.usage):
            self._usage = chunk.usage
        reason = self._choice(chunk, events)
        if reason:
            if reason in _FAILED_FINISHES:
                self._failed = reason
            else:
                self._finish = normalise_finish(reason)
        return events

    def _mend(self, events: list[Event]) -> list[Event]:
        """`events` with surrogate halves joined across deltas of one channel (text, reasoning, a
        tool call's arguments): a high one ending a delta waits for the next; the rest, and any
        surrogate in another event, `_paired` (module doc). Only once a lone surrogate has come."""
        held = self._held
        assert held is not None
        mended: list[Event] = []
        for event in events:
            if isinstance(event, TextDelta | ReasoningDelta | RefusalDelta | ToolCallArgs):
                channel = event.key if isinstance(event, ToolCallArgs) else type(event)
                text = held.pop(channel, "") + (event.fragment if isinstance(event, ToolCallArgs) else event.text)
                if text and "\ud800" <= text[-1] <= "\udbff":
                    held[channel], text = text[-1], text[:-1]
                if text:
                    mended.append(_delta(channel, paired(text)))
            else:
                try:
                    msgspec.json.encode(event)
                except UnicodeEncodeError:  # a surrogate in a name, an id, a log-probability's token
                    event = msgspec.convert(scrubbed(msgspec.to_builtins(event)), type(event))
                mended.append(event)
        return mended

    @abstractmethod
    def _choice(self, chunk: ChunkT, events: list[Event]) -> str | None:
        """Append the events of the chunk's first choice; return its finish reason, if any (each
        dialect's parser, chat or text, defines it)."""

    def finish(self) -> list[Event]:
        """The closing events at the end of the stream; raises if it was truncated."""
        if self._closed:
            return []
        if self._failed is not None:  # its usage stays for `unreported`
            raise UpstreamError(Failure.TRANSIENT, _FAILED_FINISHES[self._failed], status=502, answered=True)
        if not self.done:
            raise UpstreamError(Failure.TRANSIENT, "upstream stream ended before a finish reason", status=502)
        if self._first:  # `[DONE]` and nothing before it: no answer at all, as a whole one without choices
            raise UpstreamError(Failure.TRANSIENT, "upstream stream had no chunks", status=502)
        self._closed = True
        events = self._closing()
        if self._held is not None:
            events = self._mend(events)
            events += [_delta(channel, "\ufffd") for channel in self._held]  # halves never completed
            self._held.clear()
        if self._usage is not None:
            events.append(openai_report(self._usage))
        reason = self._final_reason(self._finish or "stop")
        matched = self._matched if reason == "stop" else None  # an upstream's string: a lone surrogate, maybe
        events.append(Finish(reason=reason, stop_sequence=None if matched is None else paired(matched)))
        return events

    def unreported(self) -> list[Event]:
        """The usage the upstream reported that no event carries yet (a stream that fails after its
        usage chunk: those tokens were billed, so the ledger records them)."""
        if self._usage is None or self._closed:
            return []
        self._closed = True
        report: list[Event] = [openai_report(self._usage)]
        if self._upstream_id is not None:  # a whole answer's events never went out: the id it billed under
            report.insert(0, UpstreamMeta(upstream_request_id=self._upstream_id))
        return report

    def _closing(self) -> list[Event]:
        """Events the dialect still owes at the end (before usage and `Finish`)."""
        return []

    def _final_reason(self, reason: str) -> str:
        """The `Finish` reason of a normalised one: `tool_calls` only when calls were returned
        (ingress.md), and a text answer returns none."""
        return "stop" if reason == "tool_calls" else reason

    def parse_whole(self, body: bytes) -> list[Event]:
        """The events of a whole (non-streamed) answer: what its stream would have yielded."""
        try:
            answer: ChunkT = self.decoder.decode(body)
        except _UNREADABLE:
            answer = self._without_usage(body, "upstream sent a malformed answer")
        if not answer.choices and answer.error is None and answer.object != "error":
            raise UpstreamError(Failure.TRANSIENT, "upstream answer has no choices", status=502)
        self._upstream_id = upstream_id(
            answer.id, self._secret
        )  # for `unreported`: these events never go out if it fails
        events = self.apply(answer) if self._held is None else self._mend(self.apply(answer))
        self._done = True  # a whole answer is complete even without a finish_reason
        return events + self.finish()


def _delta(channel: Any, text: str) -> Event:
    """The delta event of a `_mend` channel: a tool call's key, or the text or reasoning class."""
    if isinstance(channel, int):
        return ToolCallArgs(key=channel, fragment=text)
    delta: Event = channel(text=text)
    return delta


class _Indexed(Protocol):
    index: int


_Choice = TypeVar("_Choice", bound=_Indexed)


def answer_choice(choices: list[_Choice]) -> _Choice | None:
    """Choice 0, the answer (a whole answer's is choice 0 too): a second choice a misbehaving
    upstream streams is not merged into it. One attribute test per chunk in the usual case."""
    choice = choices[0]
    if choice.index:
        return next((other for other in choices if other.index == 0), None)
    return choice


def matched_stop(stop_reason: str | int | None, matched: str | int | None) -> str | None:
    """The stop string an upstream says its answer met: vLLM's `stop_reason`, else SGLang's
    `matched_stop` (a token id in either is no stop sequence)."""
    value = stop_reason if stop_reason is not None else matched
    return value if isinstance(value, str) else None
