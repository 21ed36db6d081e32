"""Micro-benchmark: the adapter's plain-HTTP hot path against a real loopback upstream.

`devtools.mock_upstream` runs in its own process (64 content chunks per stream); this process
calls `Provider.events` in rounds of 20 requests: 20 whole answers one after another, 20
streamed answers one after another, and 20 whole answers at once. It prints the client's CPU
time per request (`time.process_time`, this process only) and the wall time, best and median of
`--repeats` runs, so two trees can be compared on a busy machine:

    PYTHONPATH=. .venv/bin/python bench/upstream_loop.py --rounds 60 --repeats 7

Run it for both trees one after another (same mock, same machine state) and compare the best
CPU figures; a difference under a few percent is noise on a shared two-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

import msgspec
import uvloop
from providers.adapter import Provider, make_client
from providers.config import ProviderConfig
from providers.types import CompletionRequest

REQUEST = msgspec.convert(
    {"messages": [{"role": "user", "content": [{"kind": "text", "data": "hi"}]}], "max_tokens": 8}, CompletionRequest
)
SCENARIOS = {"whole, 20 in a row": (False, 1), "stream, 20 in a row": (True, 1), "whole, 20 at once": (False, 20)}


async def drain(adapter: Provider, stream: bool) -> None:
    async for _ in adapter.events(REQUEST, "mock-model", stream=stream):
        pass


async def run_round(adapter: Provider, stream: bool, concurrency: int) -> None:
    if concurrency == 1:
        for _ in range(20):
            await drain(adapter, stream)
    else:
        await asyncio.gather(*(drain(adapter, stream) for _ in range(20)))


async def measure(url: str, rounds: int, repeats: int) -> dict[str, list[tuple[float, float]]]:
    client = make_client()
    adapter = Provider(ProviderConfig(name="local", kind="local", base_url=url), client)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in SCENARIOS}
    try:
        for _ in range(repeats):
            for name, (stream, concurrency) in SCENARIOS.items():
                await run_round(adapter, stream, concurrency)  # warm-up
                cpu, wall = time.process_time(), time.perf_counter()
                for _ in range(rounds):
                    await run_round(adapter, stream, concurrency)
                count = rounds * 20
                cpu_us = (time.process_time() - cpu) / count * 1e6
                results[name].append((cpu_us, (time.perf_counter() - wall) / count * 1e6))
    finally:
        await client.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    mock = subprocess.Popen(
        [sys.executable, "-m", "devtools.mock_upstream", "--port", "0", "--chunks", "64"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert mock.stdout is not None
        url = mock.stdout.readline().split()[-1]
        results = uvloop.run(measure(url, args.rounds, args.repeats))
    finally:
        mock.terminate()
        mock.wait()
    print(f"{'µs per request':22}{'CPU best':>10}{'CPU median':>12}{'wall best':>11}{'wall median':>13}")
    for name, runs in results.items():
        cpu = [run[0] for run in runs]
        wall = [run[1] for run in runs]
        row = (min(cpu), statistics.median(cpu), min(wall), statistics.median(wall))
        cells = (f"{value:>{width}.1f}" for value, width in zip(row, (10, 12, 11, 13), strict=True))
        print(f"{name:22}" + "".join(cells))


if __name__ == "__main__":
    main()
