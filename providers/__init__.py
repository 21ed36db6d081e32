"""Upstream providers: wire formats and HTTP to the inference servers the gateway fronts.

A leaf package: it knows nothing of Litestar, SQL or the catalog. The app hands it a
`CompletionRequest` (`providers.types`) and a `ProviderConfig` (`providers.config`) and gets back
`providers.events`, or an `UpstreamError` (`providers.errors`) saying what routing should do.

    types.py           the canonical request (also the public API's wire format)
    config.py          one provider's kind, URL, key, timeouts and wire profile
    events.py          the canonical events every adapter yields
    errors.py          UpstreamError, Failure, and the classifiers for answers and exceptions
    sse.py             incremental Server-Sent Events framing
    usage.py           usage reports → five disjoint buckets; the upstream's billed cost
    openai_request.py  CompletionRequest → `/chat/completions` body
    openai_chat.py     the chat dialect: streamed chunks / whole answers → events
    adapter.py         `Provider`: one HTTP exchange, events out; `make_client`

Every provider kind (`local`, `fastrun`, `primalabs`, `openai_compatible`) is the same `Provider`
class with different configuration data.
"""

from providers.adapter import Provider, make_client
from providers.config import KIND_DEFAULTS, ProviderConfig, ProviderKind, Timeouts, WireProfile
from providers.errors import (
    MAX_RETRY_AFTER,
    Failure,
    UpstreamError,
    classify_error_chunk,
    classify_response,
    classify_transport,
)
from providers.openai_chat import ChatStreamParser, build_chat_body, parse_chat_response
from providers.sse import SSEParser
from providers.usage import AnthropicUsage, OpenAIUsage, openai_buckets, openai_cost

__all__ = [
    "KIND_DEFAULTS",
    "MAX_RETRY_AFTER",
    "AnthropicUsage",
    "ChatStreamParser",
    "Failure",
    "OpenAIUsage",
    "Provider",
    "ProviderConfig",
    "ProviderKind",
    "SSEParser",
    "Timeouts",
    "UpstreamError",
    "WireProfile",
    "build_chat_body",
    "classify_error_chunk",
    "classify_response",
    "classify_transport",
    "make_client",
    "openai_buckets",
    "openai_cost",
    "parse_chat_response",
]
