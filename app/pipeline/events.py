"""What the pipeline yields: canonical events, then one `Outcome`. No wire format here.

Every ingress renders this one vocabulary (the native `stream_event` frames, OpenAI chunks,
Anthropic events); a non-streaming response is rendered from the `Outcome` alone.

    Started                     the answer is committed to a backend (its first content arrived)
    TextStart(index)            a text block opens; `index` counts text blocks from 0
    TextDelta(text)             text for the open text block   (providers.events.TextDelta)
    RefusalDelta(text)          the model's refusal, for the open text block: text to every door
                                but OpenAI Chat's, which sends its `refusal` (providers.events)
    TextEnd(index, text)        the block closes; `text` is the whole block
    ReasoningStart              a reasoning block opens
    ReasoningDelta(text)        reasoning for the open block   (providers.events.ReasoningDelta)
    ReasoningEnd(text)          the block closes
    ToolCallStart(index, id, name)          a tool call opens; `index` counts calls from 0
    ToolCallDelta(index, id, name, fragment)   a fragment of its JSON arguments
    ToolCallEnd(index, call)    the call closes with its arguments parsed (after every other block)
    Logprobs(tokens)            log probabilities of the deltas before it (only when asked for)
    Outcome                     the last event: status, message, usage, cost, error

Blocks never overlap: text and reasoning blocks close when another kind of content starts; tool
calls stay open until the answer ends and close in order. The deltas are the adapters' own event
objects, passed through without a copy (the per-chunk path allocates nothing here).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from msgspec import Struct

from app.errors import GatewayError
from catalog.records import CostSource, LedgerStatus
from providers.events import Logprobs as Logprobs
from providers.events import ReasoningDelta as ReasoningDelta
from providers.events import RefusalDelta as RefusalDelta
from providers.events import TextDelta as TextDelta
from providers.events import TokenLogprob, Usage
from providers.types import Message, TextPart, ToolCallData

StopReason = Literal["end_turn", "max_tokens", "tool_calls", "content_filter"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]

STOP_REASONS: dict[str, StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_calls",
    "content_filter": "content_filter",
}


RateHeaders = bytes
"""An API key's `x-ratelimit-*` headers as the response head carries them (`app.access.gate`):
`name: value` lines joined by CRLF, without the last line's end; b"" for none. Made in one format
per request and written into the head as they are (`app.edge.cycle.write_head`)."""


def header_pairs(block: RateHeaders) -> list[tuple[bytes, bytes]]:
    """`block` as ASGI's (name, value) pairs, for a head not written by `write_head` and for an
    error's `extra_headers`."""
    if not block:
        return []
    return [(name, value) for name, _, value in (line.partition(b": ") for line in block.split(b"\r\n"))]


def header_texts(block: RateHeaders) -> dict[str, str]:
    """`block` as a `GatewayError.extra_headers` mapping."""
    return {name.decode(): value.decode() for name, value in header_pairs(block)}


class StreamHead:
    """What a stream's response head may need before its first event, set by the pipeline once
    the request is admitted (`Pipeline.stream`): the model (None until then) and an API key's
    `x-ratelimit-*`. The relay reads it when the response starts, which is before `Started` when
    a keep-alive must go out first (an upstream slow to answer). No keep-alive starts the response
    before admission: the head carries the key's headers, and a refusal is still an HTTP error."""

    __slots__ = ("headers", "model")

    def __init__(self) -> None:
        self.model: str | None = None
        self.headers: RateHeaders = b""


class Started(Struct, frozen=True):
    model: str
    provider: str


class TextStart(Struct, frozen=True):
    index: int


class TextEnd(Struct, frozen=True):
    index: int
    text: str


class ReasoningStart(Struct, frozen=True):
    pass


class ReasoningEnd(Struct, frozen=True):
    text: str


class ToolCallStart(Struct, frozen=True):
    index: int
    id: str
    name: str


class ToolCallDelta(Struct, frozen=True):
    index: int
    id: str
    name: str
    fragment: str


class ToolCallEnd(Struct, frozen=True):
    index: int
    call: ToolCallData  # `arguments` parsed ({} when not JSON), `raw_arguments` the whole string


class Cost(Struct, frozen=True):
    """A request's cost, computed once (`app.pipeline.accounting.price`).

    `usd` is what the response and the ledger say: the upstream's billed cost when it reported
    one (`authoritative`), else the catalog estimate (`estimated`), else None (unpriced).
    `estimate_usd` is the catalog estimate, kept beside an authoritative cost."""

    usd: Decimal | None = None
    source: CostSource | None = None
    estimate_usd: Decimal | None = None
    price_id: int | None = None


UNPRICED = Cost()


class Outcome(Struct):
    """How one request ended. `usage` None means unknown (the upstream reported none and nothing
    could be counted); `usage_estimated` marks buckets the gateway counted itself (a cancelled
    stream: the prompt's estimate and the deltas relayed). Made by position (`Pipeline._outcome`,
    `catalog.records.POSITIONAL`): the fields' order is part of its contract."""

    status: LedgerStatus
    finished: float  # `time.perf_counter()`
    attempts: int = 0
    model: str | None = None
    provider: str | None = None
    upstream_model: str | None = None
    upstream_request_id: str | None = None
    message: Message | None = None
    refusals: tuple[TextPart, ...] = ()  # the message's text parts that are the model's refusal
    finish_reason: FinishReason | None = None
    stop_sequence: str | None = None  # the stop string that ended a `stop`, when the upstream named it
    logprobs: list[TokenLogprob] | None = None  # when the request asked and the upstream gave them
    usage: Usage | None = None
    usage_estimated: bool = False
    cost: Cost = UNPRICED
    error: GatewayError | None = None
    first_content: float | None = None  # `time.perf_counter()` of the first content event
    headers: RateHeaders = b""  # the API key's `x-ratelimit-*` (app.access.gate)

    @property
    def stop_reason(self) -> StopReason | None:
        return STOP_REASONS[self.finish_reason] if self.finish_reason is not None else None


Event = (
    Started
    | TextStart
    | TextDelta
    | RefusalDelta
    | TextEnd
    | ReasoningStart
    | ReasoningDelta
    | ReasoningEnd
    | ToolCallStart
    | ToolCallDelta
    | ToolCallEnd
    | Logprobs
    | Outcome
)
