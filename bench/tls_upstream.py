"""The adapter against a loopback TLS upstream: whole and streamed answers through `Provider.events`.

Not the gateway: the adapter and the transport alone (with the mock upstream, and its TLS, in the
same process), so it compares what reaching an `https://` provider costs in two trees. Run it once
per tree, the tree chosen by PYTHONPATH (a `git archive` of the base in /tmp/wt-base, say):

    PYTHONPATH=/tmp/wt-base .venv/bin/python bench/tls_upstream.py base
    PYTHONPATH=$PWD .venv/bin/python bench/tls_upstream.py new

It prints requests per second and CPU µs per request (client and server together) for 4,000
requests over 16 concurrent callers, after 320 to warm up, whole answers then streams.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop
from devtools.mock_http import Reply
from providers.adapter import Provider, make_client
from providers.config import ProviderConfig
from providers.types import CompletionRequest, Message, TextPart
from tests.support.upstream import ReplayUpstream

WHOLE = (
    b'{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hello there"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}'
)
REQUESTS, CALLERS = 4000, 16


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "c.pem", directory / "k.pem"
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", *subject]
    subprocess.run([*command, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


async def measure(label: str, cert: Path, key: Path, stream: bool) -> None:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    async with ReplayUpstream(ssl=server) as upstream:
        upstream.set_default(
            "vllm_text_stream" if stream else Reply(200, [("content-type", "application/json")], [WHOLE])
        )
        client = make_client(ssl_context=ssl.create_default_context(cafile=str(cert)))
        provider = Provider(ProviderConfig(name="p", kind="fastrun", base_url=upstream.url, api_key="k"), client)
        request = CompletionRequest(messages=[Message(role="user", content=[TextPart(data="hi")])])

        async def caller(count: int) -> None:
            for _ in range(count):
                async for _event in provider.events(request, "m", stream=stream):
                    pass

        await asyncio.gather(*[caller(20) for _ in range(CALLERS)])
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*[caller(REQUESTS // CALLERS) for _ in range(CALLERS)])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        kind = "streamed" if stream else "whole"
        print(f"{label} {kind}: {REQUESTS / wall:,.0f} req/s, {cpu / REQUESTS * 1e6:.1f} µs CPU/req")
        await client.aclose()


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "tree"
    with tempfile.TemporaryDirectory() as directory:
        cert, key = self_signed(Path(directory))
        for stream in (False, True):
            uvloop.run(measure(label, cert, key, stream))


if __name__ == "__main__":
    main()
