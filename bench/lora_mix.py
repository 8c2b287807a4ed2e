"""Many LoRA adapters in one job against the model alone and against one job per adapter.

    .venv/bin/python bench/lora_mix.py                      # 512 rows, 8 adapters of rank 16, demo "small"
    .venv/bin/python bench/lora_mix.py --rows 64 --size tiny   # a quick look

Workload: --rows code prompts (about 20-60 tokens, distinct), --max-tokens greedy tokens each, and
--adapters PEFT LoRA adapters of rank --rank on every projection (made by peft, bench/tiny_adapters.py),
rows assigned to them in turn. Three ways, each a whole job in this process (a fresh engine loaded
from the checkpoint, plan, shards, finalize: what `freight run` does), CPU seconds of one torch
thread (process time: the work done, whatever else runs on the machine):

- mixed: one job of every row, each with its `adapter` column, the adapters given by --lora;
- model alone: the same rows in one job without adapters (the throughput an adapter job aims at);
- separate: one job per adapter over its own rows (what a team runs without per-row adapters).

Targets: mixed >= 0.8x the model alone's tokens per CPU second; >= 3x faster than separate jobs. The
script checks that every row's completion in the mixed job equals its separate job's.
"""

from __future__ import annotations

import argparse
import json
import random
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


def run_job(model: Path, data: Path, out: Path, adapters: dict[str, Path], max_tokens: int) -> tuple[float, dict]:
    """(CPU seconds, {id: (adapter, completion, completion tokens)}) of one whole job, engine load included."""
    from jobs.planner import prepare_job
    from jobs.spec import JobSpec, LoraSpec, SamplingSpec
    from worker.engine import Engine, EngineConfig
    from worker.local import run_local

    c0 = time.process_time()
    engine = Engine.from_pretrained(model, EngineConfig(device="cpu", num_threads=1))
    spec = JobSpec(input=str(data), model=str(model), output=str(out), id_column="id", shard_rows=512,
                   sampling=SamplingSpec(max_tokens=max_tokens),
                   loras=tuple(LoraSpec(name=n, path=str(p)) for n, p in adapters.items()))  # fmt: skip
    prepared = prepare_job(spec)
    run_local(prepared.store, prepared.manifest, engine=engine)
    cpu = time.process_time() - c0
    table = ds.dataset(out / "shards").to_table(columns=["id", "adapter", "completion", "completion_tokens", "error"])
    rows = {r["id"]: r for r in table.to_pylist()}
    assert all(r["error"] is None for r in rows.values()), [r["error"] for r in rows.values() if r["error"]][:3]
    return cpu, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--size", default="small", choices=["tiny", "small", "medium"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    import transformers

    from jobs.log import configure_logging
    from worker.demo_model import make_demo_model

    configure_logging("json", "warning")
    with tempfile.TemporaryDirectory(prefix="freight-lora-mix-") as tmp:
        work = Path(tmp)
        model = make_demo_model(work / "model", "llama", size=args.size)
        base = transformers.AutoModelForCausalLM.from_pretrained(model).float().eval()
        adapters = {f"ft{k}": make_adapter(base, work / f"ft{k}", rank=args.rank, alpha=2 * args.rank, seed=k + 1,
                                           scale=0.05) for k in range(args.adapters)}  # fmt: skip
        names = list(adapters)
        texts = prompts(args.rows)
        assign = [names[i % len(names)] for i in range(args.rows)]
        ids = [f"r{i}" for i in range(args.rows)]
        pq.write_table(pa.table({"id": ids, "prompt": texts, "adapter": assign}), work / "all.parquet")

        mixed_cpu, mixed = run_job(model, work / "all.parquet", work / "out-mixed", adapters, args.max_tokens)
        base_cpu, alone = run_job(model, work / "all.parquet", work / "out-base", {}, args.max_tokens)
        separate_cpu, separate = 0.0, {}
        for name in names:
            mine = [i for i, a in enumerate(assign) if a == name]
            data = work / f"{name}.parquet"
            pq.write_table(pa.table({"id": [ids[i] for i in mine], "prompt": [texts[i] for i in mine],
                                     "adapter": [name] * len(mine)}), data)  # fmt: skip
            cpu, rows = run_job(model, data, work / f"out-{name}", {name: adapters[name]}, args.max_tokens)
            separate_cpu += cpu
            separate.update(rows)

    equal = sum(mixed[i]["completion"] == separate[i]["completion"] for i in ids)
    changed = sum(mixed[i]["completion"] != alone[i]["completion"] for i in ids)
    tokens = {k: sum(r["completion_tokens"] for r in rows.values()) for k, rows in
              (("mixed", mixed), ("base", alone), ("separate", separate))}  # fmt: skip
    speed = {k: tokens[k] / cpu for k, cpu in (("mixed", mixed_cpu), ("base", base_cpu), ("separate", separate_cpu))}
    print(f"{args.rows} rows ({sum(len(t) for t in texts):,} prompt characters), {args.max_tokens} greedy tokens "
          f"each, {args.adapters} adapters of rank {args.rank} on every projection, demo model {args.size!r}, "
          "1 torch thread; CPU seconds of each whole job, engine load included")  # fmt: skip
    print()
    print("| run | jobs | generated tokens | CPU s | tokens / CPU s | against mixed |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| mixed: {args.adapters} adapters in one job | 1 | {tokens['mixed']:,} | {mixed_cpu:.2f} | "
          f"{speed['mixed']:.1f} | |")  # fmt: skip
    print(f"| the model alone, same rows | 1 | {tokens['base']:,} | {base_cpu:.2f} | {speed['base']:.1f} | "
          f"mixed **{speed['mixed'] / speed['base']:.2f}x** its throughput (target >= 0.8x) |")  # fmt: skip
    print(f"| one job per adapter | {args.adapters} | {tokens['separate']:,} | {separate_cpu:.2f} | "
          f"{speed['separate']:.1f} | mixed **{separate_cpu / mixed_cpu:.2f}x** faster (target >= 3x) |")  # fmt: skip
    print()
    print(json.dumps({"rows_equal_to_separate": f"{equal}/{args.rows}", "rows_changed_by_adapter": changed}))


if __name__ == "__main__":
    main()
