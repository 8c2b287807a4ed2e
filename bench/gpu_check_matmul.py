"""Sections (b) and (c) of bench/gpu_check.py for the quantized matmuls: int4 (group 128) and int8
weight-only, and fp8 (e4m3 weights, per-token activations), each against its torch reference and
timed against torch's bf16 matmul of the same shape (cuBLAS), with the weight-read roofline.

Decode (M 1-16) times every quantized call twice: through Python (triton.testing.do_bench, what an
eager engine step pays) and as a replayed CUDA graph (do_bench_cudagraph: the kernels alone, which
is what the targets are about and what a graph-captured decode step pays). int4 / int8 are timed
through the wrappers' choice and through each kernel forced (the GEMV of quant_gemv.py, the
tensor-core kernel of quant_matmul.py), so one run shows where the GEMV stops paying
(INT4_GEMV_MAX_M / INT8_GEMV_MAX_M). Roofline = bytes the call must read (packed weights, scales,
x) / the measured copy bandwidth. Targets: int4 and int8 >= 1.5x bf16 at M 1..16
(kernels alone); fp8 >= 1.6x bf16 at M 4096.

Imported by gpu_check.py after TRITON_INTERPRET is settled; `chk` is its Check.
"""

from __future__ import annotations

import torch
from gpu_check_kernels import BF16, _randn

from kernels.reference import fp8_matmul as ref_fp8
from kernels.reference import quant_matmul as ref_quant
from kernels.triton import fp8_matmul as tf8
from kernels.triton import quant_gemv as tg
from kernels.triton import quant_matmul as tq

DECODE_M = (1, 2, 4, 8, 16)


def matmul_kernels(chk, device) -> None:
    """int4 / int8 at decode M through the auto choice and both kernels, and at prefill M."""
    dry = chk.dry_run
    shapes = [(64, 128)] if dry else [(14336, 4096), (4096, 14336)]  # (N, K): Llama-8B MLP up / down
    for n, k in shapes:
        _matmul_shape(chk, device, n, k, ms=[1, 2, 3, 16, 70] if dry else [*DECODE_M, 4096], group=64 if dry else 128)


def fp8_kernels(chk, device) -> None:
    """fp8 at decode M and at M 4096 (the target) against bf16; needs compute capability >= 8.9."""
    if not chk.dry_run:
        from kernels.checks import check_fp8_capability

        check_fp8_capability(device)  # an older GPU: this section records the refusal and ends
    n, k = (64, 128) if chk.dry_run else (14336, 4096)
    w = _randn(n, k, device=device, std=0.02)
    q, s = ref_fp8.quantize_fp8_rows(w)
    for m in [1, 16, 70] if chk.dry_run else [*DECODE_M, 4096]:
        chk.case(f"fp8_matmul M={m}", _fp8_case, chk, device, w, q, s, m)


def _fp8_case(chk, device, w: torch.Tensor, q: torch.Tensor, s: torch.Tensor, m: int) -> None:
    n, k = w.shape
    x = _randn(m, k, device=device)
    got, want = tf8.fp8_matmul(x, q, s), ref_fp8.fp8_matmul(x, q, s)
    dense_ms = chk.time_graph_ms(lambda: x @ w.T)
    t = chk.time_graph_ms(lambda: tf8.fp8_matmul(x, q, s))
    extra = {"bf16_matmul_ms": dense_ms, "speedup_vs_bf16": dense_ms / t, "timing": "cuda graph"}
    shape = f"M={m} N={n} K={k}"
    if m <= 16:
        chk.kernel("fp8_matmul", shape, got, want, "reduction", t, n * k + 4 * n + 2 * m * (k + n), "GB/s",
                   "copy_gbps", _roofline(chk, n * k + 4 * n + 2 * m * (k + n), t, extra))  # fmt: skip
    else:
        chk.kernel("fp8_matmul", shape, got, want, "reduction", t, 2 * m * n * k, "TFLOP/s", "matmul_tflops", extra)
        chk.target(f"fp8 matmul {shape}", extra["speedup_vs_bf16"], 1.6, "speedup over bf16 torch matmul")
    _print_peers(extra)


