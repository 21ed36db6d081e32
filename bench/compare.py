"""Two checkouts of Switchyard side by side (A/B): `python bench/compare.py --base DIR [--new DIR]`;
or one checkout's native endpoint against another of its front doors: `--door openai_chat` (or
`anthropic_messages`, `openai_completions`), where "base" is `/api/v1/completions` and "new" the
door, both from `--new`'s tree, and the bar is issue 10's (within 10 %) instead of issue 9's (3 %);
or `--keys`: run.py's scenario 7 pair from `--new`'s tree, "base" `[auth] mode = "none"` and "new"
`keys` with a key that has a budget, rpm and tpm (bench/keyed.py: both on PostgreSQL and Redis, pinned
with the load), against issue 11's bar (keys keep ≥ 90 % of none's throughput);
or `--ledger-cost`: "base" `[ledger] enabled = false` and "new" the SQLite ledger, both from `--new`'s
tree, against issue 12's bar (the ledger costs ≤ 5 %). The SQLite ledger's writer process
(`catalog.sqlite_child`) inherits the gateway's CPU, so its work is charged to the gateway in full;
`--writer-cpus 1` pins it to the load CPUs instead, as run.py pins a PostgreSQL server.
`--ledger-cost postgres`: "new" is the PostgreSQL ledger instead (a fresh `switchyard_bench`
database, as run.py's scenario 5), the PostgreSQL server pinned to the load CPUs for the run.

One run of bench/run.py drifts by several per cent over minutes on this machine, so a before/after
comparison is a series of pairs instead: in each pair every scenario is measured on both trees back
to back, each time a fresh gateway process started from its own tree (cwd and PYTHONPATH) with the
same generated config (SQLite ledger on, as run.py's scenario 1), and the order alternates from pair
to pair (base first, then new first, …) so a steady drift cancels. The number to read is the ratio
new/base of each pair, then their mean and spread. Every gateway prints the files its `app`,
`catalog` and `providers` packages came from before it starts serving; a process that imported
another tree stops the run. The rest is run.py's: one mock upstream (the new tree's), wrk pinned
with it to the load CPUs, the gateway alone on its CPU, a curl check before every measure.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import run
from keyed import SwitchyardServices
from peers import REPO, Direct, Mocks, Switchyard, SwitchyardIngress, SwitchyardOptions, repo_python
from procs import Server, free_port
from report import CHUNKS, Cell, _fmt, _table
from run import Plan, Tally, log, measure, start

SIDES = ("base", "new")
BAR = 0.03  # the largest slowdown the bar allows, as a fraction: issue 9's, tree against tree
DOOR_BAR = 0.10  # issue 10's: a front door against the native endpoint
KEYS_BAR = 0.10  # issue 11's: keys mode against `none`
LEDGER_BAR = 0.05  # issue 12's: a ledger (journal and writer) against ledger off
MARK = "bench-compare imports:"
_LEDGERS = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
PROBE = (  # the gateway's entry point: `python -m app.cli …`, after printing where its packages come from
    "import runpy, sys\nimport app, catalog, providers\n"
    f"print({MARK!r}, app.__file__, catalog.__file__, providers.__file__, flush=True)\n"
    "runpy.run_module('app.cli', run_name='__main__', alter_sys=True)\n"
)
# run.py's scenario key -> (title, metric, higher is better)
METRICS = {
    "throughput": ("1. Non-streaming throughput, 32 connections", "req/s", True),
    "latency": ("2. Latency, 1 connection", "p50 ms", False),
    "stream": ("4. Streaming 64-chunk responses, 16 connections", "chunks/s", True),
}


def _from_tree(plain: Server, tree: Path) -> Server:
    """A gateway's `Server`, started from `tree` through PROBE."""
    args = plain.argv[plain.argv.index("app.cli") + 1 :]
    argv = [plain.argv[0], "-c", PROBE, *args]
    return replace(plain, argv=argv, cwd=tree, env={"PYTHONPATH": str(tree)})


