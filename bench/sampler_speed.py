"""Sampling cost per decode step: freight's Sampler against transformers' warpers + multinomial.

Same logits for both (N rows x vocabulary V, fp32, random), temperature 0.8, optionally top-k 50 and
top-p 0.9; transformers runs the LogitsProcessorList its `generate` builds for these settings, then
`torch.multinomial` (one shared generator: it has no per-request seeds). freight draws each row at
a counter-based uniform of its own request's seed and token index. Prints ms per step and the ratio.

    .venv/bin/python bench/sampler_speed.py [--rows 256] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from worker.engine.batch_state import seed_keys
from worker.engine.sampler import Sampler, SamplingRows


def per_step_ms(fn: Callable[[], object], device: str, reps: int = 5) -> float:
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def compare(rows: int, vocab: int, top_k: int, top_p: float, device: str) -> tuple[float, float]:
    """(freight ms, transformers ms) per sampling step on the same random logits."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = torch.randn(rows, vocab, device=device)
    ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
    keys = np.array([seed_keys(i) for i in range(rows)], np.int64)
    params = SamplingRows.from_host(
        np.full(rows, 0.8, np.float32), np.full(rows, top_k, np.int64), np.full(rows, top_p, np.float32), keys,
        np.zeros(rows, np.int64), torch.device(device),
    )  # fmt: skip
    sampler = Sampler()
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.8)])
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))

    def hf_step() -> list[int]:
        probs = warpers(ids, logits.clone()).softmax(-1)
        return torch.multinomial(probs, 1)[:, 0].tolist()

    return per_step_ms(lambda: sampler.sample(logits, params).tolist(), device), per_step_ms(hf_step, device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.rows} rows, {args.device}, temperature 0.8")
    print(f"{'vocab':>7} {'cuts':<18} {'freight ms':>11} {'transformers ms':>16} {'ratio':>6}")
    for vocab in (4096, 32000, 128256):
        for top_k, top_p in ((0, 1.0), (50, 0.9)):
            ours, theirs = compare(args.rows, vocab, top_k, top_p, args.device)
            cuts = f"top-k {top_k}, top-p {top_p}" if top_k else "temperature only"
            print(f"{vocab:>7} {cuts:<18} {ours:>11.1f} {theirs:>16.1f} {theirs / ours:>5.1f}x")


if __name__ == "__main__":
    main()
