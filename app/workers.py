"""The supervisor of `serve --workers N`: uvicorn's, with what the service adds to it.

uvicorn's supervisor pings each worker every half second and kills one that does not answer
within `timeout_worker_healthcheck` (5 s) as hung. A worker answers from a thread it starts only
once it has been spawned and has imported the application: on a busy machine (the replicas of a
deployment starting together, a CI runner) that took more than 5 s, and the supervisor killed the
worker while it was still starting, then its replacement likewise: workers restarted over and over,
each restart a `worker_restarted` line, until the load fell. So a worker that has not yet answered
once is given `START_GRACE_S` to do so, as long as its process is alive; it is pinged once and its
answer looked for at each round without waiting. Once it has answered, or when its grace is over, it
is checked as uvicorn checks it: a hung worker is still killed and replaced, and one that exits while
starting still stops the service (uvicorn's "Child process failed to start"). uvicorn's rolling
restart on SIGHUP is its own: each new worker must be ready within its 5 s, or the old ones stay.
"""

from __future__ import annotations

import pickle
import socket
import time

import uvicorn
from uvicorn.supervisors import Multiprocess
from uvicorn.supervisors.multiprocess import Process

from app.logging import LineWriter, get_logger

START_GRACE_S = 60.0  # a worker's spawn, imports and start-up before it must answer a health check


class Workers(Multiprocess):
    """uvicorn's supervisor of several workers, giving a starting worker time to answer (module
    doc), saying in the service's log when it replaced one that died (uvicorn says it at `info`,
    below the `warning` level it runs at: a worker killed and restarted left no trace but a second
    `started` line), and letting go of the port when it stops them (`terminate_all`)."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket], writer: LineWriter) -> None:
        super().__init__(config, sockets=sockets)
        self.writer = writer  # the parent's log (`_announce`), flushed by each line here
        self._starting: dict[Process, float] = {}  # workers yet to answer once: when first seen
        self._pinged: set[Process] = set()  # of those, the ones with a ping not answered yet
        self._checked: set[Process] = set()  # workers past their start: uvicorn's check

    def terminate_all(self) -> None:
        """Close the parent's copy of the listening socket, then stop the workers: it kept the port
        open through their drain, so new connections waited in the backlog and were never answered
        instead of being refused (with one worker the listener closes at once)."""
        for sock in self.sockets:
            sock.close()
        super().terminate_all()

    def keep_subprocess_alive(self) -> None:
        """uvicorn's round of health checks, over the workers that are not starting (module doc)."""
        every = list(self.processes)
        checked = [index for index, process in enumerate(every) if not self._still_starting(process)]
        self.processes = [every[index] for index in checked]
        try:
            super().keep_subprocess_alive()
        finally:
            after, self.processes = self.processes, list(every)
            for index, process in zip(checked, after, strict=True):
                self.processes[index] = process
        live = set(self.processes)  # ones SIGTTOU or SIGHUP removed meanwhile are forgotten
        self._checked &= live
        self._pinged &= live
        self._starting = {process: since for process, since in self._starting.items() if process in live}
        for old, new in zip(every, self.processes, strict=True):
            if old is not new:
                get_logger("switchyard").warning(
                    "worker_restarted", pid=old.pid, exit_code=old.exitcode, new_pid=new.pid
                )
                self.writer.flush()

    def _still_starting(self, process: Process) -> bool:
        """Whether the worker is alive, within its grace and has not answered yet; once it is not,
        it is checked as uvicorn checks it from then on. Any worker is new once: those of the
        start, a replacement, one added by SIGTTIN."""
        if process in self._checked:
            return False
        started = self._starting.setdefault(process, time.monotonic())
        if process.process.is_alive() and time.monotonic() - started < START_GRACE_S and not self._answered(process):
            return True
        del self._starting[process]
        self._pinged.discard(process)
        self._checked.add(process)
        return False

    def _answered(self, process: Process) -> bool:
        """Whether the worker has answered its ping: sent once, its answer looked for without waiting."""
        try:
            if process not in self._pinged:
                process.parent_conn.send(b"ping")
                self._pinged.add(process)
            if not process.parent_conn.poll(0):
                return False
            process.parent_conn.recv()
        except (OSError, EOFError, pickle.UnpicklingError):  # as uvicorn's own check
            return False
        return True