class TreeSwitchyard(Switchyard):
    """run.py's Switchyard target, started from another checkout through PROBE."""

    def __init__(self, mocks: Mocks, options: SwitchyardOptions, tree: Path) -> None:
        super().__init__(mocks, free_port(), options)
        self.tree = tree

    def server(self, run_dir: Path, cpus: str) -> Server:
        return _from_tree(super().server(run_dir, cpus), self.tree)


class TreePostgres(TreeSwitchyard):
    """run.py's Switchyard with the PostgreSQL ledger (scenario 5's), started from a checkout: a fresh
    bench database before it starts, with the schema of this checkout's migrations (run.py's
    `prepare_postgres`), whichever tree the gateway comes from."""

    def __init__(self, mocks: Mocks, label: str, tree: Path, plan: Plan) -> None:
        super().__init__(mocks, SwitchyardOptions(run.PG_URL, label=label), tree)
        self.plan = plan

    def prepare(self, run_dir: Path) -> str | None:
        return run.prepare_postgres(self.plan, self)


class TreeIngress(SwitchyardIngress):
    """run.py's Switchyard through one of its other front doors, started from a checkout."""

    def __init__(self, mocks: Mocks, options: SwitchyardOptions, tree: Path, door: str) -> None:
        super().__init__(mocks, free_port(), options, door)
        self.tree = tree

    def server(self, run_dir: Path, cpus: str) -> Server:
        return _from_tree(super().server(run_dir, cpus), self.tree)


@dataclass
class Job:
    plan: Plan  # run.py's: CPUs, durations, run directory, results file, command
    trees: dict[str, Path]  # "base" / "new" -> checkout
    pairs: int
    ledger: bool = True  # False: `[ledger] enabled = false` in both trees (what the rest of the path costs)
    door: str = ""  # set: "base" is the native endpoint and "new" this front door, both from the new tree
    interleave: bool = False  # both gateways up for the whole run, measured in turn (`run_interleaved`)
    keys: bool = False  # "base" is auth none and "new" keys mode, both from the new tree (bench/keyed.py)
    ledger_cost: str = ""  # "sqlite"/"postgres": "base" is ledger off and "new" that ledger, both from the new tree
    writer_cpus: str = ""  # set: the SQLite writer processes are pinned there (`writers_pinned`)
    imports: dict[str, str] = field(default_factory=dict)  # side -> what its last process imported
    described: dict[str, str] = field(default_factory=dict)  # side -> `git describe` at the start
    cells: dict[str, list[dict[str, Cell]]] = field(default_factory=dict)  # scenario -> per pair, side -> cell


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--base", type=Path, help="checkout measured as the baseline (required without --door)")
    add("--door", choices=sorted(SwitchyardIngress.DOORS), help="native endpoint (base) against this door (new)")
    add("--keys", action="store_true", help="auth none (base) against keys mode (new), PostgreSQL and Redis")
    add("--new", default=REPO, type=Path, help=f"checkout measured against it (default {REPO})")
    add("--scenarios", default="1,2,4", help="comma list of run.py's scenarios 1, 2, 4 (default all three)")
    add("--pairs", type=int, default=3, help="base/new pairs per scenario, order alternating (default 3)")
    add("--duration", type=float, default=10.0, help="measured seconds per scenario and tree (default 10)")
    add("--warmup", type=float, default=2.0, help="warm-up seconds before each measure (default 2)")
    add("--ledger", choices=("sqlite", "off"), default="sqlite", help="the gateways' ledger (default sqlite)")
    add(
        "--ledger-cost",
        nargs="?",
        const="sqlite",
        default="",
        choices=("sqlite", "postgres"),
        help="ledger off (base) against the SQLite (default) or the PostgreSQL ledger (new), one tree",
    )
    add("--writer-cpus", default="", help="taskset list for the SQLite writer processes (default: the gateway's)")
    add(
        "--interleave",
        action="store_true",
        help="start both gateways once (both on the gateway CPU) and alternate short measures between them, "
        "instead of a fresh gateway per measure: for many short pairs, e.g. scenario 2 at 20 pairs of 2 s",
    )
    add("--gateway-cpus", default="0", help="taskset list for the gateway under test (default 0)")
    add("--load-cpus", default="1" if (os.cpu_count() or 1) > 1 else "0", help="for wrk and the mock (default 1)")
    add("--results", default=str(Path(__file__).with_name("RESULTS.md")), help="file to append tables to")
    add("--no-results", action="store_true", help="print only; do not append to the results file")
    return parser


