#!/usr/bin/env bash
# Instructions per request of the gateway, counted by valgrind's callgrind: deterministic where
# timing on this shared 2-core machine is not (±10 % between identical runs). Not part of run.py.
#
#   bash bench/instructions.sh [sqlite|postgres|off] [SECONDS] [native|chat|anthropic|completions] [json|stream] [none|keys|redis]
#                                                                 (from the repository root)
#
# Starts the mock upstream and `switchyard serve` under callgrind, warms up for 10 s, zeroes the
# counters, sends requests for SECONDS (default 20) at 4 connections with wrk (a few thousand
# requests: valgrind runs the gateway ~50x slower), dumps, and prints the instructions per request
# summed over all threads. The door is the native `/api/v1/completions` (default), the OpenAI
# `/v1/chat/completions` (`chat`), Anthropic's `/v1/messages` (`anthropic`) or the legacy
# `/v1/completions` (`completions`); `stream` asks for the 64-chunk SSE answer instead of JSON. The
# bodies are bench/run.py's (bench/peers.py). Any non-2xx answer fails the run. `keys` runs the
# gateway in `[auth] mode = "keys"` with Redis on 127.0.0.1:6379 (a key prefix of its own) and one
# key with a budget, rpm and tpm that nothing reaches, made by `switchyard keys create` before it
# starts (bench/keyed.py's limits); `none` (default) is the same config without keys or Redis;
# `redis` is `none` with the same `[redis]` as `keys` (scenario 7's pair: the difference is the keys).
# The dump stays in the work directory for `callgrind_annotate --tree=caller`.
# Only the gateway process is counted: the SQLite ledger's writer process (`catalog.sqlite_child`,
# started with exec, which valgrind does not follow) is left out as PostgreSQL's server is; its own
# price per row is in bench/RESULTS.md ("the SQLite ledger's writer in a process of its own").
#
# INSTRUCTIONS_TREE=DIR measures the gateway of another checkout (an older commit, for an A/B) with
# this checkout's config, bodies, mock upstream and virtualenv: DIR's packages come first on the
# path (cwd and PYTHONPATH), the config must be one DIR's settings accept.
#
# INSTRUCTIONS_STEADY=1 takes most of what the clock does out of the count. Under valgrind
# the gateway runs ~50x slower, so work that runs every so many seconds (the catalog watch's poll,
# 5 s: ~15M instructions each; the key ring's, 10 s) or waits a fixed time (summed settlements sent
# within 20 ms: at valgrind's ~80 requests a second that is a Redis command per request or two,
# against one per ~60 at full speed) weighs ~50x more per request than it does at full speed, and
# varies with how many requests a run got through (±3 % between identical runs). It measures a
# copy of the tree in the work directory with those intervals 50x longer (`CATALOG_POLL_S`,
# `REDIS_POLL_S`, `SUMMED_S`, `LAZY_S`): the same code per request, its periodic work scaled as a
# full-speed gateway's. A lease still ends with its second of the window (Redis's clock, not
# scaled): one admission per ~80 requests here, per several hundred at full speed. Counts still
# move with the requests a run got through (bench/RESULTS.md, 2026-12-03): compare trees side by side.
#
# The machine is shared: the ports come from $INSTRUCTIONS_PORT (the gateway's; the mock's is the
# next one), and valgrind's control pipes live in the work directory (`--vgdb-prefix`), so another
# session's `callgrind_control -z`/`-d` (which address every callgrind they can find in /tmp)
# cannot zero or split this count.
set -euo pipefail

