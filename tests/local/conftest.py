"""A real `transformers serve` on a tiny locally built model, shared by the `local` kind's tests.

The server is started once per session as a subprocess (the same command an operator runs), on a
free loopback port, with the model directory as its pinned model; requests must name that
directory as `model` (anything else is a 400). It is ready when `GET /health` answers 200.

Without torch or transformers these fixtures fail (never skip): the `local` kind is tested against
a real inference server or not at all. Every test here is marked `local`, and nothing here imports
torch or transformers before a fixture needs them, so `pytest -m "not local"` collects and runs the
rest of the suite on a machine without them.

Two environment variables serve the one-shot GPU check (`bench/gpu_local_check.sh`):
`SWITCHYARD_LOCAL_DEVICE` (default `cpu`) is passed to `--device`, and `SWITCHYARD_LOCAL_MODEL_DIR`
names an already built model directory to serve instead of building the tiny one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.ports import free_port
from tests.support.waiting import wait_until_sync

HERE = Path(__file__).resolve().parent

STARTUP_LIMIT_S = 90.0
# No hub, no telemetry, and no PyPI version check (the `transformers` CLI makes one at start).
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}
STDERR_TAIL_CHARS = 4000
PromptTokens = Callable[[list[tuple[str, str]]], int]


@dataclass(frozen=True)
class LocalServer:
    """A running `transformers serve`: `base_url` ends at `/v1`; `model` is what requests must name."""

    base_url: str
    model: str
    origin: str
    process: subprocess.Popen[bytes]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test in this directory `local` (deselect them with `-m "not local"`)."""
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.local)


def _tail(path: Path) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-STDERR_TAIL_CHARS:]


def _wait_healthy(origin: str, process: subprocess.Popen[bytes], log: Path) -> None:
    def healthy() -> bool:
        if process.poll() is not None:
            pytest.fail(f"transformers serve exited with {process.returncode}:\n{_tail(log)}", pytrace=False)
        try:
            return httpx.get(f"{origin}/health", timeout=2.0, trust_env=False).status_code == 200
        except httpx.TransportError:
            return False

    wait_until_sync(healthy, STARTUP_LIMIT_S, what=lambda: f"transformers serve healthy:\n{_tail(log)}", interval=0.25)


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
    from tests.local.tiny_model import build_tiny_model  # torch: imported only when a local test runs

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def transformers_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    port = free_port()
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


@pytest.fixture(scope="session")
def prompt_tokens(tiny_model_dir: Path) -> PromptTokens:
    """What `transformers serve` counts as `prompt_tokens` for these plain-text (role, text) turns."""
    from tests.local.tiny_model import count_prompt_tokens  # transformers: imported only when needed

    return lambda turns: count_prompt_tokens(tiny_model_dir, turns)
