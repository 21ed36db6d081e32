"""`serve --workers 2` on a machine so busy that a worker takes longer than uvicorn's 5 s health
check to start: uvicorn's supervisor killed each starting worker as hung and its replacement
likewise, so the service never answered (seen in CI: a worker killed at start, a second
`worker_restarted` line). The slowness is injected where it happens, in the worker processes' own
interpreter start (a `sitecustomize` that sleeps in multiprocessing's spawned children only)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from tests.support.cli import REPO, Process, cli_env, processes, start_mock, write_config
from tests.support.ports import free_port

SLOW_START = """
import sys, time
if "--multiprocessing-fork" in sys.argv:  # a worker uvicorn spawned: neither the server nor its tools
    time.sleep(8)
"""


def test_workers_slower_to_start_than_the_health_check_are_not_killed(tmp_path: Path) -> None:
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(SLOW_START)
    with processes() as started:
        config = write_config(tmp_path, start_mock(tmp_path, started))
        port = free_port()
        args = ["serve", "--config", str(config), "--port", str(port), "--workers", "2"]
        started.append(serve := Process(tmp_path, "serve", args, cli_env(PYTHONPATH=f"{slow}:{REPO}")))
        began = time.monotonic()
        serve.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=40.0)
        assert time.monotonic() - began > 8  # the workers' start was slow
        time.sleep(6)  # past a health check of each worker now serving
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        stdout, _ = serve.output()
    events = [json.loads(line)["event"] for line in stdout.splitlines() if line.startswith("{")]
    assert "worker_restarted" not in events
