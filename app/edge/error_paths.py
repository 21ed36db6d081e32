"""The key msgspec leaves out of a validation error's path: a bad value inside an object with free
keys (`metadata`, `provider_options`) is reported at `$.metadata[...]`, which names no field.

`with_dict_keys(decoder, body, message)` finds the key by decoding the body again with that object
cut down to one entry at a time (the first entry alone that fails the same way is the one) and
writes it into the message's path: `$.metadata.a`. Error path only: a request that decodes never
comes here, and one that fails costs a decode per key of that object, of its first
`MAX_KEYS_TRIED` keys (each try decodes the whole body: unbounded, a big body with thousands of
keys held a worker for seconds). A message it cannot place (an unreadable body, no such object,
keys that do not fail alone, a bad key past the first 32) comes back as it was.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
_ANY_KEY = "[...]"
MAX_KEYS_TRIED = 32  # each try decodes the whole body: 2,000 keys of a 1 MB body held a worker 1.35 s


def with_dict_keys(decoder: msgspec.json.Decoder[Any], body: bytes, message: str) -> str:
    at = _AT.search(message)
    if at is None or _ANY_KEY not in at["path"]:
        return message
    head, _, _ = at["path"].partition(_ANY_KEY)
    steps = _steps(head)
    try:
        document = msgspec.json.decode(body)
        holder = _at(document, steps)
    except (msgspec.DecodeError, LookupError, TypeError):
        return message
    if not isinstance(holder, dict):
        return message
    entries = dict(holder)
    try:
        for key, value in list(entries.items())[:MAX_KEYS_TRIED]:
            holder.clear()
            holder[key] = value
            try:
                decoder.decode(msgspec.json.encode(document))
            except msgspec.ValidationError as exc:
                again = _AT.search(str(exc))
                if again is not None and again["path"].startswith(head + _ANY_KEY):
                    return message.replace(f"{head}{_ANY_KEY}", f"{head}.{key}", 1)
    finally:
        holder.clear()
        holder.update(entries)
    return message


def _steps(path: str) -> list[str | int]:
    return [int(index) if index else key for key, index in _STEP.findall(path)]


def _at(document: Any, steps: list[str | int]) -> Any:
    for step in steps:
        document = document[step]
    return document
