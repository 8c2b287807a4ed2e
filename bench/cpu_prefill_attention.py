"""Prefill attention on the CPU: the C kernel (kernels/cpu) against the torch path it replaces.

    .venv/bin/python bench/cpu_prefill_attention.py            # ~1 minute

One layer's prefill attention at the benchmark model's shape (8 query heads, 4 KV heads, head_dim
64, blocks of 16, fp32) over a paged cache whose blocks are scattered at random. The peer is
kernels.reference with its plan built beforehand (as the torch backend reuses it across layers):
each sequence's blocks gathered into a copy, torch's CPU flash kernel per sequence (causal, the
query group as batch). Both get the same threads (--threads, default 1); times are CPU seconds per
call, best of 5 rounds. GFLOP/s counts the causal half only: 4 x sum(q_len x keys seen / 2) x Hq x D.
"""

from __future__ import annotations

import random

import torch
from cpu_decode_attention import (  # bench/ is on sys.path
    BS,
    HKV,
    HQ,
    D,
    cpu_ms,
    qkv_queries,
    scattered_cache,
    start,
)

from kernels.cpu.paged_prefill_attention import NativePrefillAttention
from kernels.reference.attention import plan_prefill, prefill_with_plan


def case(q_lens: list[int], ctxs: list[int], seed: int = 0):
    k_cache, v_cache, tables = scattered_cache(ctxs, seed)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return qkv_queries(sum(q_lens)), k_cache, v_cache, cu, torch.tensor(ctxs, dtype=torch.int32), tables


def main() -> None:
    start(__doc__)
    native = NativePrefillAttention()
    rng = random.Random(0)
    mixed = [rng.randint(16, 512) for _ in range(8)]  # a 2,048-token budget's worth of the bench's prompts
    cases = [
        ("1 prompt of 64", [64], [64]),
        ("1 prompt of 256", [256], [256]),
        ("1 prompt of 512", [512], [512]),
        ("1 prompt of 1024", [1024], [1024]),
        (f"{len(mixed)} prompts 16-512", mixed, mixed),
        ("chunk 512 of 1536", [512], [1536]),
    ]
    print(f"{'case':<20} {'tokens':>6} {'torch ms':>9} {'C ms':>7} {'ratio':>6} {'torch GFLOP/s':>13} "
          f"{'C GFLOP/s':>9} {'max diff':>9}")  # fmt: skip
    for name, q_lens, ctxs in cases:
        q, k_cache, v_cache, cu, cl, tables = case(q_lens, ctxs)
        plan = plan_prefill(cu, cl, tables, BS, HQ // HKV)
        out = torch.empty(q.shape)
        expected = prefill_with_plan(q, k_cache, v_cache, plan, D**-0.5)
        got = native(q, k_cache, v_cache, cu, cl, tables, D**-0.5, out).clone()
        calls = max(3, 2048 // sum(q_lens))
        t_ref = cpu_ms(lambda: prefill_with_plan(q, k_cache, v_cache, plan, D**-0.5, out), calls)  # noqa: B023
        t_c = cpu_ms(lambda: native(q, k_cache, v_cache, cu, cl, tables, D**-0.5, out), calls)  # noqa: B023
        pairs = sum(n * (c - n) + n * (n + 1) / 2 for n, c in zip(q_lens, ctxs, strict=True))  # (query, key) seen
        gflop = 4 * pairs * HQ * D / 1e9
        print(f"{name:<20} {sum(q_lens):>6} {t_ref:>9.2f} {t_c:>7.2f} {t_ref / t_c:>5.1f}x {gflop / t_ref * 1e3:>13.1f} "
              f"{gflop / t_c * 1e3:>9.1f} {(got - expected).abs().max().item():>9.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
