"""Switchyard side by side with LiteLLM proxy and Portkey gateway: `python bench/run.py`.

The orchestrator (this file) only starts processes and reads numbers; the load comes from `wrk`
(bench/lua/request.lua), pinned with `taskset` to the load CPUs together with the mock upstreams,
while the gateway under test is pinned to its own CPU with one worker. Systems are measured one at
a time (start, scenarios 1–4, RSS, stop), then Switchyard again with PostgreSQL and with the ledger
off (5), with N workers (6), and a fresh Switchyard for the RSS-over-100k-requests step. The tables
are printed last and appended to bench/RESULTS.md with the date, versions and exact command.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import report
from keyed import LiteLLMKeys, LiteLLMLimits, LiteLLMMasterKey, SwitchyardServices
from load import Check, Measure, check, run_wrk
from peers import (
    PEERS,
    REPO,
    Direct,
    LiteLLM,
    Mocks,
    Portkey,
    Switchyard,
    SwitchyardIngress,
    SwitchyardOptions,
    Target,
    installed_litellm,
    installed_portkey,
    package_version,
    repo_python,
)
from procs import Server, StartError, free_port
from report import Cell, KeysNames, Names, Results, RssRow

# scenario key -> (request kind, connections)
SCENARIOS = {"throughput": ("json", 32), "latency": ("json", 1), "slow": ("slow", 256), "stream": ("stream", 16)}
SCENARIO_NUMBERS = {"1": "throughput", "2": "latency", "3": "slow", "4": "stream"}
SQLITE_LABEL = "switchyard (SQLite ledger)"
PG_LABEL = "switchyard (PostgreSQL ledger)"
OFF_LABEL = "switchyard (ledger off)"
SQLITE_AGAIN_LABEL = "switchyard (SQLite ledger, again)"
KEYS_NONE_LABEL = "switchyard auth none (PostgreSQL, Redis)"
KEYS_ON_LABEL = "switchyard keys (key with budget, rpm, tpm; PostgreSQL, Redis)"
KEYS_NONE_AGAIN_LABEL = "switchyard auth none (PostgreSQL, Redis), again"
PG_DB = "switchyard_bench"
PG_URL = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{PG_DB}"


@dataclass
class Plan:
    """The parsed command line plus derived facts every step needs."""

    run_dir: Path
    gateway_cpus: str
    load_cpus: str
    all_cpus: str
    duration: float
    warmup: float
    workers: int
    scenarios: list[str]
    extra: set[str]  # "5", "6", "rss"
    systems: list[str]
    rss_requests: int
    rss_max_s: float
    results_file: Path | None
    command: str
    install_notes: dict[str, str] = field(default_factory=dict)


def _parser() -> argparse.ArgumentParser:
    cpus = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--duration", type=float, default=10.0, help="measured seconds per scenario (default 10)")
    add("--warmup", type=float, default=2.0, help="warm-up seconds before each measure (default 2)")
    add(
        "--systems",
        default="direct,switchyard,litellm,portkey",
        help="comma list (default: direct,switchyard,litellm,portkey; also openai_chat, anthropic_messages, "
        "openai_completions: the same Switchyard through its other front doors)",
    )
    add("--scenarios", default="1,2,3,4,5,6,7,rss", help="comma list of 1-7 and rss (default all)")
    add("--workers", type=int, default=max(2, cpus), help="workers for scenario 6 (default: CPU count, ≥2)")
    add("--gateway-cpus", default="0", help="taskset list for the gateway under test (default 0)")
    add("--load-cpus", default="1" if cpus > 1 else "0", help="taskset list for wrk and the mocks (default 1)")
    add("--rss-requests", type=int, default=100_000, help="requests for the RSS step (default 100000)")
    add("--rss-max-s", type=float, default=240.0, help="time cap for the RSS step (default 240 s)")
    add("--results", default=str(Path(__file__).with_name("RESULTS.md")), help="file to append tables to")
    add("--no-results", action="store_true", help="print only; do not append to the results file")
    return parser


def _plan(argv: list[str]) -> Plan:
    ns = _parser().parse_args(argv)
    picked = [s.strip() for s in ns.scenarios.split(",") if s.strip()]
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir = Path("/tmp/bench-run") / stamp
    run_dir.mkdir(parents=True, exist_ok=True)
    return Plan(
        run_dir=run_dir,
        gateway_cpus=ns.gateway_cpus,
        load_cpus=ns.load_cpus,
        all_cpus=f"0-{(os.cpu_count() or 1) - 1}",
        duration=ns.duration,
        warmup=ns.warmup,
        workers=ns.workers,
        scenarios=[SCENARIO_NUMBERS[s] for s in picked if s in SCENARIO_NUMBERS],
        extra={s for s in picked if s in ("5", "6", "7", "rss")},
        systems=[s.strip() for s in ns.systems.split(",") if s.strip()],
        rss_requests=ns.rss_requests,
        rss_max_s=ns.rss_max_s,
        results_file=None if ns.no_results else Path(ns.results),
        command=shlex.join(sys.orig_argv),
    )


RESULTS_HEADER = """# Benchmark results

