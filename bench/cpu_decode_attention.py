"""Decode attention on the CPU: the C kernel (kernels/cpu) against the torch path it replaces.

    .venv/bin/python bench/cpu_decode_attention.py            # ~1 minute

One decode step's attention for one layer of the benchmark model's shape (8 query heads, 4 KV
heads, head_dim 64, blocks of 16, fp32) over a paged cache whose blocks are scattered at random, as
the engine's are after a while. The peer is kernels.reference with its plan built beforehand (as the
torch backend reuses it across layers): sequences sorted by length in groups of 4, each group's
blocks gathered into a copy and attended by torch's CPU flash kernel. Both get the same threads
(--threads, default 1); times are CPU seconds per call, best of 5 rounds.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from kernels.cpu.paged_decode_attention import NativeDecodeAttention
from kernels.reference.attention import decode_with_plan, plan_decode

HQ, HKV, D, BS = 8, 4, 64, 16


def scattered_cache(lens: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random K/V caches holding these sequences' blocks at random places, and their block tables."""
    need = [-(-n // BS) for n in lens]
    num_blocks = sum(need) + 16
    k_cache, v_cache = torch.randn(num_blocks, BS, HKV, D), torch.randn(num_blocks, BS, HKV, D)
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    tables = torch.zeros(len(lens), max(need), dtype=torch.int32)
    for b, n in enumerate(need):
        tables[b, :n] = torch.tensor(perm[:n], dtype=torch.int32)
        perm = perm[n:]
    return k_cache, v_cache, tables


def qkv_queries(rows: int) -> torch.Tensor:
    """[rows, HQ, D] queries as the model passes them: a view of a fused qkv row."""
    return torch.randn(rows, HQ * D + 2 * HKV * D)[:, : HQ * D].view(rows, HQ, D)


def case(batch: int, lo: int, hi: int, seed: int = 0):
    rng = random.Random(seed)
    lens = [rng.randint(lo, hi) for _ in range(batch)]
    k_cache, v_cache, tables = scattered_cache(lens, seed)
    return qkv_queries(batch), k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


def cpu_ms(fn, calls: int) -> float:
    for _ in range(2):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - t0) / calls)
    return best * 1e3


def start(doc: str) -> None:
    """The command line of the CPU attention benches (--threads, their description `doc`): give torch
    the threads and print the header both tables stand under."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    threads = ap.parse_args().threads
    torch.set_num_threads(threads)
    print(f"torch {torch.__version__}, {threads} thread(s); Hq {HQ}, Hkv {HKV}, head_dim {D}, block {BS}\n")


def main() -> None:
    start(__doc__)
    native = NativeDecodeAttention()
    print(f"{'sequences':>9} {'context':>9} {'KV MB':>7} {'torch ms':>9} {'C ms':>7} {'ratio':>6} {'C GB/s':>7} {'max diff':>9}")
    for batch, lo, hi in [(4, 16, 640), (32, 16, 640), (128, 16, 640), (256, 16, 512), (64, 1000, 2000)]:
        q, k_cache, v_cache, tables, lens = case(batch, lo, hi)
        plan = plan_decode(tables, lens, BS)
        out = torch.empty(batch, HQ, D)
        expected = decode_with_plan(q, k_cache, v_cache, plan, D**-0.5)
        got = native(q, k_cache, v_cache, tables, lens, D**-0.5, out)
        calls = max(3, 4096 // batch)
        t_ref = cpu_ms(lambda: decode_with_plan(q, k_cache, v_cache, plan, D**-0.5, out), calls)  # noqa: B023
        t_c = cpu_ms(lambda: native(q, k_cache, v_cache, tables, lens, D**-0.5, out), calls)  # noqa: B023
        mb = int(lens.sum()) * HKV * D * 4 * 2 / 1e6
        print(f"{batch:>9} {f'{lo}-{hi}':>9} {mb:>7.1f} {t_ref:>9.2f} {t_c:>7.2f} {t_ref / t_c:>5.1f}x "
              f"{mb / t_c:>7.1f} {(got - expected).abs().max().item():>9.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
