"""The time a streamed token spends inside the gateway: it reaches the client as soon as the
upstream's read that carried it, never held for a later one, nor behind the process's own log.

Measured on `switchyard serve` against an upstream streaming a token every 20 ms (all four doors,
1, 8 and 64 streams): the gateway adds about 0.5 ms a token at the median. Asking for log
probabilities from an upstream that sends none for a chunk (a server without them, a chunk the
upstream left without) held every text delta until the next upstream event, so each token came
one whole inter-token gap late (+20.9 ms at 20 ms a token, +501 ms at 500 ms), and a token before
a pause (a tool running, a model thinking) was held through it. These tests stop the upstream
after its first token: the token must reach the client anyway."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.catalog import catalog_toml, model, price
from tests.support.cli import cli_env, processes, start_mock, write_config
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import GatewayHandle, StartGateway, provider_table
from tests.support.ports import free_port
from tests.support.replies import chunk, usage_chunk
from tests.support.upstream import ReplayUpstream, reply_sse
from tests.support.waiting import wait_until_sync

CATALOG = catalog_toml(
    model("text-1", ("primary", "org/text-1", 100), capabilities=["completions"], default=True),
    prices=[price("primary", "text-1", "0.10", "0.40")],
)
WITHIN_S = 5.0  # the token is due at once; the bound only keeps a failing test from hanging


def _text_chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
    }


async def _gateway(start_gateway: StartGateway, primary: ReplayUpstream) -> GatewayHandle:
    return await start_gateway(providers=provider_table({"primary": primary}), catalog=CATALOG)


async def _first_data(gw: GatewayHandle, path: str, payload: dict[str, Any], upstream: ReplayUpstream) -> list[Any]:
    """The `data:` payloads up to the first that carries text, read as they arrive, while the
    upstream, having sent one token, sends nothing more."""
    frames: list[Any] = []
    async with gw.client.stream("POST", path, json=payload) as response:
        assert response.status_code == 200
        buffer = ""
        async with asyncio.timeout(WITHIN_S):
            async for text in response.aiter_text():
                buffer += text
                *blocks, buffer = buffer.split("\n\n")
                frames += [json.loads(block.removeprefix("data: ")) for block in blocks]
                if any(_text_of(frame) for frame in frames):
                    break
        assert upstream.active_streams == 1  # the upstream still holds the rest back
    return frames


def _text_of(frame: dict[str, Any]) -> str | None:
    choice = frame["choices"][0] if frame.get("choices") else {}
    return choice.get("text") or (choice.get("delta") or {}).get("content")


async def test_a_chat_token_without_logprobs_is_not_held_for_the_next(
    start_gateway: StartGateway, primary: ReplayUpstream
) -> None:
    """`logprobs: true` on the chat door, an upstream chunk without any: the token leaves with
    its own read, `logprobs: null`, as the upstream sent it (before, it waited for the next one)."""
    gw = await _gateway(start_gateway, primary)
    tokens = [chunk({"role": "assistant", "content": "Hel"}), chunk({"content": "lo"}), chunk(finish="stop")]
    primary.enqueue(reply_sse([*tokens, usage_chunk(3, 2)], stall_after=1))
    payload = {"model": "text-1", "stream": True, "logprobs": True, "messages": [{"role": "user", "content": "hi"}]}
    frames = await _first_data(gw, "/v1/chat/completions", payload, primary)
    assert [frame["choices"][0]["delta"] for frame in frames] == [
        {"role": "assistant"},
        {"content": "Hel"},
    ]
    assert frames[-1]["choices"][0]["logprobs"] is None


async def test_a_text_token_without_logprobs_is_not_held_for_the_next(
    start_gateway: StartGateway, primary: ReplayUpstream
) -> None:
    """The legacy door's `logprobs: 1` likewise."""
    gw = await _gateway(start_gateway, primary)
    tokens = [_text_chunk("Once"), _text_chunk(" upon"), _text_chunk("", finish="length")]
    primary.enqueue(reply_sse([*tokens, usage_chunk(3, 2)], stall_after=1))
    payload = {"model": "text-1", "stream": True, "prompt": "Tell me", "max_tokens": 8, "logprobs": 1}
    frames = await _first_data(gw, "/v1/completions", payload, primary)
    assert [frame["choices"][0]["text"] for frame in frames] == ["Once"]
    assert frames[0]["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("with_logprobs", [False, True])
async def test_logprobs_sent_with_their_token_still_share_its_chunk(
    start_gateway: StartGateway, primary: ReplayUpstream, with_logprobs: bool
) -> None:
    """What the holding was for still holds: a chunk's text and its log probabilities leave as one
    chunk, at once (`with_logprobs`: the guard of that; without, the token is not held)."""
    gw = await _gateway(start_gateway, primary)
    logprobs = {"content": [{"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108], "top_logprobs": []}]}
    first = chunk({"role": "assistant", "content": "Hel"})
    first["choices"][0]["logprobs"] = logprobs if with_logprobs else None
    primary.enqueue(reply_sse([first, chunk({"content": "lo"}), chunk(finish="stop")], stall_after=1))
    payload = {"model": "text-1", "stream": True, "logprobs": True, "messages": [{"role": "user", "content": "hi"}]}
    frames = await _first_data(gw, "/v1/chat/completions", payload, primary)
    choice = frames[-1]["choices"][0]
    assert choice["delta"] == {"content": "Hel"}
    assert (choice["logprobs"] is not None) is with_logprobs
    if with_logprobs:
        assert [entry["token"] for entry in choice["logprobs"]["content"]] == ["Hel"]


def test_streams_go_on_while_nobody_reads_the_log(tmp_path: Path) -> None:
    """`switchyard serve` whose stdout is a pipe nobody drains (a log shipper that fell behind):
    the canonical lines fill it (64 KiB, about 70 requests). The lines were written from the
    event loop, which blocked in that write: the 72nd stream and everything after it (health
    checks too) hung for as long as the reader did. Every stream is served, and `/healthz` answers."""
    with processes() as started:
        mock_port = start_mock(tmp_path, started)
        config = write_config(tmp_path, mock_port)
        port = free_port()
        serve = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--config", str(config), "--port", str(port)],
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.PIPE,  # never read
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until_sync(lambda: _answers(f"{base}/healthz"), 20.0, what="the gateway answering")
            with httpx.Client(base_url=base, timeout=WITHIN_S) as client:
                for _ in range(150):
                    response = client.post(COMPLETIONS, json=body("tiny", stream=True))
                    assert response.status_code == 200
                    assert '"type":"finish"' in response.text
                assert client.get("/healthz").status_code == 200
        finally:
            with suppress(ProcessLookupError):
                os.killpg(serve.pid, signal.SIGKILL)
            serve.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False