Appended by `bench/run.py` (see bench/README.md), newest last. Each run states its date, versions,
machine and exact command; numbers from different machines or loads are not comparable.

"""
LOG_FILES: list[Path] = []  # the run directory's bench.log, once known


def log(message: str) -> None:
    line = f"[bench {time.strftime('%H:%M:%S')}] {message}"
    print(line, file=sys.stderr, flush=True)
    for path in LOG_FILES:
        with path.open("a") as out:
            out.write(line + "\n")


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# --- setup -----------------------------------------------------------------------------------------


def ensure_tools() -> None:
    if shutil.which("wrk") is None:
        log("wrk missing: apt-get install -y wrk")
        subprocess.run(["apt-get", "install", "-y", "wrk"], check=True, stdout=subprocess.DEVNULL)
    for tool in ("taskset", "curl"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench: {tool} is required")


def install_peers(plan: Plan) -> None:
    PEERS.mkdir(parents=True, exist_ok=True)
    for key, peer in (("litellm", LiteLLM), ("portkey", Portkey)):
        if key not in plan.systems and not (key == "litellm" and "7" in plan.extra):
            continue
        log(f"installing {peer.name} under {PEERS} (skipped when present)")
        try:
            peer.install()
        except (subprocess.CalledProcessError, OSError) as exc:
            keyed = (LiteLLMKeys.name, LiteLLMLimits.name, LiteLLMMasterKey.name)
            for name in (peer.name, *(keyed if key == "litellm" else ())):
                plan.install_notes[name] = f"install failed: {exc}"


def versions(plan: Plan) -> list[str]:
    def out(argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except OSError:
            return "?"
        return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr) else "?"

    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    return [
        f"switchyard: {out(['git', '-C', str(REPO), 'describe', '--always', '--dirty'])} "
        f"({out([repo_python(), '--version'])})",
        f"litellm[proxy]: {installed_litellm() or 'not installed'}",
        f"@portkey-ai/gateway: {installed_portkey() or 'not installed'} "
        f"(@hono/node-server {package_version('@hono/node-server')}, node {out(['node', '--version'])})",
        f"load generator: {out(['wrk', '--version'])}",
        f"machine: {cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}; gateway on CPU {plan.gateway_cpus}, "
        f"wrk + mocks on CPU {plan.load_cpus}; load average at the start: {load_average()}",
    ]


# --- measuring -------------------------------------------------------------------------------------


@dataclass
class Tally:
    """Requests sent to one server (to compare with the ledger rows it wrote)."""

    sent: int = 0

    def add(self, measure: Measure) -> Measure:
        self.sent += measure.requests
        return measure


def error_hint(path: Path | None) -> str:
    """The first error line of a server's log, to say why a peer failed a check."""
    if path is None or not path.exists():
        return ""
    for line in path.read_text(errors="replace").splitlines():
        if "Error" in line or "error" in line:
            return f" (its log: `{line.strip()[:140]}`)"
    return ""


def measure(
    plan: Plan,
    target: Target,
    scenario: str,
    tally: Tally,
    server_log: Path | None = None,
    cpu: Callable[[], float] | None = None,
) -> Cell:
    """Check, warm up, measure. `cpu` (the gateway's CPU seconds so far) read around the measured
    run gives its CPU time per request, a steadier figure than throughput on a drifting machine."""
    kind, connections = SCENARIOS[scenario]
    request = target.request(kind)
    sample: Check = check(request, target.shape, stream=kind == "stream")
    tally.sent += 1
    if not sample.ok:
        log(f"  {target.name} {scenario}: check failed: {sample.problem}")
        return Cell(check=sample, detail=error_hint(server_log))
    tally.add(run_wrk(request, connections, plan.warmup, plan.load_cpus, plan.run_dir))
    used = cpu() if cpu is not None else 0.0
    result = tally.add(run_wrk(request, connections, plan.duration, plan.load_cpus, plan.run_dir))
    cpu_us = (cpu() - used) * 1e6 / result.requests if cpu is not None and result.requests else None
    log(
        f"  {target.name} {scenario}: {result.rps:,.0f}/s p50 {result.p50_ms:.2f} ms p99 {result.p99_ms:.2f} ms "
        f"errors {result.failures}"
    )
    return Cell(measure=result, check=sample, cpu_us=cpu_us)