def _job(argv: list[str]) -> Job:
    ns = _parser().parse_args(argv)
    picked = [run.SCENARIO_NUMBERS.get(s.strip(), s.strip()) for s in ns.scenarios.split(",") if s.strip()]
    if not picked or any(s not in METRICS for s in picked):
        raise SystemExit(f"compare: --scenarios takes 1, 2 and 4, not {ns.scenarios!r}")
    picked = sorted(set(picked), key=list(METRICS).index)
    if sum((ns.base is not None, ns.door is not None, ns.keys, bool(ns.ledger_cost))) != 1:
        raise SystemExit(
            "compare: give one of --base (tree against tree), --door (door against the native endpoint), "
            "--keys (keys mode against none) and --ledger-cost (a ledger against ledger off)"
        )
    if ns.keys and ns.new.resolve() != REPO:
        raise SystemExit(f"compare: --keys measures this checkout ({REPO}); --new is not for it")
    trees = {"base": (ns.base or ns.new).resolve(), "new": ns.new.resolve()}
    for side, tree in trees.items():
        if not (tree / "app" / "cli.py").is_file():
            raise SystemExit(f"compare: --{side} {tree} is not a Switchyard checkout (no app/cli.py)")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir = Path("/tmp/bench-run") / f"{stamp}-compare"
    run_dir.mkdir(parents=True, exist_ok=True)
    cpus = f"0-{(os.cpu_count() or 1) - 1}"
    results = None if ns.no_results else Path(ns.results)
    plan = Plan(
        run_dir,
        ns.gateway_cpus,
        ns.load_cpus,
        cpus,
        ns.duration,
        ns.warmup,
        1,
        picked,
        set(),
        [],
        0,
        0.0,
        results,
        shlex.join(sys.orig_argv),
    )
    job = Job(plan, trees, max(1, ns.pairs), ns.ledger == "sqlite", ns.door or "", ns.interleave, ns.keys)
    job.ledger_cost, job.writer_cpus = ns.ledger_cost, ns.writer_cpus
    return job


# --- measuring -------------------------------------------------------------------------------------


def imported_from(job: Job, server: Server, side: str) -> str:
    """The package files PROBE printed, checked to lie in the side's tree; stops the run when they
    do not. `--keys` starts bench/keyed.py's gateways from this checkout, without PROBE."""
    if job.keys:
        return f"{REPO} (bench/keyed.py's gateway, started from this checkout)"
    tree = job.trees[side]
    lines = server.log.read_text(errors="replace").splitlines()
    line = next((ln for ln in lines if ln.startswith(MARK)), "")
    files = [Path(f).resolve() for f in line.removeprefix(MARK).split()]
    if len(files) != 3 or not all(f.is_relative_to(tree) for f in files):
        raise SystemExit(f"compare: {server.name} did not import {tree}: {line or 'no import line in its log'}")
    return ", ".join(str(f) for f in files)


def side_target(job: Job, mocks: Mocks, side: str, label: str) -> Switchyard:
    if job.keys:
        stamp = f"{job.plan.run_dir.name.lower()}-{label.replace(' ', '-')}"
        return SwitchyardServices(mocks, free_port(), label, side == "new", stamp)
    if job.ledger_cost == "postgres" and side == "new":
        return TreePostgres(mocks, label, job.trees[side], job.plan)
    options = SwitchyardOptions("", ledger_enabled=side == "new" if job.ledger_cost else job.ledger, label=label)
    if job.door and side == "new":
        return TreeIngress(mocks, options, job.trees[side], job.door)
    return TreeSwitchyard(mocks, options, job.trees[side])


