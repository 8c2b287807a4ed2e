"""Job overhead: how much of a job's time is spent outside the engine (planning, reads, request
building, Parquet writes, commits, finalize), on a 20,000-row job with max_tokens 1 and the demo model.

Peer, measured in the same run: the bare engine generating the same prompts in one call. Prints a
small table; the target is overhead < 10% of the job's time.

    .venv/bin/python bench/job_overhead.py [--rows 20000] [--shard-rows 256] [--model DIR] [--no-peer] [--threads 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


class EngineTimer:
    """Delegates to an Engine and adds up the wall time spent inside its stream() iterations."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.inside = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        it = self._engine.stream(*args, **kwargs)
        while True:
            t0 = time.perf_counter()
            try:
                out = next(it)
            except StopIteration:
                self.inside += time.perf_counter() - t0
                return
            self.inside += time.perf_counter() - t0
            yield out


def make_dataset(path: Path, rows: int) -> Path:
    # short, distinct code prompts (~10-20 tokens); every 8th shares a long prefix with its group
    header = "# utility module: small helpers for parsing and formatting records\n"
    prompts = [
        (header if i % 8 == 0 else "") + f"def helper_{i}(value):\n    return value * {i % 97}"
        for i in range(rows)
    ]
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(rows)], "prompt": prompts}), path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description="time outside the engine as a fraction of a job's time")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--shard-rows", type=int, default=256)
    parser.add_argument("--model", type=Path, default=None, help="default: a fresh tiny demo model")
    parser.add_argument("--no-peer", action="store_true", help="skip the bare-engine run")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: on a shared 2-core box two threads spin-wait)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="freight-bench-") as tmp:  # model, data and OUT go away
        measure(args, Path(tmp))


def measure(args: argparse.Namespace, work: Path) -> None:

    from jobs.log import configure_logging
    from jobs.planner import prepare_job
    from jobs.spec import JobSpec, SamplingSpec
    from worker.demo_model import make_demo_model
    from worker.engine import Engine, EngineConfig, SamplingParams
    from worker.local import run_local

    configure_logging("json", "warning")
    model = args.model or make_demo_model(work / "model", arch="llama", size="tiny")
    data = make_dataset(work / "in.parquet", args.rows)
    engine = Engine.from_pretrained(model, EngineConfig(device="cpu", num_threads=args.threads))
    timer = EngineTimer(engine)

    t0 = time.perf_counter()
    spec = JobSpec(
        input=str(data),
        model=str(model),
        output=str(work / "out"),
        id_column="id",
        sampling=SamplingSpec(max_tokens=1),
        shard_rows=args.shard_rows,
    )
    prepared = prepare_job(spec)
    t_plan = time.perf_counter() - t0
    t1 = time.perf_counter()
    result = run_local(prepared.store, prepared.manifest, engine=timer)
    t_run = time.perf_counter() - t1
    total = t_plan + t_run
    inside = timer.inside
    outside = total - inside
    report = result.report or {}

    peer = None
    if not args.no_peer:
        # a fresh engine: the job's engine holds these prompts in its prefix cache
        del engine, timer
        fresh = Engine.from_pretrained(model, EngineConfig(device="cpu", num_threads=args.threads))
        prompts = pq.read_table(data, columns=["prompt"]).column("prompt").to_pylist()
        t2 = time.perf_counter()
        outs = fresh.generate(prompts, SamplingParams(max_tokens=1))
        peer = time.perf_counter() - t2
        peer_hit = sum(o.cached_tokens for o in outs) / max(1, sum(o.prompt_tokens for o in outs))

    print(
        f"\njob: {args.rows:,} rows, {len(prepared.manifest.shards)} shards of ~{args.shard_rows}, max_tokens 1, "
        f"{report.get('prompt_tokens', 0):,} prompt tokens (prefix cache hit {report.get('cache_hit_rate', 0):.1%}), "
        f"model {args.model or 'tiny random demo llama'}"
    )
    print(f"{'measure':<44}{'seconds':>10}{'share':>9}")
    for label, secs in (
        ("plan + manifest", t_plan),
        ("run_local (shards + finalize)", t_run),
        ("  inside engine.stream", inside),
        ("  outside the engine (total - inside)", outside),
        ("job total", total),
    ):
        print(f"{label:<44}{secs:>10.2f}{secs / total:>9.1%}")
    if peer is not None:
        print(
            f"{'peer: bare engine.generate, same prompts':<44}{peer:>10.2f}   (prefix cache hit {peer_hit:.1%})"
        )
        print(f"job total / bare engine: {total / peer:.3f}x")
    verdict = "meets" if outside / total < 0.10 else "MISSES"
    print(f"overhead outside the engine: {outside / total:.1%} of the job ({verdict} the < 10% target)")


if __name__ == "__main__":
    main()
