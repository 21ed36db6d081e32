"""The mock upstream and the replay server, through real HTTP on loopback (httpx and raw sockets)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.mock_openai import ScriptedOptions, estimate_prompt_tokens
from devtools.mock_upstream import main, scripted_server
from tests.support.ports import free_port, occupied_port
from tests.support.transcripts import load_transcript
from tests.support.upstream import ReplayUpstream, reply_json, reply_sse
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
CHAT_BODY = b'{"model":"gemma","messages":[{"role":"user","content":"hi"}]}'
STREAM_BODY = b'{"model":"gemma","stream":true,"stream_options":{"include_usage":true},"messages":[]}'


def data_lines(text: str) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded except `[DONE]`."""
    payloads = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


def deltas(events: list[Any]) -> list[dict[str, Any]]:
    return [e["choices"][0]["delta"] for e in events if isinstance(e, dict) and e["choices"]]


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status_line, *lines = head.split("\r\n")[:-2]
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    body = b""
    if headers.get("transfer-encoding") == "chunked":
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readexactly(2)
    else:
        body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


async def read_lines_until_error(client: httpx.AsyncClient, url: str) -> tuple[list[str], Exception | None]:
    received: list[str] = []
    try:
        async with client.stream("POST", url, content=STREAM_BODY) as response:
            async for line in response.aiter_lines():
                if line:
                    received.append(line)
    except httpx.HTTPError as exc:
        return received, exc
    return received, None


async def test_chat_json_reply_is_exact() -> None:
    options = ScriptedOptions(chunks=4, tokens_per_chunk=2, text="alpha beta gamma")
    async with scripted_server(options) as server, httpx.AsyncClient() as client:
        response = await client.post(f"{server.url}/chat/completions", content=CHAT_BODY)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert (body["id"], body["object"], body["model"]) == ("chatcmpl-mock", "chat.completion", "gemma")
    message = {"role": "assistant", "content": "alpha beta gamma alpha beta gamma alpha beta"}
    assert body["choices"] == [{"index": 0, "message": message, "finish_reason": "stop"}]
    prompt = len(CHAT_BODY) // 4
    assert estimate_prompt_tokens(CHAT_BODY) == prompt
    assert body["usage"] == {"prompt_tokens": prompt, "completion_tokens": 8, "total_tokens": prompt + 8}


async def test_a_reply_never_bills_more_completion_tokens_than_max_tokens() -> None:
    """The mock reported its 8 tokens whatever `max_tokens` said: a budget reserved on `max_tokens`
    was overshot by the bundled mock alone (no real server bills past it)."""
    options = ScriptedOptions(chunks=4, tokens_per_chunk=2, text="alpha beta gamma")
    bodies = {
        "max_tokens": b'{"model":"gemma","messages":[],"max_tokens":3}',
        "max_completion_tokens": b'{"model":"gemma","messages":[],"max_completion_tokens":5,"max_tokens":1}',
        "above": b'{"model":"gemma","messages":[],"max_tokens":100}',
    }
    async with scripted_server(options) as server, httpx.AsyncClient() as client:
        billed = {
            name: (await client.post(f"{server.url}/chat/completions", content=body)).json()["usage"][
                "completion_tokens"
            ]
            for name, body in bodies.items()
        }
    assert billed == {"max_tokens": 3, "max_completion_tokens": 5, "above": 8}


