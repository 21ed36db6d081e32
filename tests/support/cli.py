"""Running the `switchyard` console script as an operator does, for `tests/test_cli*.py`.

`write_config` writes a `config.toml` (SQLite database and a small catalog file beside it, a keyless
`local` and a keyed `hosted` provider); `run_cli` runs one command to completion; `Process` runs a
long-lived one (`serve`, `mock-upstream`) in its own process group with its output in files, and
`processes()` SIGKILLs every group it started on the way out, so no test leaves a server behind.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.catalog import catalog_toml, model, price
from tests.support.client import COMPLETIONS, body
from tests.support.ports import free_port
from tests.support.waiting import wait_until_sync

REPO = Path(__file__).resolve().parents[2]

CATALOG = catalog_toml(
    model(
        "tiny", ("local", "tiny-upstream"), aliases=["tiny-alias"], context_window=4096, max_output=512, default=True
    ),
    model("hosted-model", ("hosted", "hosted-upstream")),
    prices=[price("local", "tiny", "1.5", "3"), price("hosted", "hosted-model", "0.25", "0.75")],
)


def write_config(tmp_path: Path, upstream_port: int = 9, extra: str = "") -> Path:
    """A config with a `local` provider and a keyed `hosted` one, both at `upstream_port`."""
    (tmp_path / "models.toml").write_text(CATALOG)
    path = tmp_path / "config.toml"
    path.write_text(
        f"""
[database]
url = "sqlite+aiosqlite:///switchyard.db"

[catalog]
files = ["models.toml"]

[providers.local]
kind = "local"
base_url = "http://127.0.0.1:{upstream_port}/v1"

[providers.hosted]
kind = "openai_compatible"
base_url = "http://127.0.0.1:{upstream_port}/v1"
api_key_env = "SWITCHYARD_TEST_HOSTED_KEY"
{extra}"""
    )
    return path


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SWITCHYARD_CONFIG" and not k.startswith("SWITCHYARD_TEST")}
    env["PYTHONPATH"] = str(REPO)
    return {**env, **extra}


def run_cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=cwd,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def tables(db: Path) -> set[str]:
    return {row[0] for row in query(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}


class Process:
    """A CLI subprocess in its own process group, its output in files (no pipe to fill up)."""

    def __init__(self, cwd: Path, name: str, args: list[str], env: dict[str, str]) -> None:
        self.out_path, self.err_path = cwd / f"{name}.out", cwd / f"{name}.err"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "app.cli", *args],
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def output(self) -> tuple[str, str]:
        return self.out_path.read_text(), self.err_path.read_text()

    def wait_http(self, url: str, timeout: float = 20.0) -> None:
        def answers() -> bool:
            if self.popen.poll() is not None:
                pytest.fail(f"exited with {self.popen.returncode} before answering: {self.output()}")
            try:
                return httpx.get(url, timeout=1.0).status_code == 200
            except httpx.TransportError:
                return False

        wait_until_sync(answers, timeout, what=lambda: f"an answer from {url}: {self.output()}")

    def stop(self, signum: signal.Signals) -> int:
        self.popen.send_signal(signum)
        return self.popen.wait(timeout=20)

    def kill(self) -> None:
        """SIGKILL the whole group (uvicorn's workers too); a no-op once everything has exited."""
        with suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)


@contextmanager
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    try:
        yield started
    finally:
        for process in reversed(started):
            process.kill()


def start_mock(cwd: Path, started: list[Process]) -> int:
    port = free_port()
    args = ["mock-upstream", "--port", str(port), "--chunks", "4", "--text", "alpha beta gamma delta"]
    started.append(mock := Process(cwd, "mock", args, cli_env()))
    mock.wait_http(f"http://127.0.0.1:{port}/health")
    return port


def complete(base: str, model: str, prompt: str) -> dict[str, Any]:
    """One non-streaming completion against a gateway subprocess; must be 200."""
    response = httpx.post(f"{base}{COMPLETIONS}", json=body(model, text=prompt), timeout=20)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def request_lines(stdout: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    return [line for line in lines if line["event"] == "request"]


def script_lines(tmp_path: Path, script: str) -> list[dict[str, Any]]:
    """The JSON lines a Python `script` (given a config file as `sys.argv[1]`) wrote on stdout; it
    must exit 0 with nothing on stderr."""
    config = write_config(tmp_path)
    env = cli_env(SWITCHYARD_TEST_HOSTED_KEY="sk-test-hosted")
    done = subprocess.run(
        [sys.executable, "-c", script, str(config)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, "")
    return [json.loads(line) for line in done.stdout.splitlines()]
