#!/usr/bin/env bash
# Download, into .whl/, the wheels that bench/gpu_local_check.sh needs on the GPU machine.
#
# That machine has Python 3.12 with torch 2.11, transformers 5.17, tokenizers, accelerate, rich,
# typer, click, h11, anyio, httpx and aiohttp, but no network and none of:
#   - `transformers serve`'s own needs (its `serving` extra): fastapi, starlette, uvicorn, pydantic
#     (+ pydantic-core, annotated-types, typing-inspection) and openai (+ jiter, sniffio, and
#     whatever this openai version needs besides);
#   - what importing `providers` needs: msgspec and httptools (httpx and its dependencies are
#     carried too, at this project's pins, so the adapter runs what it runs here);
#   - pytest-asyncio (the project's pytest config is asyncio_mode=auto), with pytest at our pin.
# Versions are this project's own venv's, so the GPU run tests what the CPU run tests.
#
# Run from the repository root:  bash bench/gpu_wheels.sh   (then check the size it prints)
set -euo pipefail

cd "$(dirname "$0")/.."
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
rm -rf .whl && mkdir -p .whl

PY="${PYTHON:-.venv/bin/python}"
WHEELS=(
    # transformers serve (transformers 5.17's `serving` extra, less what the machine has)
    fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 annotated-doc==0.0.7 opentelemetry-api==1.45.2
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    typing-extensions==4.16.0 anyio==4.16.0
    openai==3.57.0 jiter==0.19.0 sniffio==1.3.1 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
    # importing `providers` (this project's pins)
    msgspec==0.23.0 httptools==0.9.0 httpx==0.28.1 httpcore==1.0.9
    # the test runner
    pytest==9.2.0 pytest-asyncio==1.5.0 pluggy==1.7.0 iniconfig==2.3.1
)

"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"

ls -1 .whl
du -sh .whl
