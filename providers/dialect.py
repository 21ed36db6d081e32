"""Which OpenAI-style endpoint a request goes to, and the pure pieces that speak its dialect.

A `CompletionRequest` (messages) goes to `{base_url}/chat/completions`, a `TextCompletionRequest`
(a raw prompt) to `{base_url}/completions`. Every provider kind serves both (providers.md), so the
choice depends on the request alone: `Provider.events` asks `build_body` for the dialect and the
encoded body, and takes the endpoint path and the parser (of a stream, or of a whole answer with
`parse_whole`) from the `Dialect`. Adding a dialect is an entry here, not a branch in the adapter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from providers.config import ProviderConfig
from providers.openai_chat import ChatStreamParser, build_chat_body
from providers.openai_stream import OpenAIStreamParser
from providers.openai_text import TextStreamParser, build_text_body
from providers.types import AnyRequest, CompletionRequest, TextCompletionRequest


class Dialect(NamedTuple):
    path: str  # relative to the provider's base_url
    stream_parser: Callable[[str | None], OpenAIStreamParser[Any]]  # given the provider's key


CHAT = Dialect("/chat/completions", ChatStreamParser)
TEXT = Dialect("/completions", TextStreamParser)
DIALECTS = (CHAT, TEXT)


def build_body(req: AnyRequest, upstream_model: str, cfg: ProviderConfig, *, stream: bool) -> tuple[Dialect, bytes]:
    """The dialect `req` is spoken in, and its encoded upstream body."""
    if type(req) is CompletionRequest:  # exact types (`providers.types.MEDIA_PARTS`)
        return CHAT, build_chat_body(req, upstream_model, cfg, stream=stream)
    assert isinstance(req, TextCompletionRequest)
    return TEXT, build_text_body(req, upstream_model, cfg, stream=stream)