LEDGER=${1:-sqlite}
SECONDS_MEASURED=${2:-20}
DOOR=${3:-native}
KIND=${4:-json}
AUTH=${5:-none}
REPO=$(cd "$(dirname "$0")/.." && pwd)
TREE=${INSTRUCTIONS_TREE:-$REPO}  # the checkout whose gateway is measured (config, mock and venv: this one's)
WORK=$(mktemp -d /tmp/switchyard-instructions.XXXXXX)
GATEWAY_PORT=${INSTRUCTIONS_PORT:-47100}
MOCK_PORT=$((GATEWAY_PORT + 1))
VGDB="$WORK/vgdb-pipe"
cd "$WORK"
if [ "${INSTRUCTIONS_STEADY:-0}" = 1 ]; then
    mkdir "$WORK/tree"
    (cd "$TREE" && tar -cf - --exclude=.venv --exclude=.git --exclude='__pycache__' app catalog providers migrations) | tar -xf - -C "$WORK/tree"
    sed -i 's/^CATALOG_POLL_S = 5.0/CATALOG_POLL_S = 250.0/' "$WORK/tree/app/catalog_watch.py"
    sed -i 's/^REDIS_POLL_S = 10.0/REDIS_POLL_S = 500.0/' "$WORK/tree/app/access/keyring.py"
    sed -i 's/^LAZY_S = 0.002 /LAZY_S = 0.1 /; s/^SUMMED_S = 0.02 /SUMMED_S = 1.0 /' "$WORK/tree/app/access/redis_limiter.py"
    if [ "$(grep -c '^CATALOG_POLL_S = 250.0\|^REDIS_POLL_S = 500.0\|^LAZY_S = 0.1 \|^SUMMED_S = 1.0 ' \
        "$WORK/tree/app/catalog_watch.py" "$WORK/tree/app/access/keyring.py" "$WORK/tree/app/access/redis_limiter.py" \
        | awk -F: '{s += $2} END {print s}')" != 4 ]; then
        echo "instructions.sh: INSTRUCTIONS_STEADY could not scale the four intervals (renamed?)" >&2
        exit 1
    fi
    TREE="$WORK/tree"
fi

cleanup() {  # the two servers, and the Redis keys of `keys`/`redis` runs (their prefix is the work directory's)
    fuser -k "$GATEWAY_PORT/tcp" "$MOCK_PORT/tcp" >/dev/null 2>&1 || true
    redis-cli --scan --pattern "instructions-$(basename "$WORK"):*" 2>/dev/null | xargs -r redis-cli del >/dev/null 2>&1 || true
}
trap cleanup EXIT

# `postgres`: the ledger in a fresh database of its own on 127.0.0.1:5432 (user postgres, trust),
# migrated before the gateway starts and dropped at the end (PostgreSQL's own work is not counted).
DATABASE_URL=""
if [ "$LEDGER" = postgres ]; then
    PG_DB="switchyard_instructions_$$"
    psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE $PG_DB" >/dev/null
    DATABASE_URL="postgresql+asyncpg://postgres@127.0.0.1:5432/$PG_DB"
    cleanup() {
        fuser -k "$GATEWAY_PORT/tcp" "$MOCK_PORT/tcp" >/dev/null 2>&1 || true
        psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" >/dev/null 2>&1 || true
    }
fi

# The same config, catalog and bodies as bench/run.py's Switchyard (bench/peers.py), pointed at our ports.
CONFIG=$(cd "$REPO/bench" && ../.venv/bin/python - "$WORK" "$LEDGER" "$GATEWAY_PORT" "$MOCK_PORT" "$DOOR" "$KIND" "$AUTH" "$DATABASE_URL" <<'PY'
import sys
from pathlib import Path
from keyed import BUDGET_USD, RPM, TPM
from peers import MODEL, Mocks, Switchyard, SwitchyardIngress, SwitchyardOptions
work, ledger, gateway, mock = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
door, kind, auth, database_url = sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8]
doors = {"chat": "openai_chat", "anthropic": "anthropic_messages", "completions": "openai_completions"}
if door not in ("native", *doors) or kind not in ("json", "stream") or auth not in ("none", "keys", "redis"):
    sys.exit(f"door must be native, chat, anthropic or completions, kind json or stream, auth none or keys: {sys.argv[5:]}")