async def test_chat_takes_logprobs_as_openai_sends_them() -> None:
    """Chat's `logprobs` is a bool (the legacy endpoint's an int): taken, not simulated."""
    options = ScriptedOptions(chunks=4, tokens_per_chunk=2, text="alpha beta gamma")
    asked = {"model": "gemma", "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2}
    async with scripted_server(options) as server, httpx.AsyncClient() as client:
        response = await client.post(f"{server.url}/chat/completions", json=asked)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "alpha beta gamma alpha beta gamma alpha beta"


async def test_chat_stream_has_exact_chunks_usage_and_done() -> None:
    async with scripted_server(ScriptedOptions(tokens_per_chunk=3)) as server, httpx.AsyncClient() as client:
        stream = await client.post(f"{server.url}/chat/completions", content=STREAM_BODY)
        whole = await client.post(f"{server.url}/chat/completions", content=CHAT_BODY)
        no_usage = await client.post(f"{server.url}/chat/completions", json={"model": "m", "stream": True})
    assert stream.headers["content-type"] == "text/event-stream"
    assert stream.headers["transfer-encoding"] == "chunked"
    events = data_lines(stream.text)
    assert len(events) == 64 + 3  # content chunks, finish chunk, usage chunk, [DONE]
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"] == []
    prompt = len(STREAM_BODY) // 4
    assert events[-2]["usage"] == {"prompt_tokens": prompt, "completion_tokens": 192, "total_tokens": prompt + 192}
    assert events[-3]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    content = deltas(events[:64])
    assert content[0]["role"] == "assistant"
    assert all(set(d) == {"content"} for d in content[1:])
    assert "".join(d["content"] for d in content) == whole.json()["choices"][0]["message"]["content"]
    assert whole.json()["usage"]["completion_tokens"] == 192
    assert len(data_lines(no_usage.text)) == 64 + 2
    assert data_lines(no_usage.text)[-2]["choices"][0]["finish_reason"] == "stop"


async def test_reasoning_and_tool_call_stream() -> None:
    options = ScriptedOptions(chunks=1, reasoning_chunks=2, tool_call="get_weather", text="Sunny")
    async with scripted_server(options) as server, httpx.AsyncClient() as client:
        stream = await client.post(f"{server.url}/chat/completions", content=STREAM_BODY)
        whole = await client.post(f"{server.url}/chat/completions", content=CHAT_BODY)
    events = data_lines(stream.text)
    arguments = '{"city": "Ljubljana", "unit": "celsius"}'
    assert deltas(events) == [
        {"role": "assistant", "reasoning_content": "Let"},
        {"reasoning_content": " me"},
        {"content": "Sunny"},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_mock_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]},
        {},
    ]
    assert events[5]["choices"][0]["finish_reason"] == "tool_calls"
    assert events[6]["usage"]["completion_tokens"] == 4
    assert events[6]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}
    message = whole.json()["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": "Sunny",
        "reasoning_content": "Let me",
        "tool_calls": [
            {"id": "call_mock_0", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        ],
    }


async def test_text_completions_json_and_stream() -> None:
    options = ScriptedOptions(chunks=3, text="one two three four")
    body = b'{"model":"base","prompt":"Say","stream":true,"stream_options":{"include_usage":true}}'
    async with scripted_server(options) as server, httpx.AsyncClient() as client:
        whole = await client.post(f"{server.url}/completions", json={"model": "base", "prompt": "Say"})
        stream = await client.post(f"{server.url}/completions", content=body)
    assert whole.json()["object"] == "text_completion"
    assert whole.json()["choices"] == [{"index": 0, "text": "one two three", "finish_reason": "stop"}]
    events = data_lines(stream.text)
    assert [e["choices"][0]["text"] for e in events[:4]] == ["one", " two", " three", ""]
    assert events[3]["choices"][0]["finish_reason"] == "stop"
    prompt = len(body) // 4
    assert events[4] == {
        "id": "cmpl-mock",
        "object": "text_completion",
        "created": events[0]["created"],
        "model": "base",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3},
    }
    assert events[5] == "[DONE]"


