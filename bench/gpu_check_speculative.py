"""gpu_check section (d'): speculative decoding (prompt lookup) on the GPU, plain vs ngram in one run.

Copy-heavy prompts (a random span repeated, then its start again) at batch 1, 8 and 64 on the engine
model of section (d): output tokens per second with and without speculation, the acceptance, the
controller's measured step seconds by rows (the crossover on this GPU), and whether the greedy
outputs are identical (bf16: near-ties may flip between a verify row and a decode row).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.speculation.config import SpeculativeConfig


def _prompts(vocab: int, n: int, dry: bool) -> list[list[int]]:
    rng = random.Random(1)
    span = 12 if dry else 96
    out = []
    for _ in range(n):
        s = [rng.randrange(3, vocab) for _ in range(span)]
        out.append(s + s + s[: span // 4])
    return out


def _rate(engine: Engine, prompts: list[list[int]], batch: int, tokens: int, device: torch.device) -> tuple:
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    engine.generate(prompts[:1], SamplingParams(max_tokens=2, ignore_eos=True))  # warm up
    before = engine.stats.snapshot()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = []
    for i in range(0, len(prompts), batch):
        outs += engine.generate(prompts[i : i + batch], params)
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    delta = engine.stats.snapshot() - before
    return sum(len(o.token_ids) for o in outs) / wall, [o.token_ids for o in outs], delta


def speculative_case(chk, device: torch.device, folder: Path, vocab: int) -> None:
    dry = chk.dry_run
    batches, tokens = ((1, 4), 12) if dry else ((1, 8, 64), 128)
    base = {"device": str(device), "backend": "triton", "dtype": "float32" if dry else "bfloat16",
            "max_num_seqs": max(batches), "kv_cache_bytes": (1 << 24) if dry else (8 << 30)}  # fmt: skip
    engines = {
        "plain": Engine.from_pretrained(folder, EngineConfig(**base)),
        "ngram": Engine.from_pretrained(  # dry: every proposal verified, so the Triton verify path runs
            folder, EngineConfig(**base, speculative=SpeculativeConfig("ngram", adaptive=not dry))
        ),
    }
    report: dict = {"batches": {}}
    for batch in batches:
        prompts = _prompts(vocab, batch if batch > 1 else (2 if dry else 8), dry)
        plain_rate, plain_ids, _ = _rate(engines["plain"], prompts, batch, tokens, device)
        rate, ids, st = _rate(engines["ngram"], prompts, batch, tokens, device)
        row = {"plain_tokens_per_s": plain_rate, "ngram_tokens_per_s": rate, "ratio": rate / plain_rate,
               "acceptance": st.spec_acceptance_rate, "mean_accepted_length": st.spec_mean_accepted_length,
               "identical": sum(a == b for a, b in zip(plain_ids, ids, strict=True)), "requests": len(ids)}  # fmt: skip
        report["batches"][batch] = row
        print(f"   batch {batch:>3}: plain {plain_rate:,.0f} tok/s, ngram {rate:,.0f} tok/s (x{row['ratio']:.2f}), "
              f"acceptance {row['acceptance']:.2f}, mean length {row['mean_accepted_length']:.2f}, "
              f"identical {row['identical']}/{row['requests']}", flush=True)  # fmt: skip
    report["step_seconds_by_rows"] = engines["ngram"].speculator.controller.table()  # type: ignore[union-attr]
    chk.report["speculative"] = report
    if not dry:
        chk.target("speculative ngram x at batch 1", report["batches"][1]["ratio"], 1.2, "copy-heavy, bf16")
        chk.target("speculative ngram x at batch 64", report["batches"][64]["ratio"], 0.97, "controller turns it off")
