"""BatchProcessRunner: the API process's side of the batch process (jobs/api/batch_process.py).

It starts the batch process as a child (the command the `freight serve` command gives it: the
composition root chooses what runs models), nudges it through its stdin when a batch is created or
cancelled, starts it again if it dies (1 s, doubling to 30 s between tries), and stops it with the
server: SIGTERM (the running job saves its finished rows), SIGKILL after `stop_timeout_s`.

The child cannot outlive the server: it asks the kernel for SIGKILL when its parent thread dies
(PR_SET_PDEATHSIG, freight_cli/batch_process.py), and its spawning thread here lives as long as the
server; it also stops when its stdin closes. It runs in a session of its own, so a Ctrl-C at the
terminal reaches the server alone, which stops it in order.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Sequence

from jobs.log import get_logger

log = get_logger(__name__)

PARENT_ENV = "FREIGHT_SERVE_PARENT"  # the server's pid, for the child's check that its parent is alive


class BatchProcessRunner:
    def __init__(self, command: Sequence[str], env: dict[str, str] | None = None, stop_timeout_s: float = 60.0) -> None:
        self.command, self.env, self.stop_timeout_s = list(command), env, stop_timeout_s
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._keep_alive, name="freight-batch-supervisor", daemon=True)
        self._thread.start()

    def _keep_alive(self) -> None:
        backoff = 1.0
        while not self._stopping.is_set():
            env = {**(self.env if self.env is not None else os.environ), PARENT_ENV: str(os.getpid())}
            with self._lock:
                if self._stopping.is_set():
                    return
                self._child = subprocess.Popen(self.command, stdin=subprocess.PIPE, env=env, start_new_session=True)
                assert self._child.stdin is not None
                os.set_blocking(self._child.stdin.fileno(), False)  # a nudge never blocks a request
            log.info("batch_process_started", pid=self._child.pid)
            code = self._child.wait()
            if self._stopping.is_set():
                return
            log.error("batch_process_exited", code=code, restart_in_s=backoff)
            if self._stopping.wait(backoff):
                return
            backoff = min(backoff * 2, 30.0)

    def nudge(self) -> None:
        with self._lock:
            child = self._child
            if child is None or child.stdin is None or child.poll() is not None:
                return
            with contextlib.suppress(OSError, ValueError):  # a dying child: it restarts and looks anyway
                child.stdin.write(b"\n")
                child.stdin.flush()

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
            child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.error("batch_process_killed", pid=child.pid, after_s=self.stop_timeout_s)
                child.kill()
                child.wait()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def pid(self) -> int | None:
        child = self._child
        return None if child is None else child.pid
