#!/usr/bin/env bash
# Instructions per request of the gateway, counted by valgrind's callgrind: deterministic where
# timing on this shared 2-core machine is not (±10 % between identical runs). Not part of run.py.
#
#   bash bench/instructions.sh [sqlite|off] [SECONDS]      (from the repository root)
#
# Starts the mock upstream and `switchyard serve` under callgrind, warms up for 10 s, zeroes the
# counters, sends requests for SECONDS (default 20) at 4 connections with wrk (a few thousand
# requests: valgrind runs the gateway ~50x slower), dumps, and prints the instructions per request
# summed over all threads.
# The dump stays in the work directory for `callgrind_annotate --tree=caller`.
set -euo pipefail

LEDGER=${1:-sqlite}
SECONDS_MEASURED=${2:-20}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/switchyard-instructions.XXXXXX)
GATEWAY_PORT=47100
MOCK_PORT=47101
cd "$WORK"

cleanup() { fuser -k "$GATEWAY_PORT/tcp" "$MOCK_PORT/tcp" >/dev/null 2>&1 || true; }
trap cleanup EXIT

# The same config and catalog as bench/run.py's Switchyard (bench/peers.py), pointed at our ports.
CONFIG=$(cd "$REPO/bench" && ../.venv/bin/python - "$WORK" "$LEDGER" "$GATEWAY_PORT" "$MOCK_PORT" <<'PY'
import sys
from pathlib import Path
from peers import Mocks, Switchyard, SwitchyardOptions
work, ledger, gateway, mock = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
mocks = Mocks.create(work, "0", mock, mock)
options = SwitchyardOptions(database_url="", ledger_enabled=ledger != "off")
print(Switchyard(mocks, gateway, options).write_config(work))
PY
)
printf '%s' '{"model":"bench-model","messages":[{"role":"user","content":[{"kind":"text","data":"hi"}]}],"max_tokens":16}' > body.json

(cd "$REPO" && exec .venv/bin/python -m app.mock_upstream --chunks 64 --port "$MOCK_PORT") > mock.log 2>&1 &
(cd "$REPO" && exec valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out" \
    .venv/bin/python -m app.cli serve --config "$CONFIG") > gateway.log 2>&1 &
for _ in $(seq 1200); do
    curl -s -o /dev/null "http://127.0.0.1:$GATEWAY_PORT/healthz" && break
    sleep 0.5
done

export BENCH_BODY_FILE="$WORK/body.json" BENCH_PATH=/api/v1/completions
load() { wrk -t1 -c4 -d"$1" -s "$REPO/bench/lua/request.lua" "http://127.0.0.1:$GATEWAY_PORT"; }
load 10 > /dev/null
callgrind_control -z > /dev/null
load "$SECONDS_MEASURED" > wrk.out
callgrind_control -d > /dev/null
sleep 2

served=$(grep -o '"requests":[0-9]*' wrk.out | cut -d: -f2)
total=0
for dump in "$WORK"/callgrind.out.*; do
    total=$((total + $(grep -m1 '^summary:' "$dump" | awk '{print $2}')))
done
echo "ledger=$LEDGER requests=$served instructions/request=$((total / served)) dumps: $WORK"
