"""Media parts of an OpenAI-style chat message (`providers.openai_request`'s `_user_content`):
`image` → `image_url` (a `url` as given, `data` as a `data:` URL, its type read from the data's
first bytes when not given), `audio` data → `input_audio` (a remote audio URL → vLLM's
`audio_url`), `document` → a `file` part."""

from __future__ import annotations

import base64

from msgspec import UNSET, Struct, UnsetType

from providers.types import FileData, ImagePart

_IMAGE_MAGIC = (
    ("iVBOR", "image/png"),
    ("/9j/", "image/jpeg"),
    ("R0lGOD", "image/gif"),
    ("UklGR", "image/webp"),
)
_AUDIO_FORMATS = {"audio/mpeg": "mp3", "audio/mp3": "mp3", "audio/x-wav": "wav", "audio/wave": "wav"}


class Text(Struct, tag_field="type", tag="text"):
    text: str


class _ImageURL(Struct):
    url: str
    detail: str | UnsetType = UNSET


class _Image(Struct, tag_field="type", tag="image_url"):
    image_url: _ImageURL


class _InputAudio(Struct):
    data: str
    format: str


class _Audio(Struct, tag_field="type", tag="input_audio"):
    input_audio: _InputAudio


class _AudioURL(Struct):
    url: str


class _AudioLink(Struct, tag_field="type", tag="audio_url"):
    audio_url: _AudioURL


class _FileRef(Struct):
    file_data: str
    filename: str | UnsetType = UNSET


class _File(Struct, tag_field="type", tag="file"):
    file: _FileRef


WirePart = Text | _Image | _Audio | _AudioLink | _File


def _base64(data: str | list[int]) -> str:
    if isinstance(data, str):
        return data
    return base64.b64encode(bytes(data)).decode("ascii")


def _data_url(data: str | list[int], media_type: str | None, fallback: str) -> str:
    encoded = _base64(data)
    if media_type is None:
        media_type = next((kind for magic, kind in _IMAGE_MAGIC if encoded.startswith(magic)), fallback)
    return f"data:{media_type};base64,{encoded}"


def image_part(part: ImagePart) -> _Image:
    image = part.data
    url = image.url if image.url is not None else _data_url(image.data or "", image.media_type, "image/png")
    detail: str | UnsetType = UNSET if image.detail is None else image.detail
    return _Image(image_url=_ImageURL(url=url, detail=detail))


def audio_part(audio: FileData) -> _Audio | _AudioLink:
    media_type, data = audio.media_type, audio.data
    if audio.url is not None:
        if not audio.url.startswith("data:") or "," not in audio.url:
            return _AudioLink(audio_url=_AudioURL(url=audio.url))
        header, data = audio.url[5:].split(",", 1)
        media_type = media_type or header.split(";", 1)[0]
    media_type = media_type or "audio/wav"
    audio_format = _AUDIO_FORMATS.get(media_type, media_type.rsplit("/", 1)[-1])
    return _Audio(input_audio=_InputAudio(data=_base64(data or ""), format=audio_format))


def document_part(document: FileData) -> _File:
    if document.url is not None:
        file_data = document.url
    else:
        file_data = _data_url(document.data or "", document.media_type or "application/pdf", "")
    filename: str | UnsetType = UNSET if document.file_name is None else document.file_name
    return _File(file=_FileRef(file_data=file_data, filename=filename))
