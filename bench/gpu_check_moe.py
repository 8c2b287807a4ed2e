"""Sections (b) and (c) of bench/gpu_check.py for mixture of experts: the fused-MoE Triton kernel
(kernels/triton/fused_moe.py) against a loop of per-expert torch matmuls (kernels/reference/fused_moe.py:
tokens grouped by expert, each expert's gate_up matmul, activation, down matmul; also the correctness
reference) at the shapes of Qwen3-30B-A3B (128 experts, top-8, hidden 2048, expert 768),
Mixtral-8x7B (8 experts, top-2, hidden 4096, expert 14336) and gpt-oss-20b (32 experts, top-4,
hidden 2880, expert 2880, its config.json; with expert biases on gate_up and down and the clamped
SwiGLU, swiglu_limit 7.0 and alpha 1.702, transformers' GptOssConfig defaults; routed top-k then
softmax as gpt-oss does), bf16, random routing from random router logits, at a decode-sized and a
prefill-sized token count. Achieved TFLOP/s count the routed work only: 6 * T * K * H * I. Goal
(reported, not enforced): the fused kernel at least as fast as the loop.

Imported by gpu_check.py after TRITON_INTERPRET is settled; `chk` is its Check.
"""

from __future__ import annotations

import torch
from gpu_check_kernels import _randn

from kernels.reference.fused_moe import fused_moe as loop_moe
from kernels.reference.fused_moe import select_experts, select_experts_topk_softmax
from kernels.triton.fused_moe import fused_moe

# gpt-oss's expert options: biases and the clamped SwiGLU (swiglu_limit, swiglu_alpha)
GPT_OSS = {"biases": True, "swiglu_limit": 7.0, "swiglu_alpha": 1.702}
# name -> (experts, top_k, hidden, expert intermediate size, options)
MOE_SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768, {}), "mixtral-8x7b": (8, 2, 4096, 14336, {}),
              "gpt-oss-20b": (32, 4, 2880, 2880, GPT_OSS)}  # fmt: skip
DRY_SHAPES = {"qwen3-30b-a3b (tiny)": (16, 4, 64, 32, {}), "mixtral-8x7b (tiny)": (8, 2, 64, 48, {}),
              "gpt-oss-20b (tiny)": (8, 4, 72, 40, GPT_OSS)}  # fmt: skip


def moe_cases(dry_run: bool) -> list[tuple[str, int, int, int, int, int, dict]]:
    """(model, tokens, experts, top_k, hidden, expert size, options) of every case the section runs."""
    shapes, token_counts = (DRY_SHAPES, (40,)) if dry_run else (MOE_SHAPES, (64, 4096))
    return [(name, t, *shape) for name, shape in shapes.items() for t in token_counts]


def moe_kernels(chk, device) -> None:
    for model, tokens, *case in moe_cases(chk.dry_run):
        chk.case(f"fused_moe {model} T={tokens}", _moe_case, chk, device, model, tokens, *case)


def _moe_case(chk, device, model: str, tokens: int, experts: int, top_k: int, hidden: int, inter: int,
              options: dict) -> None:  # fmt: skip
    x = _randn(tokens, hidden, device=device)
    w13 = _randn(experts, 2 * inter, hidden, device=device, std=hidden**-0.5)
    w2 = _randn(experts, hidden, inter, device=device, std=inter**-0.5)
    logits = torch.randn(tokens, experts, device=device)
    kw = {}
    if options:
        weights, ids = select_experts_topk_softmax(logits, top_k)
        kw = {"b13": _randn(experts, 2 * inter, device=device), "b2": _randn(experts, hidden, device=device, std=0.1),
              "swiglu_limit": options["swiglu_limit"], "swiglu_alpha": options["swiglu_alpha"]}  # fmt: skip
    else:
        weights, ids = select_experts(logits, top_k, True)
    got = fused_moe(x, w13, w2, weights, ids, **kw)
    want = loop_moe(x, w13, w2, weights, ids, **kw)
    loop_ms = chk.time_ms(lambda: loop_moe(x, w13, w2, weights, ids, **kw))
    ms = chk.time_ms(lambda: fused_moe(x, w13, w2, weights, ids, **kw))
    used = int(torch.unique(ids).numel())
    extra = {"loop_ms": loop_ms, "speedup_vs_loop": loop_ms / ms, "experts_used": used, "timing": "do_bench"}
    if options:
        extra["options"] = f"biases, clamped SwiGLU limit {options['swiglu_limit']} alpha {options['swiglu_alpha']}"
    shape = f"T={tokens} E={experts} K={top_k} H={hidden} I={inter}"
    chk.kernel(f"fused_moe {model}", shape, got, want, "reduction", ms, 6.0 * tokens * top_k * hidden * inter,
               "TFLOP/s", "matmul_tflops", extra)  # fmt: skip
    chk.target(f"fused_moe {model} T={tokens} vs loop", loop_ms / ms, 1.0,
               "fused-MoE kernel time / per-expert torch matmul loop time (>= 1: not slower)")  # fmt: skip
