"""Sections (b) and (c) of bench/gpu_check.py for LoRA: the gathered low-rank product in Triton
(kernels/triton/lora.py: lora_shrink then lora_expand, one plan shared) against the per-adapter
torch loop (kernels/reference/lora.py, also the correctness reference) on Llama-3-8B's qkv_proj
(hidden 4096 -> q 4096 | k 1024 | v 1024), 8 adapters of rank 16 spread over the tokens with a
quarter of them on the base, bf16, at a decode-sized and a prefill-sized token count.

The product is memory-bound at decode sizes: the roofline figure is GB/s of what a call must move
(x and the output read and written once, h written and read, and the factors of every adapter
present), against the copy ceiling. At prefill sizes it is TFLOP/s of the low-rank work,
2 * T' * (K * L * R + N * R) for the T' adapter tokens. Goal (reported): no slower than the loop.

Imported by gpu_check.py after TRITON_INTERPRET is settled; `chk` is its Check.
"""

from __future__ import annotations

import torch
from gpu_check_kernels import _randn

from kernels.reference import lora as ref
from kernels.triton import lora as tri

# (hidden, q columns, kv columns), adapters, rank
SHAPE = (4096, 4096, 1024)
DRY_SHAPE = (64, 64, 32)
ADAPTERS, RANK = 8, 16


def lora_kernels(chk, device) -> None:
    shape = DRY_SHAPE if chk.dry_run else SHAPE
    for tokens in (37,) if chk.dry_run else (256, 4096):
        chk.case(f"lora qkv T={tokens}", _lora_case, chk, device, tokens, *shape)


def _lora_case(chk, device, tokens: int, hidden: int, q: int, kv: int) -> None:
    bounds = (0, q, q + kv, q + 2 * kv)
    n = bounds[-1]
    x = _randn(tokens, hidden, device=device)
    a = _randn(ADAPTERS, 3 * RANK, hidden, device=device, std=hidden**-0.5)
    b = _randn(ADAPTERS, n, RANK, device=device, std=RANK**-0.5)
    scaling = torch.full((ADAPTERS, 3), 2.0, device=device)
    g = torch.Generator(device="cpu").manual_seed(tokens)
    slots = torch.randint(0, ADAPTERS, (tokens,), generator=g, dtype=torch.int32)
    slots[torch.rand(tokens, generator=g) < 0.25] = -1
    slots = slots.to(device)
    out = _randn(tokens, n, device=device)
    ref_plan, tri_plan = ref.plan_slots(slots, ADAPTERS), tri.plan_slots(slots, ADAPTERS)

    def run(impl, plan, target):
        impl.lora_expand(impl.lora_shrink(x, a, slots, plan), b, scaling, slots, bounds, target, plan)

    got, want = out.clone(), out.clone()
    run(tri, tri_plan, got)
    run(ref, ref_plan, want)
    scratch = out.clone()
    loop_ms = chk.time_ms(lambda: run(ref, ref_plan, scratch))
    ms = chk.time_ms(lambda: run(tri, tri_plan, scratch))
    lora_tokens = int((slots >= 0).sum())
    used = int(torch.unique(slots[slots >= 0]).numel())
    moved = 2 * (tokens * hidden + 2 * tokens * n) + 4 * 2 * tokens * 3 * RANK + used * 2 * (a[0].numel() + b[0].numel())
    flops = 2.0 * lora_tokens * (hidden * 3 * RANK + n * RANK)
    decode = tokens <= 512
    extra = {"loop_ms": loop_ms, "speedup_vs_loop": loop_ms / ms, "adapters_used": used, "timing": "do_bench",
             "bytes": moved, "flops": flops}  # fmt: skip
    shape = f"T={tokens} K={hidden} N={n} R={RANK} S={ADAPTERS}"
    chk.kernel("lora qkv", shape, (got - out), (want - out), "reduction", ms, moved if decode else flops,
               "GB/s" if decode else "TFLOP/s", "copy_gbps" if decode else "matmul_tflops", extra)  # fmt: skip
    chk.target(f"lora qkv T={tokens} vs loop", loop_ms / ms, 1.0,
               "Triton LoRA time / per-adapter torch loop time (>= 1: not slower)")  # fmt: skip
