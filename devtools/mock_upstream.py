"""`switchyard mock-upstream`: a scripted OpenAI-compatible upstream, for trying Switchyard and benchmarks.

`ScriptedResponder` answers chat/text completions, `/models`, `/health` and vLLM-style `/metrics`
like a vLLM server would, from `ScriptedOptions`: fixed latency, chunking, reasoning, a tool call
and injected failures (a status with `Retry-After` on every N-th completion, or a reset after N
chunks); a text completion also carries log probabilities and the echoed prompt when the request
asks (`logprobs`, `echo`). The reply bytes come from `devtools.mock_openai` (built once per
endpoint, model and `logprobs`; per request with `echo`); the HTTP
server under it is `devtools.mock_http.MockUpstreamServer`, the same one the tests' replay server uses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import signal
import sys
import time
from collections.abc import Callable

import msgspec

from devtools.mock_http import MockUpstreamServer, ReceivedRequest, Reply, error_reply
from devtools.mock_openai import (
    CHAT_PATH,
    DEFAULT_TEXT,
    DONE_FRAME,
    TEXT_PATH,
    CompletionRequest,
    Plan,
    ScriptedOptions,
    build_plan,
    json_body,
    usage_for,
    usage_frame,
)

_SSE_HEADERS = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
_JSON_HEADERS = [("content-type", "application/json")]


class ScriptedResponder:
    """Answers like a vLLM-style server would, from `ScriptedOptions`; deterministic bytes."""

    def __init__(self, options: ScriptedOptions) -> None:
        self.options = options
        self.running: Callable[[], int] = lambda: 0  # wired to the server's active_streams
        self.created = int(time.time())
        self._completions = 0
        self._plans: dict[tuple[str, str, int | None], Plan] = {}
        self._decoder = msgspec.json.Decoder(CompletionRequest)
        models = {"object": "list", "data": [{"id": options.model, "object": "model", "owned_by": "mock"}]}
        self._models_reply = Reply(200, _JSON_HEADERS, [msgspec.json.encode(models)])

    def respond(self, request: ReceivedRequest) -> Reply:
        path = request.path.partition("?")[0]
        if request.method == "POST" and path in (CHAT_PATH, TEXT_PATH):
            return self._complete(path, request)
        if request.method == "GET" and path == "/v1/models":
            return self._models_reply
        if request.method == "GET" and path == "/health":
            return Reply(200)
        if request.method == "GET" and path == "/metrics":
            return self._metrics()
        return error_reply(404, f"no route for {request.method} {path}")

    def _complete(self, path: str, request: ReceivedRequest) -> Reply:
        try:
            parsed = self._decoder.decode(request.body)
        except msgspec.DecodeError as exc:
            return error_reply(400, f"invalid request body: {exc}")
        opts = self.options
        self._completions += 1
        faulty = self._completions % max(1, opts.fail_every) == 0
        delay = opts.latency_ms / 1000
        if faulty and opts.fail_status is not None:
            retry = [] if opts.retry_after is None else [("retry-after", str(opts.retry_after))]
            reply = error_reply(opts.fail_status, "injected failure", retry)
            reply.first_byte_delay_s = delay
            return reply
        model = parsed.model or opts.model
        plan = self._plan(path, model, parsed)
        usage = usage_for(plan, request.body, parsed.max_completion_tokens or parsed.max_tokens)
        reset = opts.reset_after if faulty else None
        if not parsed.stream:
            body = json_body(plan, usage)
            if reset is None:
                return Reply(200, _JSON_HEADERS, [body], 0.0, delay)
            half = len(body) // 2  # a reset lands mid-body: the client sees a truncated JSON reply
            return Reply(200, _JSON_HEADERS, [body[:half], body[half:]], 0.0, delay, min(reset, 1))
        tail = [DONE_FRAME]
        if parsed.stream_options is not None and parsed.stream_options.include_usage:
            tail.insert(0, usage_frame(path, self.created, model, usage))
        paced = opts.chunk_delay_ms / 1000
        if not paced and reset is None:  # nothing observes the event boundaries: one HTTP chunk
            return Reply(200, _SSE_HEADERS, [plan.joined, *tail], 0.0, delay, chunked=True)
        return Reply(200, _SSE_HEADERS, [*plan.frames, *tail], paced, delay, reset, chunked=True)

    def _metrics(self) -> Reply:
        name = self.options.model
        gauges = [
            ("vllm:num_requests_running", self.running()),
            ("vllm:num_requests_waiting", self.options.metrics_waiting),
            ("vllm:kv_cache_usage_perc", 0),
        ]
        text = "".join(f'# TYPE {g} gauge\n{g}{{model_name="{name}"}} {float(v)}\n' for g, v in gauges)
        return Reply(200, [("content-type", "text/plain; version=0.0.4")], [text.encode()])

    def _plan(self, path: str, model: str, parsed: CompletionRequest) -> Plan:
        logprobs = parsed.logprobs if path == TEXT_PATH and type(parsed.logprobs) is int else None
        if path == TEXT_PATH and parsed.echo:  # the prompt is part of the reply: built per request
            return build_plan(self.options, self.created, path, model, logprobs, _prompt_of(parsed))
        key = (path, model, logprobs)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= 256:
                self._plans.clear()
            plan = self._plans[key] = build_plan(self.options, self.created, path, model, logprobs)
        return plan


def _prompt_of(parsed: CompletionRequest) -> str:
    """A text completion's prompt: a string, or the one string of an array (else empty)."""
    prompt = parsed.prompt
    if isinstance(prompt, list):
        prompt = prompt[0] if len(prompt) == 1 else None
    return prompt if isinstance(prompt, str) else ""


