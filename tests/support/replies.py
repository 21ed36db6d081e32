"""What an OpenAI-compatible upstream says, as `Reply`s for `ReplayUpstream`: stream chunks, whole
answers, fastrun-style errors, and the answers to health and queue-depth probes."""

from __future__ import annotations

from typing import Any

from devtools.mock_http import Reply
from tests.support.upstream import reply_json, reply_sse


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """One `chat.completion.chunk`; `delta=None` gives an empty `choices` (a usage-only chunk)."""
    body: dict[str, Any] = {"id": "chatcmpl-r1", "object": "chat.completion.chunk"}
    body["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body.update(extra)
    return body


def usage_chunk(prompt: int, completion: int, **details: Any) -> dict[str, Any]:
    return chunk(None, usage={"prompt_tokens": prompt, "completion_tokens": completion, **details})


def tool_delta(index: int, *, id: str | None = None, name: str | None = None, args: str = "") -> dict[str, Any]:
    """A delta carrying one tool-call fragment (`id`/`name` only where the upstream sends them)."""
    call: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if id is not None:
        call["id"] = id
        call["type"] = "function"
    if name is not None:
        call["function"]["name"] = name
    return {"tool_calls": [call]}


def answer(text: str = "ok", **play: Any) -> Reply:
    """A whole 200 answer."""
    body = {
        "id": "chatcmpl-r1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    return reply_json(200, body, **play)


def stream_answer(text: str = "ok", **play: Any) -> Reply:
    """A complete 200 event stream: one text delta, the finish reason, usage, `[DONE]`."""
    usage = chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4})
    return reply_sse([chunk({"role": "assistant", "content": text}), chunk({}, "stop"), usage], **play)


def stalled_stream(text: str = "held") -> Reply:
    """One content chunk, then nothing: the connection stays open until the gateway goes away."""
    return reply_sse([chunk({"content": text}), chunk({}, "stop")], stall_after=1)


def error(status: int, type_: str = "upstream_error", headers: dict[str, str] | None = None, **play: Any) -> Reply:
    """A fastrun-style error body: `{"error": {"message", "type", "code": <int>}}`."""
    return reply_json(
        status, {"error": {"message": f"upstream says {status}", "type": type_, "code": status}}, headers, **play
    )


def models_reply(**play: Any) -> Reply:
    """The answer to a hosted kind's health probe (`GET …/v1/models`): an empty list, which says
    nothing of which models can serve (`Provider.probe_report`)."""
    return reply_json(200, {"object": "list", "data": []}, **play)


def metrics_reply(waiting: float) -> Reply:
    """A vLLM-style `/metrics` page reporting `waiting` queued requests."""
    text = f"vllm:num_requests_waiting {waiting}\nvllm:num_requests_running 1.0\n"
    return Reply(headers=[("content-type", "text/plain")], chunks=[text.encode()])