async def test_text_completions_logprobs_and_echo() -> None:
    options = ScriptedOptions(chunks=2, tokens_per_chunk=2, text="one two three four")
    asked = {"model": "base", "prompt": ["Say:"], "logprobs": 2, "echo": True}
    async with scripted_server(options) as server, httpx.AsyncClient() as client:
        whole = await client.post(f"{server.url}/completions", json=asked)
        stream = await client.post(f"{server.url}/completions", json={**asked, "stream": True})
        plain = await client.post(f"{server.url}/completions", json={"model": "base", "prompt": "x", "logprobs": 1})
    (choice,) = whole.json()["choices"]
    assert choice == {
        "index": 0,
        "text": "Say:one two three four",
        "finish_reason": "stop",
        "logprobs": {
            "tokens": ["Say:", "one", " two", " three", " four"],
            "token_logprobs": [None, -0.1, -0.2, -0.3, -0.4],
            "top_logprobs": [
                None,
                {"one": -0.1, "one~1": -1.1},
                {" two": -0.2, "two~1": -1.2},
                {" three": -0.3, "three~1": -1.3},
                {" four": -0.4, "four~1": -1.4},
            ],
            "text_offset": [0, 4, 7, 11, 17],
        },
    }
    events = data_lines(stream.text)
    assert [e["choices"][0]["text"] for e in events[:4]] == ["Say:", "one two", " three four", ""]
    assert events[0]["choices"][0]["logprobs"] == {
        "tokens": ["Say:"],
        "token_logprobs": [None],
        "top_logprobs": [None],
        "text_offset": [0],
    }
    assert events[2]["choices"][0]["logprobs"]["text_offset"] == [11, 17]
    assert "logprobs" not in events[3]["choices"][0]
    assert events[4] == "[DONE]"
    top = plain.json()["choices"][0]["logprobs"]["top_logprobs"]
    assert top == [{"one": -0.1}, {" two": -0.2}, {" three": -0.3}, {" four": -0.4}]


async def test_models_health_metrics_and_unknown_route() -> None:
    options = ScriptedOptions(model="served-model", metrics_waiting=3)
    async with scripted_server(options) as server, httpx.AsyncClient() as client:
        models = await client.get(f"{server.url}/models")
        health = await client.get(f"http://127.0.0.1:{server.port}/health")
        metrics = await client.get(f"http://127.0.0.1:{server.port}/metrics")
        missing = await client.get(f"{server.url}/nothing")
    assert models.json() == {"object": "list", "data": [{"id": "served-model", "object": "model", "owned_by": "mock"}]}
    assert (health.status_code, health.content) == (200, b"")
    assert 'vllm:num_requests_waiting{model_name="served-model"} 3.0\n' in metrics.text
    assert 'vllm:num_requests_running{model_name="served-model"} 0.0\n' in metrics.text
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": "no route for GET /v1/nothing",
        "type": "invalid_request_error",
        "code": 404,
    }


async def test_latency_delays_first_byte_and_metrics_count_it_running() -> None:
    async with scripted_server(ScriptedOptions(latency_ms=300)) as server, httpx.AsyncClient() as client:
        started = time.monotonic()
        pending = asyncio.create_task(client.post(f"{server.url}/chat/completions", content=CHAT_BODY))
        await wait_until(lambda: server.active_streams > 0, within=2.0, interval=0.005)
        async with httpx.AsyncClient() as probe:
            metrics = await probe.get(f"http://127.0.0.1:{server.port}/metrics")
        response = await pending
        elapsed = time.monotonic() - started
    assert 'vllm:num_requests_running{model_name="mock-model"} 1.0\n' in metrics.text
    assert response.status_code == 200
    assert elapsed >= 0.3


async def test_injected_failure_every_second_request() -> None:
    options = ScriptedOptions(fail_status=429, fail_every=2, retry_after=7)
    async with scripted_server(options) as server, httpx.AsyncClient() as client:
        replies = [await client.post(f"{server.url}/chat/completions", content=CHAT_BODY) for _ in range(4)]
    assert [r.status_code for r in replies] == [200, 429, 200, 429]
    assert replies[1].headers["retry-after"] == "7"
    assert "retry-after" not in replies[0].headers
    assert replies[3].json() == {"error": {"message": "injected failure", "type": "rate_limit_error", "code": 429}}


async def test_reset_after_gives_the_client_a_read_error_mid_stream() -> None:
    options = ScriptedOptions(chunks=5, reset_after=2, text="a b c d e")
    async with scripted_server(options) as server, httpx.AsyncClient() as client:
        received, error = await read_lines_until_error(client, f"{server.url}/chat/completions")
        assert isinstance(error, httpx.ReadError)
        with pytest.raises(httpx.ReadError):
            await client.post(f"{server.url}/chat/completions", content=CHAT_BODY)
        async with asyncio.timeout(2):
            await server.wait_idle()
    assert [e["choices"][0]["delta"].get("content") for e in data_lines("\n\n".join(received))] == ["a", " b"]


