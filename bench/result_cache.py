"""What computing an answer once saves, each against its peer in the same run:

1. two nights of a 1,000-row greedy eval-style job on one result cache: the second night's CPU
   seconds and cost (cost.json) against the first's (target: <= 10%);
2. a dataset with 30% duplicate rows, duplicates computed once (worker/row_dedup.py) against every
   row computed (the peer: the same job with dedup turned off in process);
3. the cost of a lookup: a synthetic cache of `--lookup-rows` answers in segments of `--shard-rows`,
   looked up shard by shard as a rerun does: milliseconds per row and object-store GETs per shard.

Each night is a fresh `run_local` in this process, as a nightly job is: it loads the model only when
it has rows to compute (worker/lazy_engine.py).

    .venv/bin/python bench/result_cache.py                    # demo model (small), 1,000 rows
    .venv/bin/python bench/result_cache.py --rows 200 --lookup-rows 20000   # a quick look
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def run_job(work: Path, model: Path, name: str, prompts: list[str], cache: str | None, max_tokens: int,
            shard_rows: int) -> tuple[dict[str, Any], float]:  # fmt: skip
    """(cost.json, CPU seconds of this process) of one embedded job."""
    from jobs.planner import prepare_job
    from jobs.result_cache.options import CacheOptions, write_cache_options
    from jobs.spec import JobSpec, SamplingSpec
    from worker.local import run_local

    data = work / f"{name}.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(prompts))], "prompt": prompts}), data)
    spec = JobSpec(input=str(data), model=str(model), output=str(work / name), id_column="id",
                   sampling=SamplingSpec(max_tokens=max_tokens), shard_rows=shard_rows)  # fmt: skip
    prepared = prepare_job(spec)
    write_cache_options(prepared.store, CacheOptions(url=cache))
    cpu = time.process_time()
    report = run_local(prepared.store, prepared.manifest).report
    assert report is not None
    return report, time.process_time() - cpu


def nights(work: Path, model: Path, rows: int, max_tokens: int, shard_rows: int) -> None:
    prompts = [f"Question {i}: what does the function f{i % 997}(x) return for x = {i}?" for i in range(rows)]
    cache = str(work / "cache")
    first, cpu1 = run_job(work, model, "night1", prompts, cache, max_tokens, shard_rows)
    second, cpu2 = run_job(work, model, "night2", prompts, cache, max_tokens, shard_rows)
    print(f"\n1. two nights of a {rows:,}-row greedy job (max_tokens {max_tokens}) on one result cache")
    print(f"{'night':10} {'CPU s':>8} {'cost USD':>12} {'computed rows':>14} {'cache hits':>11}")
    for name, rep, cpu in (("first", first, cpu1), ("second", second, cpu2)):
        computed = rep["rows"] - rep["result_cache_hits"] - rep["deduplicated_rows"]
        print(f"{name:10} {cpu:8.2f} {rep['cost_usd']:12.8f} {computed:14,} {rep['result_cache_hits']:11,}")
    print(f"second / first: CPU {cpu2 / cpu1:.1%}, cost {second['cost_usd'] / first['cost_usd']:.1%} (target <= 10%); "
          f"saved ${second['result_cache_usd_saved']:.8f} of engine time")  # fmt: skip


def duplicates(work: Path, model: Path, rows: int, max_tokens: int, shard_rows: int) -> None:
    import worker.shard as shard_module
    from worker.row_dedup import Duplicates

    unique = int(rows * 0.7)
    prompts = [f"Explain item {i} of the inventory in one line." for i in range(unique)]
    prompts += [prompts[(i * 7) % unique] for i in range(rows - unique)]  # 30% repeats of earlier rows
    on, cpu_on = run_job(work, model, "dedup-on", prompts, None, max_tokens, shard_rows)
    real = shard_module.find_duplicates
    shard_module.find_duplicates = lambda requests: Duplicates(unique=list(requests))  # the peer: no dedup
    try:
        off, cpu_off = run_job(work, model, "dedup-off", prompts, None, max_tokens, shard_rows)
    finally:
        shard_module.find_duplicates = real
    print(f"\n2. {rows:,} rows, 30% duplicates (max_tokens {max_tokens})")
    print(f"{'dedup':6} {'CPU s':>8} {'cost USD':>12} {'deduplicated':>13} {'completion tok':>15}")
    for name, rep, cpu in (("on", on, cpu_on), ("off", off, cpu_off)):
        print(f"{name:6} {cpu:8.2f} {rep['cost_usd']:12.8f} {rep['deduplicated_rows']:13,} {rep['completion_tokens']:15,}")
    print(f"on / off: CPU {cpu_on / cpu_off:.1%}, cost {on['cost_usd'] / off['cost_usd']:.1%}")


class CountingStore:
    """Counts the GETs and LISTs that go to the store."""

    def __init__(self, store: Any) -> None:
        self.store, self.gets, self.lists = store, 0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def get(self, key: str) -> bytes:
        self.gets += 1
        return self.store.get(key)

    def list(self, prefix: str = "") -> list[str]:
        self.lists += 1
        return self.store.list(prefix)


def lookups(work: Path, total: int, shard_rows: int) -> None:
    from jobs.result_cache.segments import Entry
    from jobs.result_cache.store import ResultCache

    cache = ResultCache.open(str(work / "lookup-cache"))
    space = cache.space("b" * 32, {"model": "synthetic"})
    keys = [os.urandom(16) for _ in range(total)]
    t0 = time.perf_counter()
    for s in range(0, total, shard_rows):
        space.write([Entry(key=k, source_job="j", source_row=str(s + i), seconds=0.01,
                           answer={"completion": "an answer of some forty characters, about", "finish_reason": "stop",
                                   "prompt_tokens": 30, "cached_tokens": 0, "completion_tokens": 9})
                     for i, k in enumerate(keys[s : s + shard_rows])], "j", s // shard_rows, now=1.0)  # fmt: skip
    written = time.perf_counter() - t0
    space.merge_job("j")
    counting = CountingStore(cache.store)
    reader = ResultCache(counting).space("b" * 32)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    found = 0
    shards = 0
    for s in range(0, total, shard_rows):  # a rerun: shard by shard, in the order they were written
        found += len(reader.lookup(keys[s : s + shard_rows]))
        shards += 1
    took = time.perf_counter() - t0
    assert found == total
    print(f"\n3. lookups: {total:,} cached answers in {shards:,} segments of {shard_rows}, a rerun looks them up")
    print(f"{'what':28} {'value':>12}")
    print(f"{'write (one job)':28} {written:11.2f}s")
    print(f"{'lookup, all shards':28} {took:11.2f}s")
    print(f"{'per row':28} {took / total * 1e3:10.4f}ms (target <= 1 ms)")
    print(f"{'GETs per shard':28} {counting.gets / shards:12.2f}")
    print(f"{'LISTs in all':28} {counting.lists:12,}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint folder (default: a small demo model)")
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--shard-rows", type=int, default=128)
    ap.add_argument("--lookup-rows", type=int, default=200_000)
    args = ap.parse_args()
    os.environ.setdefault("FREIGHT_LOG_LEVEL", "warning")
    with tempfile.TemporaryDirectory(prefix="result-cache-bench-") as tmp:
        work = Path(tmp)
        os.environ["FREIGHT_CACHE_DIR"] = str(work / "freight-cache")  # fresh profiles and fingerprints
        if args.model:
            model = Path(args.model)
        else:
            from worker.demo_model import make_demo_model

            model = make_demo_model(work / "model", arch="llama", size="small")
        nights(work, model, args.rows, args.max_tokens, args.shard_rows)
        duplicates(work, model, args.rows, args.max_tokens, args.shard_rows)
        lookups(work, args.lookup_rows, 256)


if __name__ == "__main__":
    main()