def start(server: Server | None) -> str | None:
    """Start a server; None when it runs, else why it does not."""
    if server is None:
        return None
    log(f"starting {server.name} on CPU {server.cpus} (port {server.port})")
    try:
        server.start()
    except StartError as exc:
        log(str(exc))
        return f"does not start: {str(exc).splitlines()[0]}"
    return None


def bench_target(plan: Plan, results: Results, target: Target, scenarios: list[str]) -> Tally:
    tally = Tally()
    note = plan.install_notes.get(target.name) or target.prepare(plan.run_dir)
    server = None if note else target.server(plan.run_dir, plan.gateway_cpus)
    note = note or start(server)
    if not note and (note := target.started()) and server is not None:
        server.stop()
    if note:
        for scenario in scenarios:
            results.put(scenario, target.name, Cell(note=note))
        return tally
    try:
        before = server.rss_mb() if server else 0.0
        for scenario in scenarios:
            log_file, cpu = (server.log, server.cpu_s) if server else (None, None)
            cell = measure(plan, target, scenario, tally, log_file, cpu)
            if server is not None and server.exit_code is not None:
                cell = Cell(note=f"crashed (exit {server.exit_code}) during {scenario}")
            results.put(scenario, target.name, cell)
        detail = target.finished()
        for scenario in scenarios if detail else []:
            cell = results.cells[scenario][target.name]
            cell.detail = "; ".join(x for x in (cell.detail, detail) if x)
        if server is not None:
            ran = ", ".join(n for n, key in SCENARIO_NUMBERS.items() if key in scenarios)
            results.rss.append(
                RssRow(target.name, before, server.rss_mb(), tally.sent, f"one process through scenario(s) {ran}")
            )
    finally:
        if server is not None:
            server.stop()
    return tally


def sqlite_rows(path: Path) -> int | None:
    try:
        with sqlite3.connect(path) as db:
            row = db.execute("select count(*) from ledger").fetchone()
    except sqlite3.Error:
        return None
    return int(row[0])


def psql(sql: str, db: str = "postgres") -> str:
    argv = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-tAc", sql]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def rows_note(rows: int | None, sent: int) -> str:
    return "unknown" if rows is None else f"{rows:,} for ~{sent:,} requests"


def switchyard(mocks: Mocks, options: SwitchyardOptions) -> Switchyard:
    return Switchyard(mocks, free_port(), options)


