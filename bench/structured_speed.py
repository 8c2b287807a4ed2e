"""Structured outputs' cost: bench/engine_vs_hf.py's mixed workload with bench/nested_schema.json on
every row vs the same rows unconstrained, one engine, one run, on the CPU.

    .venv/bin/python bench/structured_speed.py                  # 64 prompts, batch 64, 1 thread
    .venv/bin/python bench/structured_speed.py --prompts 128 --repeats 2

Prompts of 16..512 random tokens, max_tokens 16..128, greedy, EOS ignored (an unconstrained row
generates exactly max_tokens; a constrained one stops earlier when its object is complete, so the
comparison is per token: prompt + generated tokens per CPU second). Also: the schema's compile time
(the first constrained request builds the tokenizer information and compiles it; the grammar cache
then serves every row), the host time spent filling masks per constrained step, and the share of
constrained rows that finished with a complete, schema-valid object. CPU seconds are the fair
measure on a shared machine (--threads 1); the runs alternate and the fastest of each side is kept.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from engine_vs_hf import workloads

from contracts.constraint import Constraint
from worker.demo_model import make_demo_model
from worker.engine import Engine, EngineConfig, SamplingParams

SCHEMA = json.loads((Path(__file__).parent / "nested_schema.json").read_text())


def run(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, float]:
    before = engine.stats.snapshot()
    t0, c0 = time.perf_counter(), time.process_time()
    outs = engine.generate(prompts, params)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    delta = engine.stats.snapshot() - before
    generated = sum(len(o.token_ids) for o in outs)
    tokens = sum(len(p) for p in prompts) + generated
    stopped = [o for o in outs if o.finish_reason == "stop"]
    valid = sum(1 for o in stopped if _valid(o.text))
    return {"wall": wall, "cpu": cpu, "tokens": tokens, "generated": generated, "steps": delta.steps,
            "mask_s": delta.mask_seconds, "stop": len(stopped), "valid": valid, "rows": len(outs)}  # fmt: skip


def _valid(text: str) -> bool:
    import jsonschema  # a dev dependency: the judge

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64, help="max_num_seqs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--size", default="medium", help="demo model size (tiny, small, medium)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = make_demo_model(Path(tmp) / "llama", "llama", size=args.size)
        config = EngineConfig(kv_cache_bytes=3 << 29, max_num_batched_tokens=2048, max_num_seqs=args.batch)
        engine = Engine.from_pretrained(path, config)
        w = next(x for x in workloads(args.prompts, engine.vocab_size) if x.name == "mixed")
        constraint = Constraint.json_schema(SCHEMA)
        t0 = time.perf_counter()
        engine.structured.grammars.tokenizer  # noqa: B018 (llguidance's tokenizer information, once per model)
        tokenizer_s = time.perf_counter() - t0
        error = engine.structured.error(constraint)  # the compile, once per distinct constraint
        compile_s = time.perf_counter() - t0 - tokenizer_s
        if error:
            raise SystemExit(error)
        plain = [SamplingParams(max_tokens=m, ignore_eos=True) for m in w.max_tokens]
        shaped = [SamplingParams(max_tokens=m, ignore_eos=True, constraint=constraint) for m in w.max_tokens]
        results: dict[str, list[dict[str, float]]] = {"unconstrained": [], "json schema": []}
        for r in range(args.repeats):
            if r:
                engine = Engine.from_pretrained(path, config)
            results["unconstrained"].append(run(engine, w.prompts, plain))
            engine = Engine.from_pretrained(path, config)  # an empty prefix cache for the other side too
            results["json schema"].append(run(engine, w.prompts, shaped))
    best = {k: min(v, key=lambda x: x["tokens"] / -x["cpu"]) for k, v in results.items()}
    print(f"model: random Llama ({args.size}), {args.prompts} prompts, batch {args.batch}, "
          f"{torch.get_num_threads()} thread(s); tokenizer information {tokenizer_s * 1e3:.1f} ms, "
          f"schema compile {compile_s * 1e3:.1f} ms")  # fmt: skip
    print(f"{'rows':<14} {'tokens':>7} {'generated':>9} {'CPU s':>7} {'wall s':>7} {'tok/CPU s':>9} {'steps':>6} "
          f"{'mask ms/step':>12} {'stop':>5} {'valid':>5}")  # fmt: skip
    for name, r in best.items():
        per_step = r["mask_s"] / r["steps"] * 1e3 if r["steps"] else 0.0
        print(f"{name:<14} {r['tokens']:>7.0f} {r['generated']:>9.0f} {r['cpu']:>7.2f} {r['wall']:>7.2f} "
              f"{r['tokens'] / r['cpu']:>9.0f} {r['steps']:>6.0f} {per_step:>12.3f} {r['stop']:>5.0f} {r['valid']:>5.0f}")  # fmt: skip
    u, s = best["unconstrained"], best["json schema"]
    print(f"throughput ratio (json schema / unconstrained, tokens per CPU second): "
          f"{(s['tokens'] / s['cpu']) / (u['tokens'] / u['cpu']):.2f}x; "
          f"mask fill {s['mask_s'] / max(1, s['generated']) * 1e6:.1f} us per constrained token")  # fmt: skip


if __name__ == "__main__":
    main()
