"""Load and checks: `wrk` runs (the load generator, never Python) and `curl` sample checks.

`run_wrk` drives bench/lua/request.lua pinned to the load-generator CPUs and parses the one JSON
line its `done` hook prints. `check` sends one request with curl and says whether the answer is a
200 and, for streams, how many content chunks it carried (OpenAI `delta.content` chunks, or
Switchyard `text_delta` events), so a peer that cannot stream is reported, not silently measured.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from peers import Request

LUA = Path(__file__).resolve().parent / "lua" / "request.lua"


@dataclass(frozen=True)
class Measure:
    """One wrk run. Latencies in milliseconds; `error` set when wrk itself failed."""

    requests: int = 0
    seconds: float = 0.0
    non2xx: int = 0  # answers with status >= 400 (wrk's own count)
    socket_errors: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    error: str | None = None

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def failures(self) -> int:
        return self.non2xx + self.socket_errors

    @property
    def ok(self) -> bool:
        return self.error is None and self.requests > 0 and self.failures == 0


@dataclass(frozen=True)
class Check:
    """One curl sample: HTTP status, content chunks seen (streams) and a short reason on failure."""

    status: int
    chunks: int | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def body_file(run_dir: Path, request: Request) -> Path:
    path = run_dir / f"body-{hashlib.sha256(request.body).hexdigest()[:10]}.json"
    if not path.exists():
        path.write_bytes(request.body)
    return path


def run_wrk(
    request: Request,
    connections: int,
    seconds: float,
    cpus: str,
    run_dir: Path,
    max_requests: int | None = None,
) -> Measure:
    env = {
        **os.environ,
        "BENCH_BODY_FILE": str(body_file(run_dir, request)),
        "BENCH_PATH": request.path,
        "BENCH_HEADERS": "\n".join(f"{k}: {v}" for k, v in request.headers.items()),
    }
    if max_requests is not None:
        env["BENCH_MAX_REQUESTS"] = str(max_requests)
    argv = ["taskset", "-c", cpus, "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s"]
    argv += ["--timeout", "30s", "-s", str(LUA), f"http://127.0.0.1:{request.port}"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 120)
    line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH_JSON ")), None)
    if line is None:
        return Measure(error=f"wrk rc={done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
    data = json.loads(line.removeprefix("BENCH_JSON "))
    sock = data["connect_errors"] + data["read_errors"] + data["write_errors"] + data["timeouts"]
    return Measure(
        requests=data["requests"],
        seconds=data["duration_us"] / 1e6,
        non2xx=data["non2xx"],
        socket_errors=sock,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
    )


def check(request: Request, shape: str, stream: bool, expect_chunks: int = 64) -> Check:
    argv = ["curl", "-sS", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}", "-X", "POST"]
    argv += ["-H", "Content-Type: application/json", "--data-binary", request.body.decode()]
    for name, value in request.headers.items():
        argv += ["-H", f"{name}: {value}"]
    argv.append(f"http://127.0.0.1:{request.port}{request.path}")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    body, _, code = done.stdout.rpartition("\n")
    status = int(code) if code.strip().isdigit() else 0
    if status != 200:
        reason = (body.strip() or done.stderr.strip())[:160]
        return Check(status, problem=f"HTTP {status}: {reason}")
    if not stream:
        return Check(status)
    chunks = count_chunks(body, shape)
    if chunks != expect_chunks:
        return Check(status, chunks, f"{chunks} content chunks, expected {expect_chunks}")
    return Check(status, chunks)


def count_chunks(body: str, shape: str) -> int:
    """Content chunks in an SSE body: OpenAI deltas with text, Switchyard `text_delta` events,
    Anthropic `text_delta` block deltas, or legacy completion chunks with text."""
    count = 0
    for line in body.splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if not payload.startswith("{"):
            continue
        try:
            event = json.loads(payload)
        except ValueError:
            continue
        if shape == "switchyard":
            count += event.get("type") == "text_delta"
        elif shape == "anthropic":
            count += (event.get("delta") or {}).get("type") == "text_delta"
        elif shape == "text":
            choices = event.get("choices") or [{}]
            count += bool(choices[0].get("text"))
        else:
            choices = event.get("choices") or [{}]
            count += bool((choices[0].get("delta") or {}).get("content"))
    return count
