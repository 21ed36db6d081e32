"""The benchmark's tables: one markdown table per scenario, the RSS table and the bar check.

Ratios read "how many times better": throughput and chunks/s divide by LiteLLM's (higher is
better), latencies divide LiteLLM's added latency by ours (higher is better). "vs direct" compares
with the mock called without a gateway (the floor). A system that errored or could not stream
keeps its row with the reason instead of numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from load import Check, Measure

CHUNKS = 64


@dataclass
class Cell:
    """One system in one scenario: the wrk measure and/or the curl check, or why there is none."""

    measure: Measure | None = None
    check: Check | None = None
    note: str = ""  # why there is no usable measure (shown instead of numbers)
    detail: str = ""  # extra facts shown next to the numbers (ledger rows written)
    cpu_us: float | None = None  # the gateway's CPU time per measured request (user + system), when read

    @property
    def usable(self) -> bool:
        ok_check = self.check is None or self.check.ok
        return ok_check and self.measure is not None and self.measure.error is None and self.measure.requests > 0

    def failure(self) -> str:
        if self.note:
            return self.note
        if self.check is not None and not self.check.ok:
            return f"fails: {self.check.problem}{self.detail}"
        if self.measure is None:
            return "not measured"
        if self.measure.error:
            return f"fails: {self.measure.error}"
        m = self.measure
        return f"fails: no response completed in {m.seconds:.0f} s ({m.socket_errors:,} socket errors/timeouts)"


@dataclass
class RssRow:
    system: str
    before_mb: float
    after_mb: float
    requests: int
    note: str = ""


@dataclass
class Results:
    """Everything one run measured, keyed by scenario then system name."""

    cells: dict[str, dict[str, Cell]] = field(default_factory=dict)
    rss: list[RssRow] = field(default_factory=list)
    direct: str = "direct (mock)"
    litellm: str = ""

    def put(self, scenario: str, system: str, cell: Cell) -> None:
        self.cells.setdefault(scenario, {})[system] = cell

    def get(self, scenario: str, system: str) -> Cell | None:
        return self.cells.get(scenario, {}).get(system)

    def measure(self, scenario: str, system: str) -> Measure | None:
        cell = self.get(scenario, system)
        return cell.measure if cell is not None and cell.usable else None


def _fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "—" if value is None else f"{value:,.{digits}f}{suffix}"


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None or ours <= 0 or theirs <= 0:
        return None
    return ours / theirs


def _errors(measure: Measure) -> str:
    if not measure.failures:
        return "0"
    return f"{measure.failures:,} ({measure.non2xx:,} non-2xx, {measure.socket_errors:,} socket)"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


Row = Callable[[str, Cell], list[str]]


def _rows(results: Results, scenario: str, width: int, row: Row) -> list[list[str]]:
    out = []
    for system, cell in results.cells.get(scenario, {}).items():
        if cell.usable:
            out.append([system, *row(system, cell)])
        else:
            out.append([system, cell.failure(), *([""] * (width - 2))])
    return out


def throughput(results: Results) -> list[str]:
    lite = results.measure("throughput", results.litellm)
    floor = results.measure("throughput", results.direct)

    def row(system: str, cell: Cell) -> list[str]:
        m = cell.measure
        assert m is not None
        vs_lite = _ratio(m.rps, lite.rps if lite else None)
        vs_direct = _ratio(m.rps, floor.rps if floor else None)
        return [
            _fmt(m.rps, 0),
            _fmt(m.p50_ms, 2),
            _fmt(m.p99_ms, 2),
            _fmt(vs_lite, 1, "×"),
            _fmt(None if vs_direct is None else 100 * vs_direct, 1, " %"),
            _errors(m),
        ]

    header = ["system", "req/s", "p50 ms", "p99 ms", "vs LiteLLM", "of direct", "errors"]
    title = "### 1. Non-streaming throughput, 32 connections"
    return [title, "", *_table(header, _rows(results, "throughput", len(header), row))]


def latency(results: Results) -> list[str]:
    floor = results.measure("latency", results.direct)
    lite = results.measure("latency", results.litellm)

    def added(m: Measure | None, p99: bool = False) -> float | None:
        if m is None or floor is None:
            return None
        return (m.p99_ms - floor.p99_ms) if p99 else (m.p50_ms - floor.p50_ms)

    def row(system: str, cell: Cell) -> list[str]:
        m = cell.measure
        assert m is not None
        vs_lite = _ratio(added(lite), added(m))
        vs_direct = _ratio(m.p50_ms, floor.p50_ms if floor else None)
        return [
            _fmt(m.p50_ms, 3),
            _fmt(m.p99_ms, 3),
            _fmt(added(m), 3),
            _fmt(added(m, True), 3),
            _fmt(vs_lite, 1, "× less"),
            _fmt(vs_direct, 1, "×"),
            _errors(m),
        ]

    header = [
        "system",
        "p50 ms",
        "p99 ms",
        "added p50 ms",
        "added p99 ms",
        "vs LiteLLM (added p50)",
        "p50 vs direct",
        "errors",
    ]
    title = "### 2. Added latency, 1 connection (over the direct call)"
    return [title, "", *_table(header, _rows(results, "latency", len(header), row))]


def slow_upstream(results: Results) -> list[str]:
    lite = results.measure("slow", results.litellm)

    def row(system: str, cell: Cell) -> list[str]:
        m = cell.measure
        assert m is not None
        over = m.p99_ms - 50
        lite_over = lite.p99_ms - 50 if lite else None
        return [
            _fmt(m.rps, 0),
            _fmt(m.p50_ms, 2),
            _fmt(m.p99_ms, 2),
            _fmt(over, 2),
            _fmt(_ratio(lite_over, over), 1, "× less"),
            _errors(m),
        ]

    header = ["system", "req/s", "p50 ms", "p99 ms", "p99 over 50 ms", "vs LiteLLM (p99 over)", "errors"]
    title = "### 3. 50 ms upstream, 256 connections"
    return [title, "", *_table(header, _rows(results, "slow", len(header), row))]


def streaming(results: Results) -> list[str]:
    lite = results.measure("stream", results.litellm)
    floor = results.measure("stream", results.direct)

    def row(system: str, cell: Cell) -> list[str]:
        m = cell.measure
        assert m is not None
        chunks = cell.check.chunks if cell.check and cell.check.chunks is not None else CHUNKS
        vs_lite = _ratio(m.rps, lite.rps if lite else None)
        vs_direct = _ratio(m.rps, floor.rps if floor else None)
        return [
            _fmt(m.rps, 0),
            _fmt(m.rps * chunks, 0),
            str(chunks),
            _fmt(m.p50_ms, 2),
            _fmt(m.p99_ms, 2),
            _fmt(vs_lite, 1, "×"),
            _fmt(None if vs_direct is None else 100 * vs_direct, 1, " %"),
            _errors(m),
        ]

    header = [
        "system",
        "responses/s",
        "chunks/s",
        "chunks seen (curl)",
        "p50 ms",
        "p99 ms",
        "vs LiteLLM",
        "of direct",
        "errors",
    ]
    title = "### 4. Streaming 64-chunk responses, 16 connections"
    return [title, "", *_table(header, _rows(results, "stream", len(header), row))]


def ledger(results: Results, baseline: str) -> list[str]:
    base = results.measure("ledger", baseline)

    base_cpu = results.get("ledger", baseline)

    def row(system: str, cell: Cell) -> list[str]:
        m = cell.measure
        assert m is not None
        change = None if base is None else 100 * (m.rps / base.rps - 1)
        cpu = _ratio(cell.cpu_us, base_cpu.cpu_us if base_cpu else None)
        cpu_change = None if cpu is None else 100 * (cpu - 1)
        return [
            _fmt(m.rps, 0),
            _fmt(m.p50_ms, 2),
            _fmt(m.p99_ms, 2),
            _fmt(change, 1, " %"),
            _fmt(cell.cpu_us, 1),
            _fmt(cpu_change, 1, " %"),
            cell.detail,
            _errors(m),
        ]

    header = ["system", "req/s", "p50 ms", "p99 ms", f"req/s vs {baseline}", "CPU µs/req", "CPU vs it"]
    header += ["ledger rows", "errors"]
    title = "### 5. The price of accounting (Switchyard, 32 connections, non-streaming)"
    return [title, "", *_table(header, _rows(results, "ledger", len(header), row))]


def workers(results: Results, one: str) -> list[str]:
    base = results.measure("workers", one)

    def row(system: str, cell: Cell) -> list[str]:
        m = cell.measure
        assert m is not None
        return [
            _fmt(m.rps, 0),
            _fmt(m.p50_ms, 2),
            _fmt(m.p99_ms, 2),
            _fmt(_ratio(m.rps, base.rps if base else None), 2, "×"),
            _errors(m),
        ]

    header = ["system", "req/s", "p50 ms", "p99 ms", "vs 1 worker", "errors"]
    title = "### 6. Workers (Switchyard, 32 connections, non-streaming)"
    return [title, "", *_table(header, _rows(results, "workers", len(header), row))]


def memory(results: Results) -> list[str]:
    rows = [
        [
            r.system,
            _fmt(r.before_mb),
            _fmt(r.after_mb),
            _fmt(r.after_mb - r.before_mb, 1, " MB"),
            f"{r.requests:,}",
            r.note,
        ]
        for r in results.rss
    ]
    header = ["system", "RSS before MB", "RSS after MB", "growth", "requests between", "note"]
    return ["### Memory (VmRSS, summed over the process tree)", "", *_table(header, rows)]


@dataclass(frozen=True)
class KeysNames:
    """Scenario 7's system names (issue 11)."""

    none: str  # Switchyard auth none, PostgreSQL + Redis
    none_again: str  # the same after the keyed run
    keys: str  # Switchyard with a key that has a budget, rpm and tpm
    litellm_keys: str  # LiteLLM with a virtual key, PostgreSQL, Redis
    litellm_master: str  # LiteLLM with its master key, no database (the stand-in)
    litellm_limits: str = ""  # LiteLLM with its master key, deployment rpm/tpm, Redis (a nearer stand-in)


