#!/usr/bin/env bash
# One-shot check of the `local` adapter against `transformers serve --device cuda` on a GPU machine.
#
# Run from the repository root on the device machine, after `bash bench/gpu_wheels.sh` here has
# filled .whl/ (carried along): it installs the wheels into /tmp/site, builds a larger random
# model the tiny one's way (hidden 256, 4 layers), and runs tests/local/test_transformers_serve.py
# with the session's server started on the GPU. It samples the GPU's used memory while the tests
# run, so the log shows the server really sat on the GPU. Logs go to $OUT (or /tmp/gpu_check).
#
# Knobs, for a dry run elsewhere: PY (default python3), DEVICE (default cuda), SKIP_WHEELS=1.
set -uo pipefail

PY="${PY:-python3}"
DEVICE="${DEVICE:-cuda}"
LOGS="${OUT:-/tmp/gpu_check}"
MODEL_DIR=/tmp/switchyard_gpu_model
mkdir -p "$LOGS"

if [ "${SKIP_WHEELS:-0}" != 1 ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1

"$PY" -c 'import sys, torch, transformers, fastapi, openai, msgspec, httptools, pytest_asyncio
print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__,
      "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")' \
    || exit 1

"$PY" tests/local/tiny_model.py "$MODEL_DIR" --hidden 256 --layers 4 >"$LOGS/build.log" 2>&1 \
    || { cat "$LOGS/build.log"; exit 1; }

if command -v nvidia-smi >/dev/null; then
    (for _ in $(seq 1 150); do
        nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>&1
        sleep 2
    done) >"$LOGS/gpu_memory.txt" &
    SAMPLER=$!
fi

SWITCHYARD_LOCAL_DEVICE="$DEVICE" SWITCHYARD_LOCAL_MODEL_DIR="$MODEL_DIR" timeout 300 \
    "$PY" -m pytest tests/local/test_transformers_serve.py --confcutdir=tests/local \
    -p pytest_asyncio.plugin -p no:cacheprovider -rA -q 2>&1 | tee "$LOGS/pytest.log"
STATUS=${PIPESTATUS[0]}

if [ -n "${SAMPLER:-}" ]; then
    kill "$SAMPLER" 2>/dev/null
    echo "GPU memory used while the tests ran (MiB, every 2 s):"
    tr '\n' ' ' <"$LOGS/gpu_memory.txt"
    echo
fi
echo "pytest exit status: $STATUS"
exit "$STATUS"
