"""Fleet scaling on the CPU: the same job on 1 and on 2 `freight worker` processes, and the queue
overhead per shard (enqueue -> the task starts, with the workers idle and their model loaded).

    .venv/bin/python bench/fleet_scaling.py                 # 64 rows, 16 shards, 16 tokens a row
    .venv/bin/python bench/fleet_scaling.py --rows 128 --probes 20

Starts its own redis-server on a free port (never touches a shared one), a tiny demo model, and real
worker subprocesses (OMP_NUM_THREADS=1 each, so 2 workers use 2 cores where 1 uses 1). Prints a table:
rows/s with 1 and 2 workers and their ratio, and the queue overhead per shard (median, p90, max; the
target is under 100 ms). Timings come from the workers' own `shard_started` log lines (queue_wait_s:
the publish time carried in the message header to the start of the task body).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import redis

REPO = Path(__file__).resolve().parents[1]
FREIGHT = str(Path(sys.executable).with_name("freight"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate, timeout: float, what: str):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


class Bench:
    def __init__(self, root: Path, rows: int, shard_rows: int, max_tokens: int) -> None:
        self.root = root
        self.port = free_port()
        self.redis_url = f"redis://127.0.0.1:{self.port}/0"
        self.redis = subprocess.Popen(["redis-server", "--port", str(self.port), "--save", "", "--appendonly", "no"],
                                      stdout=subprocess.DEVNULL, cwd=root)  # fmt: skip
        self.client = redis.Redis(port=self.port, decode_responses=True)
        wait_for(self._ping, 20, "redis-server")
        from worker.demo_model import make_demo_model

        self.model = Path(make_demo_model(root / "model")).resolve()
        self.rows, self.shard_rows, self.max_tokens = rows, shard_rows, max_tokens
        self.input = root / "input.parquet"
        words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
        prompts = [f"{i:04d} {words[i % 8]} {words[(i * 5) % 8]} {words[(i * 3) % 8]}" for i in range(rows)]
        pq.write_table(pa.table({"prompt": prompts}), self.input)
        self.env = {**os.environ, "FREIGHT_REDIS_URL": self.redis_url, "FREIGHT_LOG_FORMAT": "json",
                    "FREIGHT_IMDS_URL": f"http://127.0.0.1:{free_port()}", "FREIGHT_METRICS_PORT": "0",
                    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # fmt: skip
        from jobs.client import queue_for_model

        self.queue = queue_for_model(str(self.model))
        self.workers: list[tuple[subprocess.Popen, Path]] = []
        self.started = 0
        self.jobs = 0

    def _ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.ConnectionError:
            return False

    def start_workers(self, n: int) -> None:
        for _ in range(n):
            self.started += 1
            log = self.root / f"worker-{self.started}.log"
            proc = subprocess.Popen([FREIGHT, "worker", "--queues", self.queue, "--hostname",
                                     f"w{self.started}@bench", "--loglevel", "WARNING"],
                                    env=self.env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=REPO)  # noqa: SIM115  # fmt: skip
            self.workers.append((proc, log))
        wait_for(lambda: len(self.client.hgetall("freight:workers")) >= n, 120, f"{n} worker heartbeats")

    def stop_workers(self) -> None:
        for proc, _ in self.workers:
            proc.terminate()
        for proc, _ in self.workers:
            proc.wait(60)
        self.workers = []

    def run_job(self, shard_rows: int, rows_note: str) -> tuple[float, Path]:
        """Submit a job (new OUT), wait for _SUCCESS; seconds from submit to _SUCCESS."""
        self.jobs += 1
        out = self.root / f"out-{self.jobs}-{rows_note}"
        start = time.perf_counter()
        proc = subprocess.run([FREIGHT, "submit", str(self.input), "--model", str(self.model), "--output", str(out),
                               "--shard-rows", str(shard_rows), "--max-tokens", str(self.max_tokens)],
                              env=self.env, capture_output=True, text=True, cwd=REPO)  # fmt: skip
        if proc.returncode:
            raise SystemExit(proc.stderr)
        wait_for(lambda: (out / "_SUCCESS").exists(), 1800, f"job {out.name}")
        return time.perf_counter() - start, out

    def queue_waits(self, since: float) -> list[tuple[float, float]]:
        """(enqueue -> task entry, task entry -> engine start) of shards started after `since`."""
        waits = []
        for _, log in self.workers:
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("{") and '"shard_started"' in line:
                    event = json.loads(line)
                    if event.get("queue_wait_s") is not None and _ts(event["timestamp"]) >= since:
                        waits.append((float(event["queue_wait_s"]), float(event.get("preamble_s") or 0.0)))
        return waits

    def close(self) -> None:
        self.stop_workers()
        self.redis.terminate()
        self.redis.wait(20)


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--shard-rows", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--probes", type=int, default=10, help="single-shard jobs for the queue overhead")
    args = ap.parse_args()
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server not found: apt-get install redis-server")
    root = Path(tempfile.mkdtemp(prefix="freight-fleet-bench-"))
    bench = Bench(root, args.rows, args.shard_rows, args.max_tokens)
    results: dict[int, float] = {}
    waits: list[tuple[float, float]] = []
    load_before = os.getloadavg()[0]
    try:
        for n in (1, 2):
            bench.start_workers(n)
            bench.run_job(
                shard_rows=max(1, args.rows // (2 * n)), rows_note=f"warm{n}"
            )  # load the model in each
            seconds, _ = bench.run_job(args.shard_rows, rows_note=f"w{n}")
            results[n] = args.rows / seconds
            if n == 1:
                waits = probe_overhead(bench, args.probes)
            bench.stop_workers()
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)
    shards = -(-args.rows // args.shard_rows)
    print(f"\nfleet scaling: {args.rows} rows, ~{shards} shards, {args.max_tokens} tokens a row, tiny demo model, "
          f"CPU ({os.cpu_count()} cores; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)")  # fmt: skip
    print(f"{'workers':>8} {'rows/s':>9} {'vs 1 worker':>12}")
    for n, rate in results.items():
        print(f"{n:>8} {rate:>9.2f} {rate / results[1]:>11.2f}x")
    if waits:
        queue_ms = sorted(q * 1000 for q, _ in waits)
        total_ms = sorted((q + p) * 1000 for q, p in waits)
        print(f"\nper-shard overhead with an idle, warm worker ({len(waits)} single-shard jobs):")
        print(f"{'':>28} {'median':>8} {'p90':>8} {'max':>8}")
        for label, values in (("enqueue -> task entry", queue_ms), ("enqueue -> engine start", total_ms)):
            p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
            print(f"{label:>28} {statistics.median(values):>6.1f}ms {p90:>6.1f}ms {values[-1]:>6.1f}ms")
        verdict = "met" if statistics.median(queue_ms) < 100 else "NOT met"
        print(f"target: enqueue -> task entry under 100 ms: {verdict}")


def probe_overhead(bench: Bench, probes: int) -> list[tuple[float, float]]:
    """Single-shard probe jobs over a 1-row input, so each probe is mostly queue and task overhead."""
    full = bench.input
    bench.input = bench.root / "probe.parquet"
    try:
        waits: list[tuple[float, float]] = []
        for i in range(probes):
            pq.write_table(pa.table({"prompt": [f"probe {i} {time.time()}"]}), bench.input)
            since = time.time()
            bench.run_job(shard_rows=1, rows_note=f"probe{i}")
            waits.extend(bench.queue_waits(since))
        return waits
    finally:
        bench.input = full


if __name__ == "__main__":
    main()
