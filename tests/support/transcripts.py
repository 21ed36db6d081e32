"""The one loader of recorded upstream exchanges, `tests/transcripts/<name>.json`.

A transcript is what one upstream sent for one request: status, headers, the body as the writes
it arrived in (`chunks`), and how it was played (delays, a reset or a stall after N chunks).
`read_transcript` gives the record itself (the pure parser tests replay its chunks);
`load_transcript` gives it as a `Reply` for `ReplayUpstream` to play over HTTP.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from devtools.mock_http import Reply

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "transcripts"


class Transcript(msgspec.Struct):
    description: str
    status: int
    headers: dict[str, str]
    chunks: list[str]
    chunk_delay_s: float = 0.0
    first_byte_delay_s: float = 0.0
    reset_after: int | None = None
    stall_after: int | None = None
    chunked: bool | None = None  # absent: chunked exactly when the body is an event stream


def read_transcript(name: str) -> Transcript:
    """`name` with or without `.json`."""
    path = TRANSCRIPTS / f"{name.removesuffix('.json')}.json"
    return msgspec.json.decode(path.read_bytes(), type=Transcript)


def load_transcript(name: str) -> Reply:
    transcript = read_transcript(name)
    chunked = transcript.chunked
    if chunked is None:
        content_type = {k.lower(): v for k, v in transcript.headers.items()}.get("content-type", "")
        chunked = "text/event-stream" in content_type
    return Reply(
        status=transcript.status,
        headers=list(transcript.headers.items()),
        chunks=[chunk.encode() for chunk in transcript.chunks],
        chunk_delay_s=transcript.chunk_delay_s,
        first_byte_delay_s=transcript.first_byte_delay_s,
        reset_after=transcript.reset_after,
        stall_after=transcript.stall_after,
        chunked=chunked,
    )
