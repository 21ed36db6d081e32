"""Reading a gateway SSE body back into (event, data) pairs, exactly as a client would."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any


def parse_sse(body: str) -> list[tuple[str, Any]]:
    """Split on blank lines; every frame must have exactly one `event:` and one `data:` line."""
    assert body.endswith("\n\n"), f"stream does not end with a blank line: {body[-80:]!r}"
    frames = []
    for block in body.split("\n\n")[:-1]:
        lines = block.split("\n")
        assert len(lines) == 2, f"unexpected frame layout: {block!r}"
        event, data = lines
        assert event.startswith("event: "), block
        assert data.startswith("data: "), block
        frames.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "), parse_float=Decimal)))
    return frames


def types(frames: list[tuple[str, Any]]) -> list[str]:
    return [data["type"] for _, data in frames]
