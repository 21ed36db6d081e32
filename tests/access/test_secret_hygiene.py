"""Secrets and prompts kept out of logs, error messages and upstream request heads (README: the
log holds "never a key, a request body or a prompt"; access.md: "no secret ever reaches a log
line ... or an error"): an upstream's error code that echoes the prompt, a key variable with a
trailing newline, a database URL whose password the parser quotes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httptools
import msgspec
import pytest

from app.settings import ConfigError, provider_configs, settings_from_mapping
from tests.access.conftest import ADMIN, CATALOG, bearer, keyed_gateway
from tests.support.client import COMPLETIONS, body
from tests.support.gateway import StartGateway, provider_table
from tests.support.logs import Logs
from tests.support.upstream import ReplayUpstream, reply_json

PROMPT = "my-private-prompt-text-4711"
UP_KEY = "fr_live_0123456789abcdefghijklmnopqrstuv"
KEY_ENV = "AUDSEC_UPSTREAM_KEY"


# -- 1. an upstream's error `code` is logged as it came: the prompt it echoes, at any length ---------


@pytest.mark.parametrize("status", [401, 402, 403])
async def test_an_upstream_error_code_does_not_carry_the_prompt_into_the_log(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch, logs: Logs, status: int
) -> None:
    """README, the log: "never a key, a request body or a prompt". A proxy upstream that quotes the
    request in its error `code` (or `type`, read when `code` is an int) put it in
    `provider_disabled` / `backend_forbidden`, whole (up to the 64 KiB error body)."""
    gw = await keyed_gateway(start_gateway, up, monkeypatch)
    echoed = f"rejected request: {PROMPT} " + "x" * 20_000
    up.enqueue(reply_json(status, {"error": {"message": "no", "type": "auth", "code": echoed}}))
    response = await gw.client.post(COMPLETIONS, json=body("chat", text=PROMPT), headers=bearer(ADMIN))
    assert response.status_code == 502
    logs.lines("request", gw)
    assert PROMPT not in logs.raw
    assert max(len(line) for line in logs.raw.splitlines()) < 4096


# -- 2. a key variable's trailing newline goes into the upstream's request head as it is ------------


class StrictUpstream:
    """An upstream that parses heads as uvicorn does (httptools: vLLM, SGLang, transformers serve):
    a bare LF in a header is a 400 `Invalid HTTP request received.`, as uvicorn answers it."""

    def __init__(self) -> None:
        self.authorization: list[bytes] = []
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        done: list[bool] = []
        headers: dict[bytes, bytes] = {}

        class Sink:
            def on_header(self, name: bytes, value: bytes) -> None:
                headers[name.lower()] = value

            def on_message_complete(self) -> None:
                done.append(True)

        parser = httptools.HttpRequestParser(Sink())
        try:
            while not done and (data := await reader.read(65536)):
                parser.feed_data(data)
        except httptools.HttpParserError:
            writer.write(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"content-length: 30\r\nconnection: close\r\n\r\nInvalid HTTP request received."
            )
        else:
            self.authorization.append(headers.get(b"authorization", b""))
            answer = msgspec.json.encode(
                {
                    "id": "c1",
                    "object": "chat.completion",
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                }
            )
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(answer), answer)
            )
        await writer.drain()
        writer.close()


@pytest.fixture
async def strict() -> AsyncIterator[StrictUpstream]:
    upstream = StrictUpstream()
    upstream.server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    yield upstream
    upstream.server.close()
    await upstream.server.wait_closed()


async def test_a_key_variable_ending_in_a_newline_is_not_sent_raw(
    start_gateway: StartGateway, strict: StrictUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """config.md: keys are named by environment variable. A secret mounted from a file (Kubernetes,
    `FOO=$(cat key)` keeps no newline, `--from-file` and `.env` editors often do) ends in `\\n`: it
    went into `authorization: Bearer …\\n\\r\\n` as it was, so a strict upstream refused every request
    with 400, which the gateway passed on as the client's fault (and CR/LF in it splits the head).
    The key is sent without the whitespace around it (a control character inside it: exit 2)."""
    monkeypatch.setenv(KEY_ENV, UP_KEY + "\n")
    providers = {"up": {"kind": "openai_compatible", "base_url": strict.url, "api_key_env": KEY_ENV}}
    gw = await start_gateway(providers=providers, catalog=CATALOG)
    response = await gw.client.post(COMPLETIONS, json=body("chat"))
    assert response.status_code == 200, response.text
    assert strict.authorization == [f"Bearer {UP_KEY}".encode()]


def test_a_key_variable_with_a_line_break_inside_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """CR/LF inside the value split the upstream's request head (`authorization: Bearer a` and a
    header of the value's choosing): refused, naming the option, never quoting the value."""
    monkeypatch.setenv(KEY_ENV, "abc\r\nx-injected: 1")
    provider = {"kind": "openai_compatible", "base_url": "http://127.0.0.1:9/v1", "api_key_env": KEY_ENV}
    raw: dict[str, object] = {"database": {"url": "sqlite+aiosqlite:///x.db"}, "providers": {"up": provider}}
    settings = settings_from_mapping(raw, base_dir=tmp_path, source="config.toml")
    with pytest.raises(ConfigError, match=f"providers.up.api_key_env: the variable {KEY_ENV}") as refused:
        provider_configs(settings)
    assert "x-injected" not in str(refused.value)


async def test_an_admin_key_variable_ending_in_a_newline_still_authenticates(
    start_gateway: StartGateway, up: ReplayUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """access.md: the admin key is the secret in the variable `[auth] admin_key_env` names. A
    presented key is stripped (`KeyRing.authenticate`), the variable's value was not: with a
    trailing newline the admin key was refused for ever (401), and the keys API with it."""
    monkeypatch.setenv("AUDSEC_ADMIN_KEY", ADMIN + "\n")
    auth = {"mode": "keys", "admin_key_env": "AUDSEC_ADMIN_KEY"}
    gw = await start_gateway(providers=provider_table({"up": up}), catalog=CATALOG, auth=auth)
    assert (await gw.client.get("/api/v1/keys", headers=bearer(ADMIN))).status_code == 200


# -- 3. a URL's config error quotes the password ----------------------------------------------------


@pytest.mark.parametrize(
    ("key", "url"),
    [
        ("database", "postgresql+asyncpg://switchyard:Hunter2/k9Q@db.internal:5432/switchyard"),
        ("redis", "redis://:Hunter2?k9Q@redis.internal:6379/0"),
    ],
)
def test_a_url_refused_at_start_does_not_quote_its_password(key: str, url: str) -> None:
    """config.md: exit 2 with a message naming the key; access.md's spirit: no secret in an error.
    A password holding `/`, `?` or `#` unescaped (base64 passwords hold `/`) made the port unreadable,
    and the message quoted urllib's `Port could not be cast to integer value as 'Hunter2'`, which
    the start-up prints on stderr (the container's log)."""
    raw: dict[str, object] = {"database": {"url": "sqlite+aiosqlite:///x.db"}, key: {"url": url}}
    with pytest.raises(ConfigError) as refused:
        settings_from_mapping(raw, base_dir=None, source="config.toml")  # type: ignore[arg-type]
    assert f"{key}.url" in str(refused.value)
    assert "Hunter2" not in str(refused.value)