def measure_side(job: Job, mocks: Mocks, side: str, label: str, scenario: str) -> Cell:
    """One fresh gateway from `side`'s tree: start, check the imports, curl check, warm up, measure, stop."""
    target = side_target(job, mocks, side, label)
    note = target.prepare(job.plan.run_dir)
    if note:
        return Cell(note=note)
    server = target.server(job.plan.run_dir, job.plan.gateway_cpus)
    note = start(server)
    if note:
        return Cell(note=note)
    try:
        job.imports[side] = imported_from(job, server, side)
        cell = measure(job.plan, target, scenario, Tally(), server.log, server.cpu_s)
        return Cell(note=f"crashed (exit {server.exit_code})") if server.exit_code is not None else cell
    finally:
        server.stop()


def run_pairs(job: Job, mocks: Mocks) -> None:
    job.cells = {scenario: [] for scenario in job.plan.scenarios}
    for pair in range(job.pairs):
        order = SIDES if pair % 2 == 0 else SIDES[::-1]
        log(f"pair {pair + 1}/{job.pairs}: {' then '.join(order)}")
        for scenario in job.plan.scenarios:
            row: dict[str, Cell] = {}
            if scenario == "latency":  # the floor, for the added latency
                row["direct"] = measure(job.plan, Direct(mocks, mocks.fast.port), scenario, Tally())
            for side in order:
                row[side] = measure_side(job, mocks, side, f"{side} {pair + 1} {scenario}", scenario)
            job.cells[scenario].append(row)


def run_interleaved(job: Job, mocks: Mocks) -> None:
    """Both gateways started once, on the gateway CPU, and measured in turn (the order alternating
    from pair to pair): no start-up between measures, so pairs can be short and many, and the one
    not measured sits idle in its event loop. Each measure is run.py's (check, warm-up, measure)."""
    job.cells = {scenario: [] for scenario in job.plan.scenarios}
    targets = {side: side_target(job, mocks, side, f"{side} interleaved") for side in SIDES}
    for side in SIDES:
        if note := targets[side].prepare(job.plan.run_dir):
            raise SystemExit(f"compare: the {side} gateway cannot be prepared: {note}")
    servers = {side: targets[side].server(job.plan.run_dir, job.plan.gateway_cpus) for side in SIDES}
    try:
        for side in SIDES:
            note = start(servers[side])
            if note:
                raise SystemExit(f"compare: the {side} gateway {note}")
            job.imports[side] = imported_from(job, servers[side], side)
        for pair in range(job.pairs):
            order = SIDES if pair % 2 == 0 else SIDES[::-1]
            log(f"pair {pair + 1}/{job.pairs}: {' then '.join(order)}")
            for scenario in job.plan.scenarios:
                row: dict[str, Cell] = {}
                if scenario == "latency":
                    row["direct"] = measure(job.plan, Direct(mocks, mocks.fast.port), scenario, Tally())
                for side in order:
                    server = servers[side]
                    row[side] = measure(job.plan, targets[side], scenario, Tally(), server.log, server.cpu_s)
                job.cells[scenario].append(row)
    finally:
        for server in servers.values():
            server.stop()


# --- output ----------------------------------------------------------------------------------------


def value(scenario: str, cell: Cell | None) -> float | None:
    if cell is None or not cell.usable or cell.measure is None or cell.measure.failures:
        return None
    m = cell.measure
    if scenario == "latency":
        return m.p50_ms
    chunks = cell.check.chunks if cell.check is not None and cell.check.chunks else CHUNKS
    return m.rps * chunks if scenario == "stream" else m.rps


def shown(scenario: str, cell: Cell) -> str:
    number = value(scenario, cell)
    if number is not None:
        return _fmt(number, 3 if scenario == "latency" else 0)
    if cell.usable and cell.measure is not None:
        return f"{cell.measure.failures:,} errors"
    return cell.failure()