def prepare_postgres(plan: Plan, target: Switchyard) -> str | None:
    """A fresh bench database with the schema applied; None when ready, else why not."""
    try:
        psql(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")
        psql(f"CREATE DATABASE {PG_DB}")
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"PostgreSQL unavailable: {getattr(exc, 'stderr', '') or exc}".strip()
    config = target.write_config(plan.run_dir)
    done = subprocess.run(
        [repo_python(), "-m", "app.cli", "db", "upgrade", "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return f"db upgrade failed: {(done.stderr or done.stdout).strip()[-200:]}"
    return None


@contextlib.contextmanager
def postgres_on(cpus: str, restore: str, redis: bool = False) -> Iterator[None]:
    """The PostgreSQL server's processes (and the backends they fork), and with `redis` the Redis
    server, pinned to the load CPUs while the gateway uses them, then back on `restore`.

    The server is a separate system, like the mock upstreams: in production it runs on its own
    host. Left unpinned, the scheduler put its work (≈ 19 µs of CPU per ledger row here) on the
    gateway's CPU as often as not, and the scenario measured where PostgreSQL happened to run
    rather than what the ledger costs the gateway (4–12 % across runs). The SQLite ledger is in
    the gateway's process and stays charged in full.
    """
    pids = subprocess.run(["pgrep", "-u", "postgres"], capture_output=True, text=True).stdout.split()
    if redis:  # found by its exact name (it may run as root), pinned only, never signalled
        pids += subprocess.run(["pgrep", "-x", "redis-server"], capture_output=True, text=True).stdout.split()

    def pin(to: str) -> None:
        for pid in pids:
            subprocess.run(["taskset", "-a", "-p", "-c", to, pid], capture_output=True)

    pin(cpus)
    try:
        yield
    finally:
        pin(restore)


def ledger_scenario(plan: Plan, results: Results, mocks: Mocks, sqlite_detail: str) -> None:
    """Scenario 5: SQLite (scenario 1's instance), PostgreSQL and ledger off."""
    base = results.get("throughput", "switchyard")
    if base is not None:
        results.put("ledger", SQLITE_LABEL, Cell(base.measure, base.check, base.note, sqlite_detail))
    pg = switchyard(mocks, SwitchyardOptions(PG_URL, label=PG_LABEL))
    note = prepare_postgres(plan, pg)
    if note:
        results.put("ledger", pg.name, Cell(note=note))
    else:
        with postgres_on(plan.load_cpus, plan.all_cpus):
            tally = bench_target(plan, results, pg, ["throughput"])
        moved = results.cells["throughput"].pop(pg.name)
        rows = None
        with contextlib.suppress(subprocess.CalledProcessError, OSError, ValueError):
            rows = int(psql("select count(*) from ledger", PG_DB))
        moved.detail = f"{rows_note(rows, tally.sent)}; the PostgreSQL server on CPU {plan.load_cpus}"
        results.put("ledger", pg.name, moved)
    off = switchyard(mocks, SwitchyardOptions("", ledger_enabled=False, label=OFF_LABEL))
    bench_target(plan, results, off, ["throughput"])
    moved = results.cells["throughput"].pop(off.name)
    log_text = off.log_path(plan.run_dir).read_text(errors="replace") if moved.note else ""
    if "enabled" in log_text:
        moved.note = "no switch yet: the config rejects `[ledger] enabled = false`"
    results.put("ledger", off.name, moved)
    # SQLite once more after ledger off, so the two SQLite runs bracket it: the machine drifts by
    # several per cent within one run, and ledger off, measured last, took the drift in its favour.
    again = switchyard(mocks, SwitchyardOptions("", label=SQLITE_AGAIN_LABEL))
    tally = bench_target(plan, results, again, ["throughput"])
    moved = results.cells["throughput"].pop(again.name)
    moved.detail = rows_note(sqlite_rows(plan.run_dir / f"{again.slug}.db"), tally.sent)
    results.put("ledger", again.name, moved)


def keys_scenario(plan: Plan, results: Results, mocks: Mocks) -> None:
    """Scenario 7 (issue 11): keys, budgets and rate limits, each system on PostgreSQL and Redis.

    Switchyard without keys is measured before and after the one with keys (the machine drifts
    within a run; the bar uses the mean of the two), then LiteLLM with a virtual key, then LiteLLM
    with its master key, deployment rpm/tpm and Redis, then with only its master key (the two
    stand-ins that run without a database). The PostgreSQL and
    Redis servers are pinned to the load CPUs meanwhile, like the mocks (see `postgres_on`).
    """
    stamp = plan.run_dir.name.lower()
    targets: list[Target] = [
        SwitchyardServices(mocks, free_port(), KEYS_NONE_LABEL, False, stamp),
        SwitchyardServices(mocks, free_port(), KEYS_ON_LABEL, True, stamp),
        SwitchyardServices(mocks, free_port(), KEYS_NONE_AGAIN_LABEL, False, stamp + "-again"),
        LiteLLMKeys(mocks, free_port()),
        LiteLLMLimits(mocks, free_port()),
        LiteLLMMasterKey(mocks, free_port()),
    ]
    with postgres_on(plan.load_cpus, plan.all_cpus, redis=True):
        for target in targets:
            bench_target(plan, results, target, ["throughput"])
            results.put("keys", target.name, results.cells["throughput"].pop(target.name))


def names_for(plan: Plan) -> Names:
    one = f"switchyard --workers 1 (CPU {plan.gateway_cpus})"
    many = f"switchyard --workers {plan.workers} (CPUs {plan.all_cpus})"
    return Names(
        "switchyard",
        Portkey.name,
        SQLITE_LABEL,
        SQLITE_AGAIN_LABEL,
        PG_LABEL,
        OFF_LABEL,
        one,
        many,
        KeysNames(
            KEYS_NONE_LABEL,
            KEYS_NONE_AGAIN_LABEL,
            KEYS_ON_LABEL,
            LiteLLMKeys.name,
            LiteLLMMasterKey.name,
            LiteLLMLimits.name,
        ),
    )


def workers_scenario(plan: Plan, results: Results, mocks: Mocks) -> None:
    """Scenario 6: N workers on all CPUs, next to scenario 1's single pinned worker."""
    names = names_for(plan)
    base = results.get("throughput", "switchyard")
    if base is not None:
        results.put("workers", names.workers_1, base)
    label = names.workers_n
    target = switchyard(mocks, SwitchyardOptions("", workers=plan.workers, label=label))
    saved = plan.gateway_cpus
    plan.gateway_cpus = plan.all_cpus
    try:
        bench_target(plan, results, target, ["throughput"])
    finally:
        plan.gateway_cpus = saved
    results.put("workers", label, results.cells["throughput"].pop(label))


def rss_step(plan: Plan, results: Results, mocks: Mocks) -> None:
    """A fresh Switchyard: RSS after a warm-up, then after `rss_requests` more requests at 32 connections.

    wrk cannot stop on a request count by itself (a stopped thread still waits out `-d`), so the
    warm-up's rate sets the duration and the Lua script stops sending at exactly the count.
    """
    target = switchyard(mocks, SwitchyardOptions("", label="switchyard"))
    server = target.server(plan.run_dir, plan.gateway_cpus)
    note = start(server)
    if note:
        results.rss.append(RssRow("switchyard", 0, 0, 0, note))
        return
    try:
        request = target.request("json")
        warm = run_wrk(request, 32, max(plan.warmup, 3), plan.load_cpus, plan.run_dir)
        before = server.rss_mb()
        seconds = min(plan.rss_max_s, plan.rss_requests / max(warm.rps, 1) * 1.15 + 2)
        log(
            f"RSS step: {before:.1f} MB after {warm.requests:,} warm-up requests; "
            f"{plan.rss_requests:,} requests in at most {seconds:.0f} s"
        )
        done = run_wrk(request, 32, seconds, plan.load_cpus, plan.run_dir, max_requests=plan.rss_requests)
        time.sleep(1)
        after = server.rss_mb()
        short = "" if done.requests >= plan.rss_requests else f"; stopped short after {seconds:.0f} s"
        note = f"fresh process after {warm.requests:,} warm-up requests, {done.failures} errors{short}"
        results.rss.append(RssRow("switchyard", before, after, done.requests, note))
    finally:
        server.stop()


# --- output ----------------------------------------------------------------------------------------


def render(plan: Plan, results: Results, names: Names, header: list[str]) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## Run {now}",
        "",
        *[f"- {v}" for v in header],
        "",
        "Command:",
        "",
        "```",
        f"cd {REPO} && {plan.command}",
        "```",
        "",
    ]
    sections = [
        ("throughput", report.throughput(results)),
        ("latency", report.latency(results)),
        ("slow", report.slow_upstream(results)),
        ("stream", report.streaming(results)),
        ("ledger", report.ledger(results, names.ledger_on)),
        ("workers", report.workers(results, names.workers_1)),
        ("keys", report.keys(results, names)),
    ]
    for key, section in sections:
        if results.cells.get(key):
            lines += [*section, ""]
    if results.rss:
        lines += [*report.memory(results), ""]
    lines += [*report.bar(results, names), ""]
    lines.append(f"Load average at the end: {load_average()}. Logs and configs of this run: {plan.run_dir}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    plan = _plan(argv)
    LOG_FILES.append(plan.run_dir / "bench.log")
    ensure_tools()
    install_peers(plan)
    header = versions(plan)
    mocks = Mocks.create(plan.run_dir, plan.load_cpus, free_port(), free_port())
    results = Results(litellm=LiteLLM.name)
    for server in (mocks.fast, mocks.slow):
        if start(server):
            raise SystemExit(f"bench: the mock upstream does not start; see {server.log}")
    sy = switchyard(mocks, SwitchyardOptions("", label="switchyard"))
    catalogue: dict[str, Target] = {
        "direct": Direct(mocks, mocks.fast.port),
        "switchyard": sy,
        **{
            door: SwitchyardIngress(mocks, free_port(), SwitchyardOptions("", label=f"switchyard {door}"), door)
            for door in SwitchyardIngress.DOORS
        },
        "litellm": LiteLLM(mocks, free_port()),
        "portkey": Portkey(mocks, free_port()),
    }
    names = names_for(plan)
    try:
        sy_tally = Tally()
        for key in plan.systems:
            tally = bench_target(plan, results, catalogue[key], plan.scenarios)
            sy_tally = tally if key == "switchyard" else sy_tally
        if "5" in plan.extra:
            rows = sqlite_rows(plan.run_dir / f"{sy.slug}.db")
            ledger_scenario(plan, results, mocks, rows_note(rows, sy_tally.sent) + " (the instance of scenarios 1–4)")
        if "6" in plan.extra:
            workers_scenario(plan, results, mocks)
        if "7" in plan.extra:
            keys_scenario(plan, results, mocks)
        if "rss" in plan.extra:
            rss_step(plan, results, mocks)
    finally:
        mocks.fast.stop()
        mocks.slow.stop()
    text = render(plan, results, names, header)
    if plan.results_file is not None:
        fresh = not plan.results_file.exists()
        with plan.results_file.open("a") as out:
            out.write(RESULTS_HEADER if fresh else "\n")
            out.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