def keys(results: Results, names: Names) -> list[str]:
    """Scenario 7: keys and limits; ratios against Switchyard without keys and against LiteLLM."""
    k = names.keys
    assert k is not None
    runs = [m.rps for m in (results.measure("keys", k.none), results.measure("keys", k.none_again)) if m]
    none_rps = sum(runs) / len(runs) if runs else None
    cpus = [c.cpu_us for c in (results.get("keys", k.none), results.get("keys", k.none_again)) if c and c.cpu_us]
    none_cpu = sum(cpus) / len(cpus) if cpus else None
    lite = (
        results.measure("keys", k.litellm_keys)
        or results.measure("keys", k.litellm_limits)
        or results.measure("keys", k.litellm_master)
    )

    def row(system: str, cell: Cell) -> list[str]:
        m = cell.measure
        assert m is not None
        return [
            _fmt(m.rps, 0),
            _fmt(m.p50_ms, 2),
            _fmt(m.p99_ms, 2),
            _fmt(None if none_rps is None else 100 * m.rps / none_rps, 1, " %"),
            _fmt(_ratio(m.rps, lite.rps if lite else None), 1, "×"),
            _fmt(cell.cpu_us, 1),
            _fmt(None if none_cpu is None or cell.cpu_us is None else 100 * none_cpu / cell.cpu_us, 1, " %"),
            cell.detail,
            _errors(m),
        ]

    header = ["system", "req/s", "p50 ms", "p99 ms", "of auth none (mean)", "vs LiteLLM", "CPU µs/req"]
    header += ["auth none's CPU/req ÷ its", "detail", "errors"]
    title = "### 7. Keys, budgets and rate limits (PostgreSQL + Redis), 32 connections, non-streaming"
    note = (
        '\n\n"vs LiteLLM" divides by LiteLLM with a virtual key when it ran, else by LiteLLM with its master'
        " key, deployment rpm/tpm and Redis, else by its master key alone (both do less per request than a"
        " virtual key, so those ratios flatter LiteLLM)."
    )
    return [title + note, "", *_table(header, _rows(results, "keys", len(header), row))]


