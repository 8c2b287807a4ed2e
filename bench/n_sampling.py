"""n > 1 as one request forked from one prefill vs the same choices as separate requests.

    .venv/bin/python bench/n_sampling.py                 # 64 prompts x n = 8, demo "small" model
    .venv/bin/python bench/n_sampling.py --size tiny --prompts 16   # a quick look

Workload: --prompts random prompts of --prompt-len tokens (+-50%), --max-tokens sampled tokens each
(temperature 1, seeded, EOS ignored). "n = N" runs each prompt once with SamplingParams(n=N, seed=s);
"separate" runs every prompt N times with seeds s, s+1, ..., s+N-1: by the per-choice seed rule
(choice i draws with seed + i) the same completions, which the script checks. Both with the prefix
cache off and on, each on a fresh engine, in one process. Reported: prefill tokens the model computed
(EngineStats.computed_prefill_tokens), generated tokens, CPU seconds of `generate` (process time,
one torch thread: the work done, whatever else runs on the machine) and wall seconds.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from worker.demo_model import SIZES, make_demo_model
from worker.engine import Engine, EngineConfig, SamplingParams


def run(path: Path, prompts: list[list[int]], n: int, max_tokens: int, forked: bool, cache: bool) -> dict:
    engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=1 << 30, enable_prefix_caching=cache,
                                                       num_threads=1))  # fmt: skip
    base = SamplingParams(max_tokens=max_tokens, temperature=1.0, ignore_eos=True)
    if forked:
        batch = prompts
        params = [replace(base, n=n, seed=1000 * i) for i in range(len(prompts))]
    else:
        batch = [p for p in prompts for _ in range(n)]
        params = [replace(base, seed=1000 * i + c) for i in range(len(prompts)) for c in range(n)]
    t0, c0 = time.perf_counter(), time.process_time()
    outs = engine.generate(batch, params)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    choices = [o.token_ids for r in outs for o in r.outputs]
    s = engine.stats.snapshot()
    return {"prefill": s.computed_prefill_tokens, "decode": s.decode_tokens, "cpu": cpu, "wall": wall,
            "choices": choices, "prompt": s.prompt_tokens}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--size", default="small", choices=list(SIZES))
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)
    lo, hi = args.prompt_len // 2, args.prompt_len * 3 // 2
    prompts = [[rng.randrange(3, 1000) for _ in range(rng.randint(lo, hi))] for _ in range(args.prompts)]
    print(f"{args.prompts} prompts of {lo}-{hi} tokens ({sum(map(len, prompts))} in all) x n = {args.n}, "
          f"{args.max_tokens} sampled tokens per choice, demo model {args.size!r}, 1 torch thread")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = make_demo_model(Path(tmp), "llama", size=args.size)
        for cache in (False, True):
            sep = run(path, prompts, args.n, args.max_tokens, forked=False, cache=cache)
            one = run(path, prompts, args.n, args.max_tokens, forked=True, cache=cache)
            same = sum(a == b for a, b in zip(sep["choices"], one["choices"], strict=True))
            rows.append((cache, sep, one, same))
    print()
    print("| prefix cache | requests | computed prefill tokens | generated tokens | CPU s | wall s |"
          " prefill ratio | CPU speed-up | choices equal |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    total = args.prompts * args.n
    for cache, sep, one, same in rows:
        name = "on" if cache else "off"
        print(f"| {name} | {total} separate | {sep['prefill']:,} | {sep['decode']:,} | {sep['cpu']:.2f} |"
              f" {sep['wall']:.2f} | | | |")  # fmt: skip
        print(f"| {name} | {args.prompts} x n = {args.n} | {one['prefill']:,} | {one['decode']:,} | {one['cpu']:.2f} |"
              f" {one['wall']:.2f} | 1/{sep['prefill'] / one['prefill']:.1f} | {sep['cpu'] / one['cpu']:.2f}x |"
              f" {same}/{total} |")  # fmt: skip


if __name__ == "__main__":
    main()