mocks = Mocks.create(work, "0", mock, mock)
options = SwitchyardOptions(database_url=database_url, ledger_enabled=ledger != "off")
target = Switchyard(mocks, gateway, options) if door == "native" else SwitchyardIngress(mocks, gateway, options, doors[door])
request = target.request("stream" if kind == "stream" else "fast")
(work / "body.json").write_bytes(request.body)
(work / "path").write_text(request.path)
config = target.write_config(work)
if auth == "redis":  # `none` with scenario 7's `[redis]`: what keys mode adds, and nothing else
    with config.open("a") as out:
        out.write(f'\n[redis]\nurl = "redis://127.0.0.1:6379/0"\nkey_prefix = "instructions-{work.name}"\n')
if auth == "keys":
    prefix = f"instructions-{work.name}"
    with config.open("a") as out:
        out.write(f'\n[auth]\nmode = "keys"\n\n[redis]\nurl = "redis://127.0.0.1:6379/0"\nkey_prefix = "{prefix}"\n')
    limits = f"--budget-usd {BUDGET_USD} --budget-period month --rpm {RPM} --tpm {TPM}"
    (work / "limits").write_text(limits)
print(config)
PY
)
REQUEST_PATH=$(cat "$WORK/path")
export BENCH_HEADERS=""
if [ "$AUTH" = keys ] || [ "$LEDGER" = postgres ]; then
    (cd "$REPO" && .venv/bin/python -m app.cli db upgrade --config "$CONFIG") > /dev/null
fi
if [ "$AUTH" = keys ]; then
    # shellcheck disable=SC2046  # the limits are words
    SECRET=$(cd "$REPO" && .venv/bin/python -m app.cli keys create --name instructions $(cat "$WORK/limits") \
        --format json --config "$CONFIG" | .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)["secret"])')
    BENCH_HEADERS="Authorization: Bearer $SECRET"
    SWITCHYARD_ADMIN_KEY="sy-$("$REPO/.venv/bin/python" -c "import secrets; print(secrets.token_urlsafe(32))")"
    export SWITCHYARD_ADMIN_KEY
fi

for port in "$GATEWAY_PORT" "$MOCK_PORT"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        trap - EXIT  # not ours to stop
        echo "instructions.sh: port $port is in use (set INSTRUCTIONS_PORT)" >&2
        exit 1
    fi
done
(cd "$REPO" && exec .venv/bin/python -m devtools.mock_upstream --chunks 64 --port "$MOCK_PORT") > mock.log 2>&1 &
(cd "$TREE" && PYTHONPATH="$TREE" exec valgrind --tool=callgrind --vgdb-prefix="$VGDB" --callgrind-out-file="$WORK/callgrind.out" \
    "$REPO/.venv/bin/python" -m app.cli serve --config "$CONFIG") > gateway.log 2>&1 &
GATEWAY_PID=$!
for _ in $(seq 1200); do
    curl -s -o /dev/null "http://127.0.0.1:$GATEWAY_PORT/healthz" && break
    sleep 0.5
done

export BENCH_BODY_FILE="$WORK/body.json" BENCH_PATH=$REQUEST_PATH
load() { wrk -t1 -c4 -d"$1" -s "$REPO/bench/lua/request.lua" "http://127.0.0.1:$GATEWAY_PORT"; }
load 10 > /dev/null
callgrind_control --vgdb-prefix="$VGDB" -z "$GATEWAY_PID" > /dev/null
load "$SECONDS_MEASURED" > wrk.out
callgrind_control --vgdb-prefix="$VGDB" -d "$GATEWAY_PID" > /dev/null
sleep 2

served=$(grep -o '"requests":[0-9]*' wrk.out | cut -d: -f2)
failed=$(grep -o '"non2xx":[0-9]*' wrk.out | cut -d: -f2)
if [ "$failed" != 0 ]; then
    echo "instructions.sh: $failed of $served answers were not 2xx (see $WORK/gateway.log)" >&2
    exit 1
fi
total=0
for dump in "$WORK"/callgrind.out.*; do
    total=$((total + $(grep -m1 '^summary:' "$dump" | awk '{print $2}')))
done
echo "ledger=$LEDGER door=$DOOR kind=$KIND auth=$AUTH requests=$served instructions/request=$((total / served)) dumps: $WORK"