@dataclass(frozen=True)
class Names:
    """System names the bar refers to."""

    switchyard: str
    portkey: str
    ledger_on: str
    ledger_on_again: str
    ledger_pg: str
    ledger_off: str
    workers_1: str
    workers_n: str
    keys: KeysNames | None = None


def bar(results: Results, names: Names) -> list[str]:
    """The lead's bar, each line with the measured value and yes / no / n/a."""
    rows: list[list[str]] = []

    def line(criterion: str, value: float | None, passed: bool | None, fmt: str) -> None:
        verdict = "n/a" if passed is None else ("yes" if passed else "NO")
        rows.append([criterion, "—" if value is None else fmt.format(value), verdict])

    def ratio(scenario: str, ours: str, theirs: str) -> float | None:
        a, b = results.measure(scenario, ours), results.measure(scenario, theirs)
        return _ratio(a.rps if a else None, b.rps if b else None)

    sy = names.switchyard
    r = ratio("throughput", sy, results.litellm)
    line("non-streaming throughput ≥ 15× LiteLLM", r, None if r is None else r >= 15, "{:.1f}×")
    r = ratio("throughput", sy, names.portkey)
    line("non-streaming throughput ≥ 3× Portkey", r, None if r is None else r >= 3, "{:.1f}×")
    ours, floor = results.measure("latency", sy), results.measure("latency", results.direct)
    added = None if ours is None or floor is None else ours.p50_ms - floor.p50_ms
    line("added latency p50 ≤ 0.6 ms", added, None if added is None else added <= 0.6, "{:.3f} ms")
    r = ratio("stream", sy, results.litellm)
    line("streaming chunks/s ≥ 30× LiteLLM", r, None if r is None else r >= 30, "{:.1f}×")
    on, off = results.measure("ledger", names.ledger_on), results.measure("ledger", names.ledger_off)
    again = results.measure("ledger", names.ledger_on_again)
    sqlite = [m.rps for m in (on, again) if m is not None]  # the runs before and after ledger off
    cost = None if not sqlite or off is None else 100 * (1 - sum(sqlite) / len(sqlite) / off.rps)
    criterion = "ledger on costs ≤ 10 % (SQLite, mean of the runs around ledger off)"
    line(criterion, cost, None if cost is None else cost <= 10, "{:.1f} %")
    pg = results.measure("ledger", names.ledger_pg)
    cost = None if pg is None or off is None else 100 * (1 - pg.rps / off.rps)
    line("ledger on costs ≤ 10 % (PostgreSQL vs ledger off)", cost, None if cost is None else cost <= 10, "{:.1f} %")
    full = next((row for row in results.rss if row.system == sy and row.requests >= 100_000), None)
    growth = None if full is None else full.after_mb - full.before_mb
    line("RSS growth ≤ 20 MB over 100k requests", growth, None if growth is None else growth <= 20, "{:.1f} MB")
    r = ratio("workers", names.workers_n, names.workers_1)
    line(f"{names.workers_n} rises over 1 worker", r, None if r is None else r > 1, "{:.2f}×")
    if names.keys is not None and results.cells.get("keys"):
        rows += _keys_bar(results, names.keys)
    return ["### Bar (for the lead)", "", *_table(["criterion", "measured", "met"], rows)]


