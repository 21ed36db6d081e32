"""A real `transformers serve` on a tiny locally built model, shared by the `local` kind's tests.

The server is started once per session as a subprocess (the same command an operator runs), on a
free loopback port, with the model directory as its pinned model; requests must name that
directory as `model` (anything else is a 400). It is ready when `GET /health` answers 200.

Without torch or transformers these fixtures fail (never skip): the `local` kind is tested against
a real inference server or not at all.

Two environment variables serve the one-shot GPU check (`bench/gpu_local_check.sh`):
`SWITCHYARD_LOCAL_DEVICE` (default `cpu`) is passed to `--device`, and `SWITCHYARD_LOCAL_MODEL_DIR`
names an already built model directory to serve instead of building the tiny one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

STARTUP_LIMIT_S = 90.0
# No hub, no telemetry, and no PyPI version check (the `transformers` CLI makes one at start).
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}
STDERR_TAIL_CHARS = 4000


@dataclass(frozen=True)
class LocalServer:
    """A running `transformers serve`: `base_url` ends at `/v1`; `model` is what requests must name."""

    base_url: str
    model: str
    origin: str
    process: subprocess.Popen[bytes]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-STDERR_TAIL_CHARS:]


def _wait_healthy(origin: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_LIMIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"transformers serve exited with {process.returncode}:\n{_tail(log)}", pytrace=False)
        try:
            if httpx.get(f"{origin}/health", timeout=2.0, trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    pytest.fail(f"transformers serve not healthy after {STARTUP_LIMIT_S:.0f} s:\n{_tail(log)}", pytrace=False)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=15)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's directory, built once per session (or the prebuilt one from the environment)."""
    prebuilt = os.environ.get("SWITCHYARD_LOCAL_MODEL_DIR")
    if prebuilt:
        return Path(prebuilt).resolve()
    # Imported here so a missing torch fails the local tests alone, not the whole session's collection.
    from tests.local.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def transformers_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    port = _free_port()
    origin = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("transformers_serve") / "stderr.log"
    device = os.environ.get("SWITCHYARD_LOCAL_DEVICE", "cpu")
    command = [
        sys.executable, "-m", "transformers.cli.transformers", "serve",
        "--host", "127.0.0.1", "--port", str(port), "--device", device, str(tiny_model_dir),
    ]  # fmt: skip
    env = {**os.environ, **OFFLINE_ENV}
    with log.open("wb") as stderr:
        process = subprocess.Popen(command, stdout=stderr, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_healthy(origin, process, log)
        yield LocalServer(base_url=f"{origin}/v1", model=str(tiny_model_dir), origin=origin, process=process)
    finally:
        _stop(process)