# --- command line -------------------------------------------------------------------------------


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _port(text: str) -> int:
    value = _count(text)
    if value > 65535:  # the socket would take it modulo 65536: 70000 listened on 4464
        raise argparse.ArgumentTypeError(f"must be <= 65535, got {value}")
    return value


def _delay(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}") from None
    if not 0 <= value <= 3_600_000:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be 0 to 3600000 ms, got {text}")
    return value


def _status(text: str) -> int:
    value = _count(text)
    if not 400 <= value <= 599:  # an error status: 99 or 1000 made an answer no client reads
        raise argparse.ArgumentTypeError(f"must be an error status, 400 to 599, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchyard mock-upstream",
        description="A scripted OpenAI-compatible upstream for trying Switchyard and benchmarks.",
    )
    add = parser.add_argument
    add("--host", default="127.0.0.1")
    add("--port", type=_port, default=9100, help="0 picks a free port (printed on start)")
    add("--model", default="mock-model", help="the name /v1/models reports; requests may name any")
    add("--latency-ms", type=_delay, default=0.0, help="delay before the first byte of a completion")
    add("--chunk-delay-ms", type=_delay, default=0.0, help="delay between streamed chunks")
    add("--chunks", type=_count, default=64, help="content chunks per completion")
    add("--tokens-per-chunk", type=_count, default=1)
    add("--text", default=DEFAULT_TEXT, help="reply text, repeated word by word as needed")
    add("--reasoning-chunks", type=_count, default=0, help="reasoning_content chunks before the text")
    add("--tool-call", metavar="NAME", help="end the reply with one call to this function")
    add("--fail-status", type=_status, help="answer faulty requests with this status (429, 500, 503 ...)")
    add("--fail-every", type=_count, default=1, help="every N-th completion request is faulty")
    add("--retry-after", type=_count, help="Retry-After seconds on injected failures")
    add("--reset-after", type=_count, help="reset faulty connections after N chunks")
    add("--metrics-waiting", type=_count, default=0, help="vllm:num_requests_waiting in /metrics")
    return parser


def _options(ns: argparse.Namespace) -> ScriptedOptions:
    return ScriptedOptions(
        model=ns.model,
        latency_ms=ns.latency_ms,
        chunk_delay_ms=ns.chunk_delay_ms,
        chunks=ns.chunks,
        tokens_per_chunk=ns.tokens_per_chunk,
        text=ns.text,
        reasoning_chunks=ns.reasoning_chunks,
        tool_call=ns.tool_call,
        fail_status=ns.fail_status,
        fail_every=ns.fail_every,
        retry_after=ns.retry_after,
        reset_after=ns.reset_after,
        metrics_waiting=ns.metrics_waiting,
    )


def scripted_server(options: ScriptedOptions, host: str = "127.0.0.1", port: int = 0) -> MockUpstreamServer:
    """A server around a `ScriptedResponder` whose /metrics reports the server's in-flight replies."""
    responder = ScriptedResponder(options)
    server = MockUpstreamServer(responder, host, port)
    responder.running = lambda: server.active_streams
    return server


async def serve_forever(options: ScriptedOptions, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM (or cancellation), then close every connection."""
    server = scripted_server(options, host, port)
    await server.start()
    print(f"mock-upstream listening on {server.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        # not the main thread, or a loop/platform without signal handlers: Ctrl-C still ends it
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await server.close()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(args: list[str]) -> int:
    ns = _parser().parse_args(args)
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve_forever(_options(ns), ns.host, ns.port))
    except OSError as exc:
        print(f"mock-upstream: cannot serve on {ns.host}:{ns.port}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
