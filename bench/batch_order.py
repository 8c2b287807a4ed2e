"""Batch order: engine steps on bench/engine_vs_hf.py's mixed workload with freight's order
(`ordering.batch_order`: prefix groups, longest generation first) against prefix-trie order alone.

    .venv/bin/python bench/batch_order.py            # 256 prompts, ~4 minutes on 2 cores

Same model, engine settings and prompts as engine_vs_hf.py's "mixed" row. The step counts are
deterministic (the scheduler's decisions, not timings); CPU seconds are printed too but move with
the machine's load.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from engine_vs_hf import workloads

import worker.engine.engine as engine_module
from worker.demo_model import make_demo_model
from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.ordering import batch_order, prefix_order


def run(path: Path, order_fn, prompts, max_tokens) -> tuple[int, int, float]:
    """(steps, steps with fewer than 64 sequences, CPU seconds) for one generate call."""
    engine_module.batch_order = order_fn  # the engine looks the name up at each stream()
    engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=3 << 29, max_num_batched_tokens=2048))
    narrow = 0
    launch = engine.runner.launch

    def counted(sched):
        nonlocal narrow
        narrow += len(sched.chunks) + sched.decode_rows.size + len(sched.spec) < 64
        return launch(sched)

    engine.runner.launch = counted
    c0 = time.process_time()
    engine.generate(prompts, [SamplingParams(max_tokens=m, ignore_eos=True) for m in max_tokens])
    return engine.stats.steps, narrow, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = make_demo_model(Path(tmp) / "llama", "llama", size="medium")
        vocab = 4096  # the medium demo model's
        mixed = workloads(args.prompts, vocab)[0]
        orders = {
            "prefix-trie order": lambda prompts, max_tokens, block_size: prefix_order(prompts),
            "batch_order": batch_order,
        }
        print(f"{'order':<18} {'steps':>6} {'steps < 64 seqs':>16} {'CPU s':>7}")
        for name, fn in orders.items():
            steps, narrow, cpu = run(path, fn, mixed.prompts, mixed.max_tokens)
            print(f"{name:<18} {steps:>6} {narrow:>16} {cpu:>7.1f}", flush=True)
    engine_module.batch_order = batch_order


if __name__ == "__main__":
    main()