def verdict(ratios: list[float], higher: bool, bar: float = BAR) -> tuple[str, str]:
    """The mean ratio with its spread, and whether it meets the bar."""
    if not ratios:
        return "—", "n/a: no pair measured both trees"
    mean = sum(ratios) / len(ratios)
    ordered = sorted(ratios)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    limit = 1 - bar if higher else 1 + bar
    met = mean >= limit if higher else mean <= limit
    crossed = min(ratios) < limit <= max(ratios) if higher else min(ratios) <= limit < max(ratios)
    rule = f"mean new/base {'≥' if higher else '≤'} {limit:.2f}, {'higher' if higher else 'lower'} is better"
    note = "; single pairs fall on both sides of it" if crossed else ""
    spread = f"{mean:.3f} ({min(ratios):.3f}..{max(ratios):.3f}; median {median:.3f})"
    return spread, f"**{'yes' if met else 'NO'}** ({rule}{note})"


def scenario_table(scenario: str, rows: list[dict[str, Cell]], bar: float = BAR) -> list[str]:
    title, unit, higher = METRICS[scenario]
    header = ["pair", "order", f"base {unit}", f"new {unit}", "new/base"]
    header += ["direct p50 ms", "base added ms", "new added ms"] if scenario == "latency" else []
    header += ["base CPU µs/req", "new CPU µs/req", "CPU new/base"]
    body, ratios, cpu_ratios = [], [], []
    for pair, row in enumerate(rows):
        base, new = value(scenario, row["base"]), value(scenario, row["new"])
        ratio = new / base if base and new else None
        ratios += [ratio] if ratio else []
        order = "base, new" if pair % 2 == 0 else "new, base"
        line = [str(pair + 1), order, shown(scenario, row["base"]), shown(scenario, row["new"]), _fmt(ratio, 3)]
        if scenario == "latency":
            floor = value(scenario, row.get("direct"))
            added = [None if x is None or floor is None else x - floor for x in (base, new)]
            line += [_fmt(floor, 3), *(_fmt(x, 3) for x in added)]
        cpu_base, cpu_new = row["base"].cpu_us, row["new"].cpu_us
        cpu_ratio = cpu_new / cpu_base if cpu_base and cpu_new else None
        cpu_ratios += [cpu_ratio] if cpu_ratio else []
        body.append([*line, _fmt(cpu_base, 1), _fmt(cpu_new, 1), _fmt(cpu_ratio, 3)])
    spread, met = verdict(ratios, higher, bar)
    cpu_spread = verdict(cpu_ratios, higher=False)[0]
    body.append(["mean (min..max)", "", "", "", spread, *([""] * (len(header) - 6)), cpu_spread])
    return [
        f"### {title}",
        "",
        *_table(header, body),
        "",
        f"Within the {bar * 100:g} % bar: {met}. CPU µs/req: the gateway's user + system time over the measured "
        "run divided by its requests (lower is better). It leaves out time the gateway's CPU went to something "
        "else (another process, the hypervisor), so it drifts less than throughput; it is not the bar.",
    ]


def describe(tree: Path, before: str | None = None) -> str:
    done = subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty"], capture_output=True, text=True)
    now = done.stdout.strip() or "not a git checkout"
    return now if before in (None, now) else f"{before} (changed during the run: {now} at the end)"


