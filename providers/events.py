"""Canonical upstream events: what every adapter yields, whatever the upstream's wire format.

An adapter turns an upstream answer (an SSE stream or one JSON body) into this small, flat
vocabulary; the app's pipeline folds it into the public `stream_event` frames and the final
response. Wire quirks (repeated tool-call names, `reasoning` vs `reasoning_content`, usage on the
finish chunk, calls that all claim `index: 0`) are resolved *before* an event is yielded, so the
pipeline never sees them.

Order guarantees an adapter gives:
- `ToolCallStart(key)` precedes every `ToolCallArgs(key)`; keys are 0, 1, 2 … in order of first
  appearance, and `id`/`name` are final when `ToolCallStart` is yielded;
- at most one `Usage`, at most one `Finish`, and a stream that yields no `Finish` ends by raising
  (a truncated stream is an error, never a silent success);
- `UpstreamMeta` comes first when the upstream told us anything about the request.
"""

from __future__ import annotations

from decimal import Decimal

from msgspec import Struct

FinishReason = str  # "stop" | "length" | "tool_calls" | "content_filter"


class Usage(Struct, frozen=True):
    """Five disjoint token buckets; their sum is every token the upstream counted."""

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class UpstreamMeta(Struct, frozen=True):
    upstream_request_id: str | None = None


class TextDelta(Struct, frozen=True):
    text: str


class ReasoningDelta(Struct, frozen=True):
    text: str


class RefusalDelta(Struct, frozen=True):
    """The model's refusal (OpenAI's `refusal`, in place of content): text to every client, and
    OpenAI Chat's own `refusal` field at that door."""

    text: str


class ToolCallStart(Struct, frozen=True):
    key: int
    id: str
    name: str


class ToolCallArgs(Struct, frozen=True):
    key: int
    fragment: str


class TopLogprob(Struct, frozen=True):
    """An alternative to a sampled token; `logprob` None where the upstream gave none (SGLang
    writes a probability of zero, `-inf`, as null; vLLM's schema allows it)."""

    token: str
    logprob: float | None
    bytes: list[int] | None = None


class TokenLogprob(Struct, frozen=True):
    """One sampled token's log probability, with the most likely alternatives when asked for
    (OpenAI chat's `logprobs.content[i]` shape; `text_offset` from a legacy `/completions`, where
    `logprob` is None for a token the upstream gave no probability: the first echoed prompt token)."""

    token: str
    logprob: float | None
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = []
    text_offset: int | None = None


class Logprobs(Struct, frozen=True):
    """Log probabilities of the tokens of the deltas just before it (only when the request asked)."""

    tokens: list[TokenLogprob]


class UsageReport(Struct, frozen=True):
    usage: Usage
    cost_usd: Decimal | None = None  # authoritative cost, when the upstream reported what it billed


class Finish(Struct, frozen=True):
    reason: FinishReason
    stop_sequence: str | None = None  # the stop sequence that ended the answer, when the upstream said which


Event = (
    UpstreamMeta
    | TextDelta
    | ReasoningDelta
    | RefusalDelta
    | ToolCallStart
    | ToolCallArgs
    | Logprobs
    | UsageReport
    | Finish
)
