"""Stopping a process a test started: SIGTERM first, so it shuts down as it would in production, and
SIGKILL when it does not end in time, so no test leaves a process behind."""

from __future__ import annotations

import signal
import subprocess


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """SIGTERM `proc` and wait up to `timeout` seconds for it to end; then SIGKILL it."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
