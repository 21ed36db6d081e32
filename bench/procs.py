"""Processes for the benchmark: start pinned to CPUs, wait for a port, measure RSS, stop.

Every server the benchmark starts (mocks, Switchyard, LiteLLM, Portkey) goes through `Server`, so
each one is pinned with `taskset`, logs to a file in the run directory, is found again by its
process id (never by name), and is stopped with its whole process group. RSS is read from
/proc/PID/status (VmRSS) and summed over the process tree, so a multi-worker server counts all
of its workers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


class StartError(RuntimeError):
    """A server exited or never opened its port; the message carries its log's tail."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Server:
    """One server process, pinned to `cpus` (a taskset list such as "0" or "0-1")."""

    name: str
    argv: list[str]
    port: int
    cpus: str
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 90.0) -> Server:
        env = {**os.environ, **self.env}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                ["taskset", "-c", self.cpus, *self.argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.cwd,
                start_new_session=True,  # its own process group: stop() reaches every worker
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StartError(f"{self.name} exited with {self.proc.returncode}:\n{log_tail(self.log)}")
            if port_open(self.port):
                return self
            time.sleep(0.1)
        self.stop()
        raise StartError(f"{self.name} did not open port {self.port} in {timeout_s:.0f} s:\n{log_tail(self.log)}")

    @property
    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def rss_mb(self) -> float:
        """Resident memory of the process and all its descendants, in MiB."""
        if self.proc is None:
            return 0.0
        return sum(_rss_kb(pid) for pid in _tree(self.proc.pid)) / 1024

    def cpu_s(self) -> float:
        """CPU seconds (user + system) used so far by the process and all its descendants."""
        if self.proc is None:
            return 0.0
        return sum(_cpu_ticks(pid) for pid in _tree(self.proc.pid)) / _TICKS

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass


def _children(pid: int) -> list[int]:
    found: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tasks = list(task_dir.iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _tree(root: int) -> list[int]:
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += _children(pid)
    return pids


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_ticks(pid: int) -> int:
    """utime + stime of `pid` (all its threads), in clock ticks; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5), counted after the name