def render(job: Job, machine: list[str]) -> str:
    plan, trees = job.plan, job.trees
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    base, new = (describe(trees[s], job.described[s]) for s in SIDES)
    title = f"native endpoint (base) vs {job.door} (new), both {new}" if job.door else f"base {base} vs new {new}"
    if job.keys:
        title = f"auth none (base) vs keys with budget, rpm and tpm (new), PostgreSQL and Redis, both {new}"
    if job.ledger_cost:
        title = f"ledger off (base) vs the {_LEDGERS[job.ledger_cost]} ledger (new), both {new}"
    lines = [f"## A/B comparison {now}: {title}", ""]
    lines += [f"- {s}: {trees[s]}; its gateways imported {job.imports.get(s, 'nothing (none started)')}" for s in SIDES]
    lines += [
        f"- {job.pairs} pair(s), base first in odd pairs and new first in even ones; {plan.warmup:g} s warm-up and "
        f"{plan.duration:g} s measured per tree and scenario, "
        f"{'both gateways up for the whole run, on one CPU' if job.interleave else 'each on a fresh gateway'} "
        f"({ledger_words(job)})",
        f"- mock upstream: the new tree's `devtools.mock_upstream --chunks 64`; python: {repo_python()} "
        f"({platform.python_version()})",
        *[f"- {line}" for line in machine],
        "",
        "Command:",
        "",
        "```",
        f"cd {Path.cwd()} && {plan.command}",
        "```",
        "",
    ]
    for scenario, rows in job.cells.items():
        bar = KEYS_BAR if job.keys else LEDGER_BAR if job.ledger_cost else DOOR_BAR if job.door else BAR
        lines += [*scenario_table(scenario, rows, bar), ""]
    lines.append(f"Load average at the end: {run.load_average()}. Logs and configs of this run: {plan.run_dir}")
    return "\n".join(lines) + "\n"


def ledger_words(job: Job) -> str:
    if job.keys:
        return "PostgreSQL ledger and Redis, their servers pinned to the load CPUs, as run.py's scenario 7"
    if job.ledger_cost == "postgres":
        return f"ledger off against the PostgreSQL ledger; the PostgreSQL server pinned to CPUs {job.plan.load_cpus}"
    if job.ledger_cost:
        where = f"pinned to CPUs {job.writer_cpus}" if job.writer_cpus else "on the gateway's CPU (inherited)"
        return f"ledger off against the SQLite ledger; its writer processes {where}"
    return "SQLite ledger on" if job.ledger else "ledger off in both trees: `[ledger] enabled = false`"


@contextlib.contextmanager
def writers_pinned(cpus: str) -> Iterator[None]:
    """Every SQLite ledger writer process (`catalog.sqlite_child`, started with a gateway's
    ledger writer) pinned to `cpus` as soon as it appears (checked every 0.1 s), while the run lasts."""
    stop, pinned = threading.Event(), set()

    def watch() -> None:
        while not stop.wait(0.1):
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit() and entry.name not in pinned:
                    with contextlib.suppress(OSError):
                        if b"catalog.sqlite_child" in (entry / "cmdline").read_bytes():
                            subprocess.run(["taskset", "-a", "-p", "-c", cpus, entry.name], capture_output=True)
                            pinned.add(entry.name)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def main(argv: list[str]) -> int:
    job = _job(argv)
    run.LOG_FILES.append(job.plan.run_dir / "compare.log")
    run.ensure_tools()
    job.described = {side: describe(tree) for side, tree in job.trees.items()}
    machine = [v for v in run.versions(job.plan) if v.startswith(("load generator", "machine"))]
    mocks = Mocks.create(job.plan.run_dir, job.plan.load_cpus, free_port(), free_port())
    mocks.fast.cwd, mocks.fast.env = job.trees["new"], {"PYTHONPATH": str(job.trees["new"])}
    if start(mocks.fast):  # scenarios 1, 2 and 4 only use the fast mock
        raise SystemExit(f"compare: the mock upstream does not start; see {mocks.fast.log}")
    try:
        with (
            run.postgres_on(job.plan.load_cpus, job.plan.all_cpus, redis=job.keys)
            if job.keys or job.ledger_cost == "postgres"
            else nullcontext(),
            writers_pinned(job.writer_cpus) if job.writer_cpus else nullcontext(),
        ):
            (run_interleaved if job.interleave else run_pairs)(job, mocks)
    finally:
        mocks.fast.stop()
    text = render(job, machine)
    if job.plan.results_file is not None:
        fresh = not job.plan.results_file.exists()
        with job.plan.results_file.open("a") as out:
            out.write(run.RESULTS_HEADER if fresh else "\n")
            out.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
