"""Admission: what a request must satisfy once its model is known, before any upstream sees it.

Ingress-neutral (every front door's request is a `CompletionRequest` by now): media parts need
the model's capability. Each rejection is a 400 naming the field.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

from app.errors import InvalidRequest
from catalog.snapshot import ModelEntry
from providers.types import AudioPart, CompletionRequest, ContentPart, DocumentPart, ImagePart

_CAPABILITY = {ImagePart: "vision", AudioPart: "audio", DocumentPart: "documents"}


def admit(request: CompletionRequest, model: ModelEntry) -> None:
    """Raise `InvalidRequest` when `model` cannot take `request`."""
    check_capabilities(request, model.id, model.capabilities)


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
            if isinstance(part, ImagePart | AudioPart | DocumentPart):
                yield f"messages[{m_index}].content[{p_index}]", part


def _invalid(param: str, detail: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {detail}", param=param)
