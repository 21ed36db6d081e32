"""What a client of the gateway does: build a request, post it, read the answer or its SSE frames.

- `user(text)`, `body(model, ...)`: request bodies of the native completions API;
- `post`, `complete`: one request, the response as it came; `stream`: a whole streamed answer
  (must be 200) parsed into `(event, data)` frames by `parse_sse`, exactly as a client would;
- `Held`/`holding`: streaming requests kept open on whichever backend took them, to fill slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

    from tests.support.gateway import GatewayHandle

COMPLETIONS = "/api/v1/completions"
Frames = list[tuple[str, Any]]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"kind": "text", "data": text}]}


USER = user("hi")


def body(model: str = "chat-1", *, stream: bool = False, text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [user(text)], "stream": stream, **extra}


async def post(gw: GatewayHandle, payload: Any) -> httpx.Response:
    return await gw.client.post(COMPLETIONS, json=payload)


async def complete(gw: GatewayHandle, model: str = "chat-1", **extra: Any) -> httpx.Response:
    return await post(gw, body(model, **extra))


async def stream(gw: GatewayHandle, model: str = "chat-1", **extra: Any) -> tuple[httpx.Response, Frames]:
    """A whole streamed answer (status must be 200), parsed into frames."""
    response = await post(gw, body(model, stream=True, **extra))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return response, parse_sse(response.text)


def parse_sse(text: str) -> Frames:
    """Split on blank lines; every frame must have exactly one `event:` and one `data:` line."""
    assert text.endswith("\n\n"), f"stream does not end with a blank line: {text[-80:]!r}"
    frames = []
    for block in text.split("\n\n")[:-1]:
        lines = block.split("\n")
        assert len(lines) == 2, f"unexpected frame layout: {block!r}"
        event, data = lines
        assert event.startswith("event: "), block
        assert data.startswith("data: "), block
        frames.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "), parse_float=Decimal)))
    return frames


def types(frames: Frames) -> list[str]:
    return [data["type"] for _, data in frames]


def datas(frames: Frames) -> list[dict[str, Any]]:
    """Frame data with the (separately checked) complete response cut from `finish`."""
    return [{k: v for k, v in data.items() if k != "response"} for _, data in frames]


class Held:
    """A streaming request kept open: `started()` waits for its first frames; `release()` closes
    the client side (the gateway must then cancel the upstream request and free the slot)."""

    def __init__(self, gw: GatewayHandle, model: str = "chat-1") -> None:
        self._first: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(self._run(gw, model))

    async def _run(self, gw: GatewayHandle, model: str) -> None:
        try:
            async with gw.client.stream("POST", COMPLETIONS, json=body(model, stream=True)) as response:
                seen = ""
                async for text in response.aiter_text():
                    seen += text
                    if not self._first.done() and "text_delta" in seen:
                        self._first.set_result(seen)
                if not self._first.done():
                    self._first.set_exception(AssertionError(f"{response.status_code}: {seen}"))
        except Exception as exc:
            if not self._first.done():
                self._first.set_exception(exc)

    async def started(self) -> str:
        """The provider whose stream this is (from `stream_start`)."""
        text = await asyncio.wait_for(asyncio.shield(self._first), 5)
        frames = parse_sse(text[: text.rindex("\n\n") + 2])
        start = frames[0][1]
        assert start["type"] == "stream_start", frames
        provider: str = start["provider"]
        return provider

    async def release(self) -> None:
        if not self.task.done():
            self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def holding() -> AsyncIterator[list[Held]]:
    """Collects `Held` requests and releases whatever is still held when the block ends."""
    held: list[Held] = []
    try:
        yield held
    finally:
        for item in held:
            await item.release()
