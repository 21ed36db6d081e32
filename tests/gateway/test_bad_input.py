"""Bad input gets a clean 4xx naming the field, never a 500, a traceback or an upstream call.

One table through real HTTP: each case is what a careless or hostile client sends (deep JSON in
every free-form field, missing or absurd fields, prompts that cannot fit, client values megabytes
long, wrong media types, wrong methods, oversized headers) and the exact status and `error.param`
it must get. Every error body stays short, whatever the client sent.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import httpx
import msgspec
import pytest

from tests.support.gateway import GatewayHandle
from tests.support.upstream import ReplayUpstream

USER = {"role": "user", "content": [{"kind": "text", "data": "hi"}]}
IMAGE = "https://x.test/a.png"
THINKING_REDACTED = {"kind": "thinking", "data": {"text": "OPAQUE", "signature": "s", "redacted": True}}
NOT_REDACTED = {"kind": "redacted_thinking", "data": {"text": "OPAQUE", "signature": "s", "redacted": False}}
JSON = {"content-type": "application/json"}


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def body(fields: dict[str, Any], *, raw: dict[str, bytes] | None = None) -> bytes:
    """`fields` as JSON, plus `raw` fields spliced in as they are (too deep for any encoder)."""
    encoded = msgspec.json.encode(fields)[:-1]
    for key, value in (raw or {}).items():
        encoded += (b"," if len(encoded) > 1 else b"") + msgspec.json.encode(key) + b":" + value
    return encoded + b"}"


def tool_call(arguments: bytes) -> bytes:
    return b'[{"role":"assistant","content":[{"kind":"tool_call","data":{"id":"1","name":"f","arguments":%s}}]}]' % (
        arguments
    )


def text(chars: int) -> dict[str, Any]:
    return {"role": "user", "content": [{"kind": "text", "data": "lorem ipsum " * (chars // 12)}]}


class Case(NamedTuple):
    name: str
    content: bytes
    status: int
    param: str | None
    headers: dict[str, str] = JSON
    method: str = "POST"
    path: str = "/api/v1/completions"
    answer_headers: dict[str, str] = {}  # expected in the answer


LONG = "x" * 5_000_000
CHAT = "/v1/chat/completions"
CHAT_USER = {"role": "user", "content": "hi"}
CHAT_TOOL = b'[{"type":"function","function":{"name":"f","parameters":%s}}]'
CASES = [
    Case("seed past 64 bits", body({"messages": [USER], "seed": 2**63}), 400, "seed"),  # vLLM's own 400 else
    Case(  # an opaque blob sent on as reasoning text, else
        "thinking marked redacted",
        body({"messages": [USER, {"role": "assistant", "content": [THINKING_REDACTED]}, USER]}),
        400,
        "messages[1].content[0].data.redacted",
    ),
    Case(  # accepted as it stood, while `redacted: true` on a `thinking` part is a 400 (api.md's table)
        "redacted_thinking marked not redacted",
        body({"messages": [USER, {"role": "assistant", "content": [NOT_REDACTED]}, USER]}),
        400,
        "messages[1].content[0].data.redacted",
    ),
    Case(  # a made-up empty id upstream, else
        "tool text without its call's id",
        body({"messages": [USER, {"role": "tool", "content": [{"kind": "text", "data": "18C"}]}]}),
        400,
        "messages[1].tool_call_id",
    ),
    Case(
        "tool text with an empty call id",
        body({"messages": [USER, {"role": "tool", "tool_call_id": "", "content": [{"kind": "text", "data": "18C"}]}]}),
        400,
        "messages[1].tool_call_id",
    ),
    # JSON nested ~990 deep (msgspec's RecursionError) and 100 deep (past the 64-level limit)
    Case("deep schema", body({"messages": [USER]}, raw={"schema": b'{"a":' + deep(990) + b"}"}), 400, "schema"),
    Case("deep schema, 100", body({"messages": [USER]}, raw={"schema": b'{"a":' + deep(100) + b"}"}), 400, "schema"),
    Case(
        "deep tool arguments",
        body({}, raw={"messages": tool_call(deep(990))}),
        400,
        "messages[0].content[0].data.arguments",
    ),
    Case(
        "deep tool arguments, 100",
        body({}, raw={"messages": tool_call(deep(100))}),
        400,
        "messages[0].content[0].data.arguments",
    ),
    Case(
        "deep tool result",
        body(
            {},
            raw={
                "messages": b'[{"role":"tool","tool_call_id":"1","content":[{"kind":"tool_result",'
                b'"data":{"tool_call_id":"1","content":' + deep(990) + b"}}]}]"
            },
        ),
        400,
        "messages[0].content[0].data.content",
    ),
    Case(
        "deep provider_options",
        body({"messages": [USER]}, raw={"provider_options": b'{"primary":{"top_k":' + deep(990) + b"}}"}),
        400,
        "provider_options.primary.top_k",
    ),
    Case(
        "deep tool parameters",
        body({"messages": [USER]}, raw={"tools": b'[{"name":"f","parameters":{"p":' + deep(990) + b"}}]"}),
        400,
        "tools[0].parameters",
    ),
    Case("deep unknown key", body({"messages": [USER]}, raw={"extra": deep(990)}), 400, "extra"),
    # missing and absurd fields
    Case("empty object", b"{}", 400, "messages"),
    *(
        Case(name, body({"messages": [{"role": "user", "content": [{"kind": "image", "data": data}]}]}), 400, param)
        for name, data, param in (
            ("a base64 data: URL that does not decode", {"url": "data:image/png;base64,!!!"}, "url"),
            ("a data: URL with no comma", {"url": "data:image/png;base64"}, "url"),
            ("an empty data: URL", {"url": "data:image/png;base64,"}, "url"),
            ("an https URL without a host", {"url": "https://"}, "url"),
            ("an https URL with a broken IPv6 host", {"url": "https://[::1/a.png"}, "url"),
            ("an https URL that NFKC normalization changes", {"url": "https://exa\uff03mple.com/x"}, "url"),
            ("an https URL with port 99999", {"url": "https://x.test:99999/a.png"}, "url"),
            ("empty bytes", {"data": []}, "data"),
            ("a media type that is not one", {"data": "iVBORw==", "media_type": 'a"b;c'}, "media_type"),
        )
        for param in (f"messages[0].content[0].data.{param}",)
    ),
    Case("an empty stop sequence", body({"messages": [USER], "stop_sequences": ["END", ""]}), 400, "stop_sequences[1]"),
    Case(
        "an image in an assistant's turn",
        body({"messages": [USER, {"role": "assistant", "content": [{"kind": "image", "data": {"url": IMAGE}}]}]}),
        400,
        "messages[1].content[0].kind",
    ),
    Case(
        "a message without parts",
        body({"messages": [USER, {"role": "user", "content": []}]}),
        400,
        "messages[1].content",
    ),
    Case("model only", b'{"model":"chat-1"}', 400, "messages"),
    Case("max_tokens 1e23", body({"messages": [USER]}, raw={"max_tokens": b"1" + b"0" * 23}), 400, "max_tokens"),
    Case("max_tokens over max_output", body({"messages": [USER], "max_tokens": 4097}), 400, "max_tokens"),
    Case("prompt over the context window", body({"messages": [text(300_000)]}), 400, "messages"),
    Case("prompt plus max_tokens over", body({"messages": [text(250_000)], "max_tokens": 4096}), 400, "messages"),
    # named by the part holding most of it
    Case("a system text over the context window", body({"messages": [USER], "system": "s" * 300_000}), 400, "system"),
    Case(
        "a schema over the context window",
        body({"messages": [USER], "schema": {"type": "object", "description": "d" * 300_000}}),
        400,
        "schema",
    ),
    Case(
        "tools over the context window",
        body({"messages": [USER], "tools": [{"name": "f", "description": "d" * 300_000}]}),
        400,
        "tools",
    ),
    # client values megabytes long: echoed as a short prefix
    Case("5 MB model name", body({"model": LONG, "messages": [USER]}), 400, "model"),
    Case("5 MB provider pin", body({"provider": LONG, "messages": [USER]}), 400, "provider"),
    Case(
        "5 MB content kind",
        body({"messages": [{"role": "user", "content": [{"kind": LONG, "data": "x"}]}]}),
        400,
        "messages[0].content[0].kind",
    ),
    Case("5 MB role", body({"messages": [{"role": LONG, "content": []}]}), 400, "messages[0].role"),
    Case(
        "5 MB named tool",
        body({"messages": [USER], "tools": [{"name": "f"}], "tool_choice": {"mode": "named", "tool_name": LONG}}),
        400,
        "tool_choice.tool_name",
    ),
    Case(
        "provider_options raising max_tokens past what the request reserved",
        body({"messages": [USER], "max_tokens": 10, "provider_options": {"primary": {"max_tokens": 100_000}}}),
        400,
        "provider_options.primary.max_tokens",
    ),
    Case(
        "provider_options for a provider not an object (the key named: it read `provider_options[...]`)",
        body({"messages": [USER], "provider_options": {"primary": 5}}),
        400,
        "provider_options.primary",
    ),
    Case(
        "provider_options asking several answers",
        body({"messages": [USER], "provider_options": {"primary": {"n": 3}}}),
        400,
        "provider_options.primary.n",
    ),
    Case(
        "5 MB provider_options key",
        body({"messages": [USER], "provider_options": {LONG: {}}}),
        400,
        f"provider_options.{'x' * 64}…",
    ),
    # the OpenAI chat door: its own paths, the same rules
    *(
        Case(name, msgspec.json.encode({"messages": [{"role": "user", "content": [part]}]}), 400, param, path=CHAT)
        for name, part, param in (
            (
                "chat: an https URL with a broken IPv6 host",
                {"type": "image_url", "image_url": {"url": "https://[::1/a.png"}},
                "messages[0].content[0].image_url.url",
            ),
            (
                "chat: a file's data: URL that does not decode",
                {"type": "file", "file": {"file_data": "data:application/pdf;base64,@@@"}},
                "messages[0].content[0].file.file_data",
            ),
            (
                "chat: empty file data",
                {"type": "file", "file": {"file_data": ""}},
                "messages[0].content[0].file.file_data",
            ),
            (
                "chat: empty audio",
                {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
                "messages[0].content[0].input_audio.data",
            ),
        )
    ),
    *(
        Case(
            f"chat: deep tool parameters, {levels}",
            body({"messages": [CHAT_USER]}, raw={"tools": CHAT_TOOL % (b'{"p":' + deep(levels) + b"}")}),
            400,
            "tools[0].function.parameters",
            path=CHAT,
        )
        for levels in (100, 990)  # 100: decoded, then refused; 990: too deep for msgspec
    ),
    *(
        Case(
            f"chat: deep response schema, {levels}",
            body(
                {"messages": [CHAT_USER]},
                raw={
                    "response_format": b'{"type":"json_schema","json_schema":{"name":"s","schema":{"a":%s}}}'
                    % deep(levels)
                },
            ),
            400,
            "response_format.json_schema.schema",
            path=CHAT,
        )
        for levels in (100, 990)
    ),
    Case(
        "chat: max_tokens out of range beside max_completion_tokens",
        body({"messages": [CHAT_USER], "max_completion_tokens": 16, "max_tokens": 2**70}),
        400,
        "max_tokens",
        path=CHAT,
    ),
    Case(
        "chat: 5 MB named tool",
        body(
            {
                "messages": [CHAT_USER],
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": LONG}},
            }
        ),
        400,
        "tool_choice.function.name",
        path=CHAT,
    ),
    # media types and encodings
    Case("no content-type is JSON", b"{}", 400, "messages", headers={}),
    Case("+json content-type", b"{}", 400, "messages", headers={"content-type": "application/vnd.api+json"}),
    Case("form content-type", b"{}", 415, None, headers={"content-type": "application/x-www-form-urlencoded"}),
    Case("text/plain", b"{}", 415, None, headers={"content-type": "text/plain"}),
    Case("utf-16 charset", b"{}", 415, None, headers={"content-type": "application/json; charset=utf-16"}),
    Case("gzip body", b"{}", 415, None, headers={**JSON, "content-encoding": "gzip"}),
    # methods
    Case("GET completions", b"", 405, None, headers={}, method="GET", answer_headers={"allow": "POST"}),
    Case("PUT completions", b"{}", 405, None, method="PUT", answer_headers={"allow": "POST"}),
    Case(
        "POST healthz", b"{}", 405, None, method="POST", path="/healthz", answer_headers={"allow": "GET, HEAD, OPTIONS"}
    ),
    # headers (answered by the connection guard, before the app)
    Case("101 headers", b"{}", 431, None, headers={**JSON, **{f"x-h{i}": "v" for i in range(101)}}),
    Case("40 KiB header", b"{}", 431, None, headers={**JSON, "x-big": "v" * 40_000}),
]


async def test_bad_input_gets_a_clean_4xx(
    gw: GatewayHandle, primary: ReplayUpstream, capfd: pytest.CaptureFixture[str]
) -> None:
    problems: list[str] = []
    for case in CASES:
        response = await gw.client.request(case.method, case.path, content=case.content, headers=case.headers)
        problems += [f"{case.name}: {problem}" for problem in _problems(case, response)]
    assert problems == [], "\n".join(problems)
    assert primary.requests == []
    await gw.close()  # flushes the log
    logged = capfd.readouterr()
    for trace in ("Traceback", "unhandled_exception", "Exception in ASGI application", '"level":"error"'):
        assert trace not in logged.out + logged.err


def _problems(case: Case, response: httpx.Response) -> list[str]:
    if response.headers.get("content-type") != "application/json":
        return [f"{response.status_code} {response.headers.get('content-type')} {response.text[:200]}"]
    error = response.json()["error"]
    got = (response.status_code, error.get("param"))
    problems = [] if got == (case.status, case.param) else [f"got {str(got)[:200]}: {error['message'][:200]}"]
    if len(response.content) > 1024:
        problems.append(f"a {len(response.content)}-byte error body")
    if error["request_id"] != response.headers["x-request-id"]:
        problems.append("request ids differ")
    problems += [
        f"header {name}: {response.headers.get(name)!r}"
        for name, value in case.answer_headers.items()
        if response.headers.get(name) != value
    ]
    return problems
