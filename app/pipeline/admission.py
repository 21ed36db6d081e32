"""Admission: what a request must satisfy once its model is known, before any upstream sees it.

Ingress-neutral (every front door's request is a `CompletionRequest` by now, or a
`TextCompletionRequest` for a raw prompt). Each rejection is a 400 naming the field:
- media parts need the model's capability (`messages[i].content[j]`);
- a raw prompt needs the model's `completions` capability (`model`): its deployments must serve
  `/completions`, and the prompt is never wrapped in a chat template behind the client's back;
- `max_tokens` may not exceed the model's `max_output` (`max_tokens`);
- the prompt must be able to fit the model's `context_window`: named by its largest part
  (`messages`, `system`, `tools` or `schema`; each door renames what it calls otherwise), or `prompt`.

The prompt rule refuses only what cannot fit, never what might: the gateway has no tokenizer, and
the usual four characters per token (`app.pipeline.estimate`) overestimates some text, so it would
refuse prompts the upstream accepts. Instead the check takes a lower bound on the prompt's tokens,
`prompt_chars / MAX_CHARS_PER_TOKEN` (8: real text averages 3 to 5 characters per token under BPE
tokenizers, code and non-Latin scripts fewer), and refuses when that bound plus `max_tokens` (the
room the client asked to keep for the answer; 0 when absent) exceeds the window. A 9 MB prompt on
a 32k-token model is refused here instead of being sent, and billed, upstream; a prompt near the
window goes to the upstream, which knows its own tokenizer and answers a 400 of its own if needed.
A model whose catalog entry has no window or output limit (0) is not checked on that count.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

import msgspec

from app.errors import InvalidRequest
from app.pipeline.estimate import prompt_chars
from catalog.snapshot import ModelEntry
from providers.types import MEDIA_PARTS, AnyRequest, AudioPart, CompletionRequest, ContentPart, DocumentPart, ImagePart

MAX_CHARS_PER_TOKEN = 8
_CAPABILITY = {ImagePart: "vision", AudioPart: "audio", DocumentPart: "documents"}
_encode = msgspec.json.encode


def admit(request: AnyRequest, model: ModelEntry) -> None:
    """Raise `InvalidRequest` when `model` cannot take `request`."""
    if isinstance(request, CompletionRequest):
        check_capabilities(request, model.id, model.capabilities)
    elif "completions" not in model.capabilities:
        detail = f"model '{model.id}' does not take raw-prompt completions (no 'completions' capability)"
        raise _invalid("model", detail)
    check_limits(request, model)


def check_limits(request: AnyRequest, model: ModelEntry) -> None:
    """`max_tokens` within `max_output`, and a prompt that can fit `context_window` (module doc)."""
    answer = request.max_tokens or 0
    if model.max_output and answer > model.max_output:
        detail = f"{answer} is more than the {model.max_output} tokens model '{model.id}' can answer with"
        raise _invalid("max_tokens", detail)
    if model.context_window:
        least = prompt_chars(request) // MAX_CHARS_PER_TOKEN
        if least + answer > model.context_window:
            asked = f"at least {least} prompt tokens" + (f" plus max_tokens {answer}" if answer else "")
            detail = f"{asked} do not fit the {model.context_window}-token context window of model '{model.id}'"
            raise _invalid(_largest_part(request), detail)


def _largest_part(request: AnyRequest) -> str:
    """The part of a prompt too long that holds most of it, by its canonical name (a door that
    names it otherwise renames it: `Door.renames`): a schema of 270,000 characters was blamed on
    `messages` of one word. The error path only."""
    if type(request) is not CompletionRequest:
        return "prompt"
    sizes = {
        "system": len(request.system or ""),
        "tools": len(_encode(request.tools)) if request.tools else 0,
        "schema": len(_encode(request.schema)) if request.schema is not None else 0,
    }
    sizes["messages"] = prompt_chars(request) - sum(sizes.values())
    return max(sizes, key=lambda part: (sizes[part], part == "messages"))  # a tie: messages


def check_capabilities(request: CompletionRequest, model: str, capabilities: Collection[str]) -> None:
    """A media part the model cannot take is a 400 naming the part (api.md), unless the catalog says
    the model has the capability."""
    for path, part in _media_parts(request):
        needed = _CAPABILITY[type(part)]
        if needed not in capabilities:
            kind = type(part).__struct_config__.tag
            raise _invalid(path, f"model '{model}' does not accept '{kind}' parts (no '{needed}' capability)")


def _media_parts(request: CompletionRequest) -> Iterator[tuple[str, ContentPart]]:
    for m_index, message in enumerate(request.messages):
        for p_index, part in enumerate(message.content):
            if type(part) in MEDIA_PARTS:
                yield f"messages[{m_index}].content[{p_index}]", part


def _invalid(param: str, detail: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {detail}", param=param)