async def test_reset_sends_exactly_the_chunks_before_it_raw() -> None:
    async with ReplayUpstream() as upstream:
        upstream.enqueue(reply_sse(["data: a\n\n", "data: b\n\n", "data: c\n\n"], reset_after=2))
        reader, writer = await asyncio.open_connection("127.0.0.1", upstream.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        received = bytearray()
        error = None
        try:
            while chunk := await reader.read(65536):
                received += chunk
        except ConnectionResetError as exc:
            error = exc
        writer.close()
    assert error is not None
    assert received == (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        b"9\r\ndata: a\n\n\r\n9\r\ndata: b\n\n\r\n"
    )


async def test_stall_then_client_cancel_closes_the_upstream_connection() -> None:
    async with ReplayUpstream() as upstream, httpx.AsyncClient() as client:
        upstream.enqueue(reply_sse([{"n": 1}, {"n": 2}, {"n": 3}], stall_after=2))
        seen = []
        async with client.stream("POST", f"{upstream.url}/chat/completions", json={}) as response:
            async for line in response.aiter_lines():
                if line:
                    seen.append(json.loads(line.removeprefix("data: ")))
                if len(seen) == 2:
                    break
            assert (upstream.open_connections, upstream.active_streams) == (1, 1)
        async with asyncio.timeout(2):
            await upstream.wait_idle()
        assert (upstream.open_connections, upstream.active_streams) == (0, 0)
    assert seen == [{"n": 1}, {"n": 2}]


async def test_replay_queue_order_default_and_recorded_requests() -> None:
    async with ReplayUpstream(models=["a", "b"]) as upstream, httpx.AsyncClient() as client:
        upstream.enqueue(reply_json(200, {"reply": "first"}))
        upstream.enqueue(reply_json(201, {"reply": "again"}), repeat=2)
        upstream.enqueue(reply_json(403, {"error": "nope"}), path="/v1/credits")
        url = upstream.url
        first = await client.post(f"{url}/chat/completions", json={"n": 0}, headers={"X-Trace": "t0"})
        statuses = [first.status_code]
        models = await client.get(f"{url}/models")
        statuses += [(await client.post(f"{url}/chat/completions", json={"n": n})).status_code for n in (1, 2, 3)]
        credits = await client.get(f"{url}/credits?verbose=1")
        upstream.set_default(reply_json(202, {"reply": "default"}))
        fallback = await client.post(f"{url}/completions", json={"n": 4})
    assert statuses == [200, 201, 201, 500]
    assert models.json()["data"] == [
        {"id": "a", "object": "model", "owned_by": "replay"},
        {"id": "b", "object": "model", "owned_by": "replay"},
    ]
    assert (credits.status_code, fallback.status_code, fallback.json()) == (403, 202, {"reply": "default"})
    assert [r.json()["n"] if r.body else None for r in upstream.requests] == [0, 1, 2, 3, None, 4]
    assert [r.path for r in upstream.requests][-2:] == ["/v1/credits?verbose=1", "/v1/completions"]
    assert upstream.requests[0].headers["x-trace"] == "t0"
    assert upstream.requests[0].method == "POST"
    assert [p.path for p in upstream.probes] == ["/v1/models"]
    assert upstream.pending == 0


async def test_empty_queue_answers_500_naming_the_request() -> None:
    async with ReplayUpstream() as upstream, httpx.AsyncClient() as client:
        response = await client.post(f"{upstream.url}/chat/completions", json={})
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "ReplayUpstream: no reply queued for POST /v1/chat/completions"


async def test_transcripts_load_and_replay() -> None:
    stream = load_transcript("mock_chat_stream")
    assert (stream.status, stream.chunked, stream.chunk_delay_s, len(stream.chunks)) == (200, True, 0.01, 4)
    async with ReplayUpstream() as upstream, httpx.AsyncClient() as client:
        upstream.enqueue("mock_chat_stream")
        upstream.enqueue("mock_rate_limited")
        upstream.enqueue("mock_reset_midstream")
        streamed = await client.post(f"{upstream.url}/chat/completions", json={})
        limited = await client.post(f"{upstream.url}/chat/completions", json={})
        with pytest.raises(httpx.ReadError):
            await client.post(f"{upstream.url}/chat/completions", json={})
    assert streamed.content == b"".join(stream.chunks)
    assert "content-length" not in streamed.headers  # the server owns the framing, not the transcript
    assert [d.get("content") for d in deltas(data_lines(streamed.text))] == ["Hel", "lo"]
    assert (limited.status_code, limited.headers["retry-after"]) == (429, "3")
    assert limited.json()["error"]["type"] == "rate_limit_error"


async def test_keep_alive_pipelining_and_chunked_request_bodies_raw() -> None:
    async with ReplayUpstream() as upstream:
        upstream.enqueue(reply_json(200, {"i": 0}, first_byte_delay_s=0.05))
        upstream.enqueue(reply_sse([{"i": 1}], chunk_delay_s=0.01))
        upstream.enqueue(reply_json(200, {"i": 2}), repeat=2)
        reader, writer = await asyncio.open_connection("127.0.0.1", upstream.port)
        writer.write(
            b'POST /v1/a HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n{"a":1}'
            b"POST /v1/b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'5;ext=1\r\n{"b":\r\n2\r\n2}\r\n0\r\nX-Trailer: y\r\n\r\n'
            b"GET /v1/c HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        replies = [await read_response(reader) for _ in range(3)]
        for byte in b"POST /v1/d HTTP/1.1\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}":
            writer.write(bytes([byte]))
            await writer.drain()
        last = await read_response(reader)
        assert await reader.read() == b""  # closed after `Connection: close`
        writer.close()
        assert upstream.open_connections <= 1
    assert [json.loads(body) for _, _, body in replies[::2]] == [{"i": 0}, {"i": 2}]
    assert replies[1][2] == b'data: {"i":1}\n\ndata: [DONE]\n\n'
    assert last == (200, {"content-type": "application/json", "content-length": "7"}, b'{"i":2}')
    assert [(r.method, r.path, r.body) for r in upstream.requests] == [
        ("POST", "/v1/a", b'{"a":1}'),
        ("POST", "/v1/b", b'{"b":2}'),
        ("GET", "/v1/c", b""),
        ("POST", "/v1/d", b"{}"),
    ]


async def test_malformed_request_gets_400_and_close() -> None:
    async with ReplayUpstream() as upstream:
        reader, writer = await asyncio.open_connection("127.0.0.1", upstream.port)
        writer.write(b"NONSENSE\r\n\r\n")
        status, _, body = await read_response(reader)
        assert await reader.read() == b""
        writer.close()
    assert status == 400
    assert json.loads(body)["error"]["message"] == "malformed request line"


async def test_module_runs_as_a_command_until_sigterm() -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "devtools.mock_upstream",
        "--port",
        str(port),
        "--chunks",
        "3",
        "--model",
        "cli-model",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert line == f"mock-upstream listening on http://127.0.0.1:{port}/v1\n".encode()
        async with httpx.AsyncClient() as client:
            models = await client.get(f"http://127.0.0.1:{port}/v1/models")
            chat = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"messages": []})
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        returncode = await asyncio.wait_for(proc.wait(), 10)
    assert returncode == 0
    assert models.json()["data"][0]["id"] == "cli-model"
    assert chat.json()["model"] == "cli-model"
    assert chat.json()["choices"][0]["message"]["content"] == "The quick brown"


def test_main_rejects_bad_usage() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--chunks", "-1"])
    assert exit_info.value.code == 2


async def test_main_returns_1_when_the_port_is_taken() -> None:
    with occupied_port() as port:
        assert await asyncio.to_thread(main, ["--port", str(port)]) == 1