def _keys_bar(results: Results, k: KeysNames) -> list[list[str]]:
    """Issue 11's two lines: keys keep ≥ 90 % of auth none, and ≥ 25× LiteLLM configured the same way."""
    keyed = results.measure("keys", k.keys)
    runs = [m.rps for m in (results.measure("keys", k.none), results.measure("keys", k.none_again)) if m]
    share = None if keyed is None or not runs else 100 * keyed.rps * len(runs) / sum(runs)
    rows = [
        [
            "keys mode keeps ≥ 90 % of auth none (mean of the runs around it)",
            _fmt(share, 1, " %"),
            _verdict(None if share is None else share >= 90),
        ]
    ]
    for label, system in (
        ("a virtual key, PostgreSQL, Redis", k.litellm_keys),
        ("master key, deployment rpm/tpm, Redis, no database: a stand-in that flatters LiteLLM", k.litellm_limits),
        ("master key only, no database: a stand-in that flatters LiteLLM", k.litellm_master),
    ):
        lite = results.measure("keys", system)
        r = _ratio(keyed.rps if keyed else None, lite.rps if lite else None)
        rows.append([f"keys mode ≥ 25× LiteLLM ({label})", _fmt(r, 1, "×"), _verdict(None if r is None else r >= 25)])
    return rows


def _verdict(passed: bool | None) -> str:
    return "n/a" if passed is None else ("yes" if passed else "NO")
