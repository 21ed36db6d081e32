"""Instructions per streamed answer of each door's renderer alone (callgrind, deterministic).

    .venv/bin/python bench/render_cost.py [native,chat,anthropic,completions] [STREAMS]

(from the repository root, with the worktree on PYTHONPATH). Renders bench/run.py's streamed answer
as the pipeline yields it (Started, TextStart, 64 text deltas, TextEnd, an Outcome with usage and
cost) STREAMS times (default 400) through each door's renderer, under valgrind's callgrind, and
prints the instructions per answer: the run minus a run of a renderer that does nothing, over
STREAMS, so interpreter start-up, imports and the loop itself cancel out. `bench/instructions.sh`
counts the whole gateway; this isolates the part a door adds to the shared pipeline and relay.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

DOORS = ("native", "chat", "anthropic", "completions")
WORDS = (" quick", " brown", " fox")
REQUEST_ID = "01a232f1-e841-79ea-9edd-38c42817ac38"


def _events() -> list[Any]:
    from app.pipeline import events as ev
    from providers.events import Usage
    from providers.types import Message, TextPart

    deltas = [ev.TextDelta(WORDS[i % len(WORDS)]) for i in range(64)]
    text = "".join(delta.text for delta in deltas)
    outcome = ev.Outcome(
        status="ok",
        finished=0.0,
        model="bench-model",
        provider="mock",
        message=Message(role="assistant", content=[TextPart(text)]),
        finish_reason="stop",
        usage=Usage(input_tokens=34, output_tokens=64),
        cost=ev.Cost(Decimal("0.000113"), "estimated"),
    )
    return [ev.Started("bench-model", "mock"), ev.TextStart(0), *deltas, ev.TextEnd(0, text), outcome]


def _factory(door: str) -> Callable[[], Any]:
    import msgspec
    from app.context import RequestContext
    from app.edge.anthropic import AnthropicStream
    from app.edge.openai_chat import ChatStream
    from app.edge.openai_completions import TextStream
    from app.edge.unified import UnifiedStream
    from providers.types import CompletionRequest

    when = datetime(2026, 12, 1, tzinfo=UTC)
    ctx = RequestContext(request_id=REQUEST_ID, ingress="unified", stream=True, deadline=0, started_at=when, started=0)
    request = msgspec.convert(
        {"model": "bench-model", "messages": [{"role": "user", "content": [{"kind": "text", "data": "hi"}]}]},
        CompletionRequest,
    )
    factories: dict[str, Callable[[], Any]] = {
        "null": lambda: _Null(),
        "native": lambda: UnifiedStream(ctx, request),
        "chat": lambda: ChatStream(ctx, True),
        "anthropic": lambda: AnthropicStream(ctx),
        "completions": lambda: TextStream(ctx, True),
    }
    return factories[door]


class _Null:
    def render(self, _event: object) -> bytes:
        return b"x"


def render(door: str, streams: int) -> int:
    make, events, size = _factory(door), _events(), 0
    for _ in range(streams):
        render_one = make().render
        for event in events:
            size += len(render_one(event))
    return size


def _counted(door: str, streams: int) -> int:
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "callgrind.out"
        code = f"import render_cost as r; r.render({door!r}, 1); r.render({door!r}, {streams})"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-c", code]
        subprocess.run(argv, check=True, capture_output=True, env=env)
        summary = next(line for line in out.read_text().splitlines() if line.startswith("summary:"))
        return int(summary.split()[1])


def main() -> None:
    doors = sys.argv[1].split(",") if len(sys.argv) > 1 else list(DOORS)
    streams = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    base = _counted("null", streams)
    for door in doors:
        print(f"{door}: {(_counted(door, streams) - base) // streams:,} instructions per streamed answer")


if __name__ == "__main__":
    main()
