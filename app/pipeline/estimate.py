"""Token estimates for what an upstream did not count for us.

The gateway has no tokenizer for the models it fronts (and loading one per model would cost more
than the request), so it estimates: about four characters of text per token, the usual figure for
English prose under BPE tokenizers, plus a few tokens of framing per message. Used where nothing
better exists: the usage recorded for a cancelled stream whose upstream never reported usage
(marked `usage_estimated` in the ledger). The request-size check at admission counts the same
characters (`prompt_chars`) but divides by 8, for a lower bound (`app.pipeline.admission`).

Counted: system text, every text, thinking, tool-call argument and tool-result part, the tools'
JSON definitions and the output schema; for a raw-prompt completion, the prompt (no framing).
Media parts (image, audio, document) are not counted: their token cost depends on the model's
encoder and the gateway never fetches them.
"""

from __future__ import annotations

import msgspec

from providers.types import (
    AnyRequest,
    CompletionRequest,
    TextCompletionRequest,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
)

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD = 4  # role and separators, per message
_encode = msgspec.json.encode


def prompt_chars(request: AnyRequest) -> int:
    """Characters of everything the upstream will tokenize as input (media parts aside)."""
    if type(request) is not CompletionRequest:  # exact types (`providers.types.MEDIA_PARTS`)
        assert isinstance(request, TextCompletionRequest)  # a match: `isinstance`'s fast path
        return len(request.prompt)
    chars = len(request.system) if request.system else 0
    for message in request.messages:
        for part in message.content:
            if type(part) is TextPart:
                chars += len(part.data)
            elif type(part) is ThinkingPart:
                chars += len(part.data.text)
            elif type(part) is ToolCallPart:
                data = part.data
                chars += len(data.name) + len(data.raw_arguments or _encode(data.arguments))
            elif type(part) is ToolResultPart:
                content = part.data.content
                chars += len(content) if isinstance(content, str) else len(_encode(content))
    if request.tools:
        chars += len(_encode(request.tools))
    if request.schema is not None:
        chars += len(_encode(request.schema))
    return chars


def estimate_input_tokens(request: AnyRequest) -> int:
    chars = prompt_chars(request)
    framing = 0 if isinstance(request, TextCompletionRequest) else MESSAGE_OVERHEAD * len(request.messages)
    return -(-chars // CHARS_PER_TOKEN) + framing
