"""Worker shutdown: SIGTERM -> exit of an idle `freight worker` (what every fleet scale-in pays), with
where the time goes. A private redis-server on a free port; the worker runs under a small wrapper that
timestamps billiard's own debug lines (pool close, child exit, pool finalize) and the interpreter's
atexit, so each phase is measured, not guessed.

    .venv/bin/python bench/worker_shutdown.py [--runs 3] [--idle 3]

Phases printed per run: SIGTERM -> pool close (the event loop sees the warm-shutdown flag only when
its poll returns), pool close -> child gone (billiard's pool child sleeps 1 s after its exit message),
-> pool finalized (Celery's prefork on_stop joins a timer thread that sleeps 0.5 s), -> atexit,
-> process exit (interpreter teardown).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WRAPPER = """
import atexit, os, sys, threading, time
import billiard.pool, billiard.util

def stamp(msg, *args):
    text = msg % args if args else msg
    sys.stderr.write(f"@@ {time.time():.4f} {os.getpid()} {text}\\n")
    sys.stderr.flush()

billiard.util.debug = billiard.pool.debug = stamp
atexit.register(lambda: stamp("atexit"))
from freight_cli import main
sys.argv = ["freight", *sys.argv[1:]]
main()
"""
PHASES = [
    ("closing pool", "SIGTERM -> pool close"),
    ("pool join complete", "pool close -> child gone"),
    ("finalizing pool", "child gone -> pool finalized"),
    ("atexit", "-> atexit"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _marks(log: Path) -> dict[str, float]:
    marks: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("@@ "):
            _, at, _pid, text = line.split(" ", 3)
            for key, _ in PHASES:
                if text.startswith(key):
                    marks.setdefault(key, float(at))
    return marks


def run_once(index: int, port: int, work: Path, idle_s: float) -> float:
    import redis

    r = redis.Redis(port=port, decode_responses=True)
    r.flushall()
    env = {**os.environ, "FREIGHT_REDIS_URL": f"redis://127.0.0.1:{port}/0", "FREIGHT_METRICS_PORT": "0",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    log = work / f"worker{index}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", WRAPPER, "worker", "--queues", "bench-shutdown",
                                 "--hostname", f"bench{index}@shutdown", "--loglevel", "INFO"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)  # fmt: skip
        while not r.hlen("freight:nodes"):  # the node keeper's first beat: worker_ready ran
            if proc.poll() is not None:
                raise SystemExit(f"the worker exited at start: see {log}")
            time.sleep(0.05)
        time.sleep(idle_s)
        sent, t0 = time.time(), time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        total = time.monotonic() - t0
    marks, prev = _marks(log), sent
    print(f"run {index}: SIGTERM -> exit {total:.3f} s")
    for key, what in PHASES:
        if key in marks:
            print(f"    {what:32s} {marks[key] - prev:6.3f} s")
            prev = marks[key]
    print(f"    {'-> process exit':32s} {sent + total - prev:6.3f} s")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--idle", type=float, default=3.0, help="seconds idle between ready and SIGTERM")
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not on PATH: install Redis to run this benchmark")
    port = _free_port()
    work = Path(tempfile.mkdtemp(prefix="freight-shutdown-"))
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                               "--dir", str(work)], stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(0.5)
        totals = sorted(run_once(i, port, work, args.idle) for i in range(args.runs))
    finally:
        server.terminate()
        server.wait(10)
    print(f"SIGTERM -> exit, idle worker: median {totals[len(totals) // 2]:.3f} s "
          f"(min {totals[0]:.3f}, max {totals[-1]:.3f}, {len(totals)} runs); logs in {work}")  # fmt: skip


if __name__ == "__main__":
    main()