def _roofline(chk, nbytes: float, ms: float, extra: dict) -> dict:
    """Adds the weight-read roofline (bytes / measured copy bandwidth) and the share of it reached."""
    copy = chk.report["ceilings"].get("copy_gbps")
    if copy:
        extra["roofline_ms"] = nbytes / (copy * 1e9) * 1e3
        extra["of_roofline"] = extra["roofline_ms"] / ms
    return extra


def _matmul_shape(chk, device, n: int, k: int, ms: list[int], group: int) -> None:
    w = _randn(n, k, device=device, std=0.02)
    q4 = ref_quant.pack_int4(torch.randint(-8, 8, (n, k), device=device))
    s4 = (torch.rand(n, k // group, device=device) * 0.004 + 0.001).to(BF16)
    q8 = torch.randint(-127, 128, (n, k), device=device, dtype=torch.int8)
    s8 = (torch.rand(n, device=device) * 2e-4 + 1e-4).to(BF16)
    bytes4, bytes8 = n * k // 2 + s4.numel() * 2, n * k + n * 2
    for m in ms:
        x = _randn(m, k, device=device)
        dense_ms = chk.time_graph_ms(lambda x=x: x @ w.T)
        variants = {
            "int4_matmul": (lambda x, c=None: tq.int4_matmul(x, q4, s4, group, config=c), bytes4,
                            lambda x: ref_quant.int4_matmul(x, q4, s4, group)),
            "int8_matmul": (lambda x, c=None: tq.int8_matmul(x, q8, s8, config=c), bytes8,
                            lambda x: ref_quant.int8_matmul(x, q8, s8)),
        }  # fmt: skip
        for name, (fn, weight_bytes, ref) in variants.items():
            forced = {}
            if m <= tg.GEMV_MAX_M:  # both kernels, whatever the wrapper would pick
                int4 = name.startswith("int4")
                units, step = (k // 2, 16) if int4 else (k, 32)
                forced = {
                    name.replace("matmul", "gemv"): tg.choose_gemv_config(n, units, step, x.device),
                    name.replace("matmul", "dot"): tq.choose_config(m, n, k, x.device, group if int4 else None),
                }
            for label, cfg in {name: None, **forced}.items():
                shape = f"M={m} N={n} K={k}" + (f" G={group}" if name == "int4_matmul" else "")
                chk.case(f"{label} {shape}", _matmul_case, chk, label, shape, lambda x, f=fn, c=cfg: f(x, c), ref,
                         x, dense_ms, weight_bytes, n, k)  # fmt: skip


def _matmul_case(
    chk, name: str, shape: str, fn, ref, x, dense_ms: float, weight_bytes: int, n: int, k: int
) -> None:
    m = x.shape[0]
    got, want = fn(x), ref(x)
    t = chk.time_graph_ms(lambda: fn(x))
    extra = {"bf16_matmul_ms": dense_ms, "speedup_vs_bf16": dense_ms / t, "timing": "cuda graph"}
    if m <= 16:  # decode: bound by the weight read
        amount = weight_bytes + 2 * m * (k + n)
        extra["eager_ms"] = chk.time_ms(lambda: fn(x))  # through Python: launch costs included
        chk.kernel(name, shape, got, want, "reduction", t, amount, "GB/s", "copy_gbps", _roofline(chk, amount, t, extra))
        if name in ("int4_matmul", "int8_matmul"):
            chk.target(f"{name.split('_')[0]} matmul {shape}", extra["speedup_vs_bf16"], 1.5,
                       "speedup over bf16 torch matmul, kernels alone (CUDA graph)")  # fmt: skip
    else:
        chk.kernel(name, shape, got, want, "reduction", t, 2 * m * n * k, "TFLOP/s", "matmul_tflops", extra)
    _print_peers(extra)


def _print_peers(extra: dict) -> None:
    line = f"bf16 torch matmul {extra['bf16_matmul_ms'] * 1e3:.1f} us -> x{extra['speedup_vs_bf16']:.2f}"
    if "roofline_ms" in extra:
        line += f"; roofline {extra['roofline_ms'] * 1e3:.1f} us ({extra['of_roofline']:.0%} of it)"
    if "eager_ms" in extra:
        line += f"; through Python {extra['eager_ms'] * 1e3:.1f} us"
    print(f"   {'':<22} {line}", flush=True)
