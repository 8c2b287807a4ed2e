"""Jobs for the distributed tests: a tiny model, an input, the embedded reference run, CLI calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from fleet_servers import WorkerProcess, free_port

from jobs import datasets
from jobs.client import queue_for_model
from jobs.live_state import LiveState
from jobs.storage import open_store

REPO = Path(__file__).resolve().parents[2]
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
# Compared row for row with the embedded run. cached_tokens is left out: prefix-cache hits depend on
# which shards a process ran before (a speed statistic, not a result).
RESULT_COLUMNS = ["id", "completion", "finish_reason", "prompt_tokens", "completion_tokens", "error"]


def make_input(path: Path, rows: int, max_tokens: tuple[int, ...] = (1, 2, 3, 4)) -> Path:
    """`rows` prompts, distinct from their first characters (so each shard is its own prefix group);
    per-row max_tokens cycles through `max_tokens`; every other row samples at temperature 0.8 (seeded)."""
    prompts = [f"{i:03d} {WORDS[i % 10]} {WORDS[(i * 7) % 10]} {WORDS[(i * 3) % 10]}" for i in range(rows)]
    table = pa.table({
        "id": [f"r{i:03d}" for i in range(rows)],
        "prompt": prompts,
        "max_tokens": pa.array([max_tokens[i % len(max_tokens)] for i in range(rows)], pa.int64()),
        "temperature": pa.array([0.8 if i % 2 else 0.0 for i in range(rows)], pa.float64()),
    })  # fmt: skip
    pq.write_table(table, path)
    return path


def freight(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("freight")
    return subprocess.run([str(exe), *args], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)  # fmt: skip


def submit(
    env: dict[str, str], inp: Path, model: Path, out: Path, shard_rows: int, max_tokens: int = 8
) -> dict:
    proc = freight(["submit", str(inp), "--model", str(model), "--output", str(out), "--shard-rows",
                    str(shard_rows), "--max-tokens", str(max_tokens), "--seed", "7", "--json"], env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-2])
    assert summary["job_id"] == lines[-1]
    return summary


def embedded_run(inp: Path, model: Path, out: Path, shard_rows: int, max_tokens: int = 8) -> list[dict]:
    proc = freight(["run", str(inp), "--model", str(model), "--output", str(out), "--shard-rows", str(shard_rows),
                    "--max-tokens", str(max_tokens), "--seed", "7"], {}, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return result_rows(out)


def result_rows(out: Path) -> list[dict]:
    table = datasets.read_results(open_store(str(out)))
    return table.select(RESULT_COLUMNS).to_pylist()


class Fleet:
    """Workers of one test; all stopped at teardown.

    defaults=False shortens the visibility timeout (4 s), heartbeats (0.5 s) and spot polls (0.2 s)
    for the older tests; defaults=True runs workers with freight's default settings (only Redis,
    the log format, a metrics port and an IMDS address that refuses connections are set) but for
    `overrides` (FREIGHT_* variables a test shortens, named in its docstring), which every worker
    and CLI call of the fleet gets."""

    def __init__(
        self, redis_url: str, tmp: Path, model: Path, *, defaults: bool = False,
        overrides: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.redis_url, self.tmp, self.queue = redis_url, tmp, queue_for_model(str(model))
        self.model, self.defaults, self.overrides = model, defaults, dict(overrides or {})
        self.workers: list[WorkerProcess] = []
        self.ports: dict[str, int] = {}
        self.live = LiveState(redis_url)

    def env(self, **extra: str) -> dict[str, str]:
        base = {"FREIGHT_REDIS_URL": self.redis_url, "FREIGHT_LOG_FORMAT": "json",
                "FREIGHT_IMDS_URL": f"http://127.0.0.1:{free_port()}"}  # fmt: skip
        if not self.defaults:
            base |= {"FREIGHT_VISIBILITY_TIMEOUT_S": "4", "FREIGHT_HEARTBEAT_S": "0.5",
                     "FREIGHT_SPOT_POLL_S": "0.2", "FREIGHT_MAX_SHARD_ATTEMPTS": "3"}  # fmt: skip
        return {**base, **self.overrides, **extra}

    def start(
        self,
        name: str,
        poison_shard: int | None = None,
        poison_kind: str = "kill",
        *,
        serve_all: bool = False,
        model: str | None = None,
        **extra: str,
    ) -> WorkerProcess:
        """serve_all: no --queues (every queue with work); model: `--model MODEL` (preloaded)."""
        self.ports[name] = free_port()
        env = self.env(FREIGHT_METRICS_PORT=str(self.ports[name]), **extra)
        queue = None if serve_all or model else self.queue
        w = WorkerProcess(name, env, queue, self.tmp, poison_shard=poison_shard, poison_kind=poison_kind,
                          model=model)  # fmt: skip
        self.workers.append(w)
        return w

    def metric(self, name: str, line_prefix: str) -> float:
        """Sum of the worker's Prometheus samples starting with `line_prefix` (0 before it serves)."""
        url = f"http://127.0.0.1:{self.ports[name]}/metrics"
        try:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
        except urllib.error.URLError:
            return 0.0
        return sum(float(line.split()[-1]) for line in body.splitlines() if line.startswith(line_prefix))

    def busy(self, worker_id: str) -> bool:
        raw = self.live.client.hget("freight:workers", worker_id)
        return bool(raw) and json.loads(raw)["busy"]

    def wait_done(self, out: Path | str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return freight(
            ["wait", str(out), "--poll", "0.3", "--timeout", str(timeout)], self.env(), timeout=timeout + 30
        )

    def stop(self) -> None:
        """Teardown: SIGKILL every worker still running. The test is over; a warm shutdown (about 2 s
        a worker, more with a shard running) proves nothing here, and the tests of shutdowns (SIGTERM,
        spot notices) make theirs themselves and assert on them."""
        for w in self.workers:
            if w.alive():
                w.kill_all()
            w.stop()
        self.live.close()
