"""Jobs for the distributed tests: a tiny model, an input, the embedded reference run, CLI calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs import datasets
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
