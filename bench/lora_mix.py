"""Many LoRA adapters in one job against the model alone and against one job per adapter.

    .venv/bin/python bench/lora_mix.py                      # 512 rows, 8 adapters of rank 16, demo "small"
    .venv/bin/python bench/lora_mix.py --rows 64 --size tiny   # a quick look

Workload: --rows code prompts (about 20-60 tokens, distinct), --max-tokens greedy tokens each, and
--adapters PEFT LoRA adapters of rank --rank on every projection (made by peft, bench/tiny_adapters.py),
rows assigned to them in turn. Three ways, each job a `freight run` process of its own (what a user
runs: imports, model load, plan, shards, finalize), CPU seconds of each process (user + system, one
torch thread; the work done, whatever else runs on the machine):

- mixed: one job of every row, each with its `adapter` column, the adapters given by --lora;
- model alone: the same rows in one job without adapters (the throughput an adapter job aims at);
- separate: one job per adapter over its own rows (what a team runs without per-row adapters).

And the engine alone, in this process: `Engine.generate` over every row with the adapters mixed
against the model alone (CPU seconds of generate only: no load, no job around it).

Targets: mixed >= 0.8x the model alone's tokens per CPU second; >= 3x faster than separate jobs. The
script checks that every row's completion in the mixed job equals its separate job's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_adapters import make_adapter  # noqa: E402

WORDS = ["value", "items", "count", "record", "parser", "buffer", "total", "index", "name", "cache", "queue", "node"]


def prompts(rows: int) -> list[str]:
    rng = random.Random(0)
    out = []
    for i in range(rows):
        a, b, c = rng.sample(WORDS, 3)
        body = "\n".join(f"    {rng.choice(WORDS)}_{j} = {a}[{j}] + {rng.randrange(100)}" for j in range(rng.randint(1, 4)))
        out.append(f"def {a}_{b}_{i}({c}):\n{body}\n    return")
    return out


def run_job(env: dict[str, str], model: Path, data: Path, out: Path, adapters: dict[str, Path],
            max_tokens: int) -> tuple[float, dict]:  # fmt: skip
    """(CPU seconds, {id: row}) of one `freight run` process over `data`."""
    flags = [arg for name, path in adapters.items() for arg in ("--lora", f"{name}={path}")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "from freight_cli import main; main()", "run", str(data), "--model", str(model),
                    "--output", str(out), "--id-column", "id", "--shard-rows", "100000", "--max-tokens", str(max_tokens),
                    *flags], check=True, env=env, capture_output=True)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    table = ds.dataset(out / "shards").to_table(columns=["id", "adapter", "completion", "completion_tokens", "error"])
    rows = {r["id"]: r for r in table.to_pylist()}
    assert all(r["error"] is None for r in rows.values()), [r["error"] for r in rows.values() if r["error"]][:3]
    return cpu, rows


def engine_seconds(model: Path, texts: list[str], adapters: dict[str, Path], assign: list[str | None],
                   max_tokens: int) -> float:  # fmt: skip
    """CPU seconds of one Engine.generate over `texts` (a fresh engine, one thread)."""
    from worker.engine import Engine, EngineConfig, SamplingParams

    engine = Engine.from_pretrained(model, EngineConfig(device="cpu", num_threads=1))
    engine.set_loras(adapters)
    c0 = time.process_time()
    engine.generate(texts, SamplingParams(max_tokens=max_tokens), adapters=assign if adapters else None)
    return time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--size", default="small", choices=["tiny", "small", "medium"])
    args = ap.parse_args()
    import transformers

    from jobs.log import configure_logging
    from worker.demo_model import make_demo_model

    configure_logging("json", "warning")
    with tempfile.TemporaryDirectory(prefix="freight-lora-mix-") as tmp:
        work = Path(tmp)
        # every job alike: one torch thread, no result cache (each answer computed), the CPU kernels
        # built once in the usual cache before any job is timed, speed profiles kept apart
        kernels = os.environ.get("FREIGHT_KERNEL_CACHE") or str(
            Path(os.environ.get("FREIGHT_CACHE_DIR") or Path.home() / ".cache" / "freight") / "kernels")
        env = {k: v for k, v in os.environ.items() if k != "FREIGHT_RESULT_CACHE"}
        env.update({"OMP_NUM_THREADS": "1", "FREIGHT_LOG_LEVEL": "warning", "FREIGHT_KERNEL_CACHE": kernels,
                    "FREIGHT_CACHE_DIR": str(work / "cache"), "FREIGHT_PROFILES_PATH": str(work / "profiles.json")})
        model = make_demo_model(work / "model", "llama", size=args.size)
        base = transformers.AutoModelForCausalLM.from_pretrained(model).float().eval()
        adapters = {f"ft{k}": make_adapter(base, work / f"ft{k}", rank=args.rank, alpha=2 * args.rank, seed=k + 1,
                                           scale=0.05) for k in range(args.adapters)}  # fmt: skip
        names = list(adapters)
        texts = prompts(args.rows)
        assign = [names[i % len(names)] for i in range(args.rows)]
        ids = [f"r{i}" for i in range(args.rows)]
        pq.write_table(pa.table({"id": ids, "prompt": texts, "adapter": assign}), work / "all.parquet")
        pq.write_table(pa.table({"id": ids[:4], "prompt": texts[:4], "adapter": assign[:4]}), work / "warm.parquet")
        run_job(env, model, work / "warm.parquet", work / "out-warm", adapters, 2)

        mixed_cpu, mixed = run_job(env, model, work / "all.parquet", work / "out-mixed", adapters, args.max_tokens)
        base_cpu, alone = run_job(env, model, work / "all.parquet", work / "out-base", {}, args.max_tokens)
        separate_cpu, separate = 0.0, {}
        for name in names:
            mine = [i for i, a in enumerate(assign) if a == name]
            data = work / f"{name}.parquet"
            pq.write_table(pa.table({"id": [ids[i] for i in mine], "prompt": [texts[i] for i in mine],
                                     "adapter": [name] * len(mine)}), data)  # fmt: skip
            cpu, rows = run_job(env, model, data, work / f"out-{name}", {name: adapters[name]}, args.max_tokens)
            separate_cpu += cpu
            separate.update(rows)
        torch.set_num_threads(1)
        engine_seconds(model, texts[:8], adapters, assign[:8], 2)  # this process's first engine: lazy setup
        engine_mixed = engine_seconds(model, texts, adapters, assign, args.max_tokens)
        engine_base = engine_seconds(model, texts, {}, [None] * args.rows, args.max_tokens)

    equal = sum(mixed[i]["completion"] == separate[i]["completion"] for i in ids)
    changed = sum(mixed[i]["completion"] != alone[i]["completion"] for i in ids)
    tokens = {k: sum(r["completion_tokens"] for r in rows.values()) for k, rows in
              (("mixed", mixed), ("base", alone), ("separate", separate))}  # fmt: skip
    speed = {k: tokens[k] / cpu for k, cpu in (("mixed", mixed_cpu), ("base", base_cpu), ("separate", separate_cpu))}
    print(f"{args.rows} rows ({sum(len(t) for t in texts):,} prompt characters), {args.max_tokens} greedy tokens "
          f"each, {args.adapters} adapters of rank {args.rank} on every projection, demo model {args.size!r}, "
          "1 torch thread; CPU seconds of each `freight run` process")  # fmt: skip
    print()
    print("| run | jobs | generated tokens | CPU s | tokens / CPU s | against mixed |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| mixed: {args.adapters} adapters in one job | 1 | {tokens['mixed']:,} | {mixed_cpu:.2f} | "
          f"{speed['mixed']:.1f} | |")  # fmt: skip
    print(f"| the model alone, same rows | 1 | {tokens['base']:,} | {base_cpu:.2f} | {speed['base']:.1f} | "
          f"mixed **{speed['mixed'] / speed['base']:.2f}x** its throughput (target >= 0.8x) |")  # fmt: skip
    print(f"| one job per adapter | {args.adapters} | {tokens['separate']:,} | {separate_cpu:.2f} | "
          f"{speed['separate']:.1f} | mixed **{separate_cpu / mixed_cpu:.2f}x** faster (target >= 3x) |")  # fmt: skip
    print(f"| the engine alone: generate, mixed against the model | | | {engine_mixed:.2f} / {engine_base:.2f} | | "
          f"mixed **{engine_base / engine_mixed:.2f}x** the model's throughput |")  # fmt: skip
    print()
    print(json.dumps({"rows_equal_to_separate": f"{equal}/{args.rows}", "rows_changed_by_adapter": changed}))


if __name__ == "__main__":
    main()
