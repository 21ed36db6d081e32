"""Issue 12's outage bar: through a 60-second database outage at full load, 0 rows lost and RSS
growth < 20 MB.

    .venv/bin/python bench/outage.py [--outage 60] [--before 10] [--after 20] [--keep]

Starts the mock upstream and `switchyard serve` (one worker, PostgreSQL reached through a TCP
proxy this script controls: tests/support/tcp_proxy.py), loads it with wrk at 32 connections
for before + outage + after seconds, cuts the proxy after `--before` seconds and restores it
`--outage` seconds later, sampling the gateway's VmRSS every second. Then it waits for the
journal to drain — `/metrics` says `switchyard_ledger_rows_pending 0`; `/readyz`'s `"ledger":"ok"`
is not enough, it only says that no row has waited 10 s — and compares the ledger with the log: every
request the gateway logged (its `request` events, one per request served: wrk's count lacks the
answers to its last in-flight requests) must have exactly one row, and no row may lack a logged
request. The database (`switchyard_bench_outage_<pid>`) and the work folder are dropped at the end
unless `--keep`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.ports import free_port  # noqa: E402
from tests.support.tcp_proxy import TcpProxy  # noqa: E402

BODY = {"model": "mock-model", "messages": [{"role": "user", "content": [{"kind": "text", "data": "hi"}]}]}


def psql(sql: str, db: str = "test") -> str:
    out = subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-tAc", sql], capture_output=True)
    return out.stdout.decode().strip()


def rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+)", status)
    return int(match.group(1)) if match else 0


def ready(port: int) -> dict[str, object]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return dict(json.loads(response.read()))
    except Exception as exc:  # a 503 or a refused connection: not ready
        body = getattr(exc, "read", None)
        return dict(json.loads(body())) if body else {}


def pending(port: int) -> int | None:
    """`switchyard_ledger_rows_pending` from `/metrics` (None when it cannot be read)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    match = re.search(r"^switchyard_ledger_rows_pending (\d+)", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def logged_ids(log: Path) -> set[str]:
    """The request ids of the gateway's `request` log events (one per request served)."""
    ids = set()
    with log.open("rb") as lines:
        for line in lines:
            if b'"event":"request"' in line:
                ids.add(json.loads(line)["request_id"])
    return ids


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--outage", type=int, default=60)
    parser.add_argument("--before", type=int, default=10)
    parser.add_argument("--after", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="keep the database and the work folder")
    args = parser.parse_args()
    db = f"switchyard_bench_outage_{os.getpid()}"
    psql(f'CREATE DATABASE "{db}"')
    work = Path(tempfile.mkdtemp(prefix="switchyard-outage-"))
    mock_port, port = free_port(), free_port()
    env = {**os.environ, "SWITCHYARD_CONFIG": str(work / "config.toml")}
    with TcpProxy(5432) as proxy:
        (work / "config.toml").write_text(
            f'[server]\nport = {port}\n[database]\nurl = "postgresql+asyncpg://postgres@127.0.0.1:{proxy.port}/{db}"\n'
            f'[providers.mock]\nkind = "openai_compatible"\nbase_url = "http://127.0.0.1:{mock_port}/v1"\n'
            "max_concurrency = 4096\n"
        )
        (work / "body.json").write_text(json.dumps(BODY))
        cli = [str(REPO / ".venv/bin/switchyard")]
        subprocess.run([*cli, "db", "upgrade"], env=env, cwd=work, check=True, capture_output=True)
        mock = subprocess.Popen([*cli, "mock-upstream", "--port", str(mock_port)], cwd=work, stdout=subprocess.DEVNULL)
        gateway = subprocess.Popen(
            ["taskset", "-c", "0", *cli, "serve"],
            env=env,
            cwd=work,
            stdout=open(work / "serve.log", "wb"),  # noqa: SIM115
        )
        try:
            while ready(port).get("status") != "ok":
                time.sleep(0.5)
            total = args.before + args.outage + args.after
            load_env = {**os.environ, "BENCH_BODY_FILE": str(work / "body.json"), "BENCH_PATH": "/api/v1/completions"}
            wrk = subprocess.Popen(
                [
                    "taskset",
                    "-c",
                    "1",
                    "wrk",
                    "-t1",
                    "-c32",
                    f"-d{total}",
                    "-s",
                    str(REPO / "bench/lua/request.lua"),
                    f"http://127.0.0.1:{port}",
                ],
                env=load_env,
                stdout=subprocess.PIPE,
            )
            start, samples, cut, restored = time.monotonic(), [], False, False
            while wrk.poll() is None:
                elapsed = time.monotonic() - start
                if not cut and elapsed >= args.before:
                    proxy.cut()
                    cut = True
                if cut and not restored and elapsed >= args.before + args.outage:
                    proxy.restore()
                    restored = True
                samples.append((round(elapsed), rss_kb(gateway.pid), ready(port).get("ledger")))
                time.sleep(1)
            out = wrk.stdout.read().decode() if wrk.stdout else ""
            drained = time.monotonic()
            while pending(port) != 0 and time.monotonic() - drained < 300:
                time.sleep(0.2)
            drain_s = time.monotonic() - drained
            summary = json.loads(out[out.index("{") :]) if "{" in out else {}
            ok_rows = psql("select count(*) from ledger where status = 'ok'", db)
            all_rows = psql("select count(*) from ledger", db)
            dupes = psql("select count(*) - count(distinct request_id) from ledger", db)
            logged = logged_ids(work / "serve.log")
            stored = set(psql("copy (select request_id from ledger) to stdout", db).split())
            during = [kb for t, kb, _ in samples if args.before <= t <= args.before + args.outage]
            print(f"wrk: {summary}")
            print(
                f"ledger: {ok_rows} ok rows, {all_rows} rows, {dupes} duplicate ids; {len(logged)} requests logged, "
                f"{len(logged - stored)} of them without a row, {len(stored - logged)} rows without a logged request; "
                f"the journal drained {drain_s:.1f} s after the load"
            )
            print(
                f"RSS at the cut {during[0] / 1024:.1f} MB, max during the outage {max(during) / 1024:.1f} MB, "
                f"growth {(max(during) - during[0]) / 1024:.1f} MB; ledger states seen: "
                f"{sorted({str(state) for *_, state in samples})}"
            )
        finally:
            for process in (gateway, mock):
                process.terminate()
                process.wait(timeout=30)
    if args.keep:
        print(f"kept: database {db}, folder {work}")
    else:
        psql(f'DROP DATABASE IF EXISTS "{db}"')
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
