"""Section (c') of bench/gpu_check.py: a small sweep of hand-picked launch configs around the
defaults of the three kernels with targets, so one GPU run shows whether a different tile shape
beats the default (and by how much). Each config is checked against the default's output first;
a config that fails to compile or disagrees is recorded, not fatal.
"""

from __future__ import annotations

import torch
from gpu_check_kernels import BF16, _paged, _randn

from kernels.reference import quant_matmul as ref_quant
from kernels.triton import quant_gemv as tg
from kernels.triton import quant_matmul as tq
from kernels.triton.paged_decode_attention import DecodeConfig, paged_decode_attention
from kernels.triton.prefill_attention import PrefillConfig, prefill_attention


def _try(
    chk, kind: str, label: str, fn, want: torch.Tensor, amount: float, unit: str, ceiling: str, graph: bool = False
) -> None:
    """graph: time a replayed CUDA graph (the kernels alone; the quantized matmuls, whose Python
    launch can outlast their GPU work) instead of eager calls."""
    row = {"kernel": kind, "config": label, "timing": "cuda graph" if graph else "eager"}
    try:
        got = fn()
        rel = float((got.float() - want.float()).norm() / want.float().norm())
        row["rel_err_vs_default"] = rel
        if not rel <= 1e-2:
            row["error"] = "disagrees with the default config"
        else:
            ms = chk.time_graph_ms(fn) if graph else chk.time_ms(fn)
            rate = amount / (ms * 1e-3) / (1e9 if unit == "GB/s" else 1e12)
            ceil = chk.report["ceilings"].get(ceiling)
            row.update(median_ms=ms, achieved=rate, unit=unit, of_ceiling=rate / ceil if ceil else None)
    except Exception as exc:  # a config that does not compile (registers, shared memory) is a result
        row["error"] = repr(exc)[:300]
    chk.report.setdefault("sweep", []).append(row)
    shown = f"{row['achieved']:9.1f} {unit}" if "achieved" in row else row["error"][:60]
    print(f"   {kind:<22} {label:<44} {shown}", flush=True)


def sweeps(chk, device) -> None:
    """Decode at batch 64 x 4k, prefill at 4k, int4 at M 1, 4, 16 and 4096, the GEMV kernels'
    launch shapes at M 1 and 4: the targets' cases."""
    shape = (8, 2, 64) if chk.dry_run else (32, 8, 128)  # Hq, Hkv, D
    _sweep_decode(chk, device, *shape)
    _sweep_prefill(chk, device, *shape)
    _sweep_int4(chk, device)
    _sweep_gemv(chk, device)


def _sweep_decode(chk, device, hq: int, hkv: int, d: int) -> None:
    dry = chk.dry_run
    batch, ctx = (3, 40) if dry else (64, 4096)
    kc, vc, tables = _paged([ctx] * batch, hkv, d, device)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    q = _randn(batch, hq, d, device=device)
    want = paged_decode_attention(q, kc, vc, tables, lens, d**-0.5)
    kv_bytes = 2 * batch * ctx * hkv * d * kc.element_size()
    decode_cfgs = (
        [DecodeConfig(16, 2), DecodeConfig(32, 1, 4, 1)]
        if dry
        else [
            DecodeConfig(block_n=bn, num_warps=w, num_stages=s)
            for bn, w, s in ((32, 4, 2), (64, 4, 3), (64, 8, 2), (128, 4, 2), (128, 8, 3))
        ]
        + [DecodeConfig(num_splits=2)]
    )
    for cfg in decode_cfgs:
        label = f"BN={cfg.block_n} splits={cfg.num_splits or 'auto'} w={cfg.num_warps} s={cfg.num_stages}"
        _try(
            chk,
            "paged_decode_attention",
            label,
            lambda cfg=cfg: paged_decode_attention(q, kc, vc, tables, lens, d**-0.5, config=cfg),
            want,
            kv_bytes,
            "GB/s",
            "copy_gbps",
        )


def _sweep_prefill(chk, device, hq: int, hkv: int, d: int) -> None:
    dry = chk.dry_run
    n = 40 if dry else 4096
    kc, vc, tables = _paged([n], hkv, d, device)
    cu = torch.tensor([0, n], dtype=torch.int32, device=device)
    lens = torch.tensor([n], dtype=torch.int32, device=device)
    q = _randn(n, hq, d, device=device)
    want = prefill_attention(q, kc, vc, cu, lens, tables, d**-0.5)
    flops = 4 * (n * (n + 1) // 2) * d * hq
    prefill_cfgs = (
        [PrefillConfig(16, 16, 4, 1), PrefillConfig(32, 16, 4, 1)]
        if dry
        else [
            PrefillConfig(bm, bn, w, s)
            for bm, bn, w, s in (
                (128, 32, 8, 3),
                (128, 128, 8, 2),
                (64, 64, 4, 3),
                (128, 64, 4, 3),
                (64, 128, 4, 2),
            )
        ]
    )
    for cfg in prefill_cfgs:
        label = f"BM={cfg.block_m} BN={cfg.block_n} w={cfg.num_warps} s={cfg.num_stages}"
        _try(
            chk,
            "prefill_attention",
            label,
            lambda cfg=cfg: prefill_attention(q, kc, vc, cu, lens, tables, d**-0.5, config=cfg),
            want,
            flops,
            "TFLOP/s",
            "matmul_tflops",
        )


def _sweep_int4(chk, device) -> None:
    dry = chk.dry_run
    nn_, kk, group = (64, 128, 64) if dry else (14336, 4096, 128)
    q4 = ref_quant.pack_int4(torch.randint(-8, 8, (nn_, kk), device=device))
    s4 = (torch.rand(nn_, kk // group, device=device) * 0.004 + 0.001).to(BF16)
    for m in (1, 3, 70) if dry else (1, 4, 16, 4096):
        x = _randn(m, kk, device=device)
        want = tq.int4_matmul(x, q4, s4, group)
        amount = nn_ * kk // 2 + s4.numel() * 2 + 2 * m * (kk + nn_)
        if dry:
            mm_cfgs = [tq.MatmulConfig(16 if m < 64 else 32, 32, 32, 2 if m < 64 else 1, 4, 1)]
        elif m <= 16:
            mm_cfgs = [
                tq.MatmulConfig(16, bn, bk, sk, w, st)
                for bn, bk, sk, w, st in (
                    (32, 128, 1, 4, 4),
                    (64, 128, 1, 4, 4),
                    (128, 128, 1, 4, 3),
                    (32, 128, 4, 4, 4),
                    (64, 128, 4, 4, 4),
                    (128, 64, 2, 8, 4),
                    (64, 64, 8, 4, 5),
                )
            ]
        else:  # prefill M: compute bound, rate in TFLOP/s would read better but GB/s keeps one column
            mm_cfgs = [
                tq.MatmulConfig(bm, bn, 64, 1, w, st)
                for bm, bn, w, st in ((128, 64, 4, 4), (64, 128, 4, 4), (128, 256, 8, 3), (256, 128, 8, 3))
            ]
        for cfg in mm_cfgs:
            label = f"M={m} BM={cfg.block_m} BN={cfg.block_n} BK={cfg.block_k} split={cfg.split_k} w={cfg.num_warps} s={cfg.num_stages}"
            _try(
                chk,
                "int4_matmul",
                label,
                lambda cfg=cfg, x=x: tq.int4_matmul(x, q4, s4, group, config=cfg),
                want,
                amount,
                "GB/s",
                "copy_gbps",
                graph=True,
            )


def _gemv_cfgs(default: tg.GemvConfig, dry: bool) -> list[tg.GemvConfig]:
    """Rows per thread 1, 2, 4 (block_n / 32 / warps) at 1-4 warps, and the split halved / doubled."""
    if dry:
        return [tg.GemvConfig(32, 2, 1), tg.GemvConfig(64, 1, 1)]
    s = default.split_k
    shapes = [(128, 1), (256, 2), (512, 4), (256, 4), (128, 4), (256, 1)]
    return [tg.GemvConfig(bn, s, w) for bn, w in shapes] + [
        tg.GemvConfig(default.block_n, max(1, s // 2), default.num_warps),
        tg.GemvConfig(default.block_n, 2 * s, default.num_warps),
    ]


def _sweep_gemv(chk, device) -> None:
    """int4 (G 128) and int8 GEMV at M 1 and 4 on the 14336 x 4096 weight."""
    dry = chk.dry_run
    n, k, group = (64, 128, 64) if dry else (14336, 4096, 128)
    q4 = ref_quant.pack_int4(torch.randint(-8, 8, (n, k), device=device))
    s4 = (torch.rand(n, k // group, device=device) * 0.004 + 0.001).to(BF16)
    q8 = torch.randint(-127, 128, (n, k), device=device, dtype=torch.int8)
    s8 = (torch.rand(n, device=device) * 2e-4 + 1e-4).to(BF16)
    for m in (1, 3) if dry else (1, 4):
        x = _randn(m, k, device=device)
        for kind, fn, nbytes, default in (
            ("int4_gemv", lambda c, x=x: tq.int4_matmul(x, q4, s4, group, config=c), n * k // 2 + s4.numel() * 2,
             tg.choose_gemv_config(n, k // 2, 16, device)),
            ("int8_gemv", lambda c, x=x: tq.int8_matmul(x, q8, s8, config=c), n * k + 2 * n,
             tg.choose_gemv_config(n, k, 32, device)),
        ):  # fmt: skip
            want = fn(default)
            for cfg in _gemv_cfgs(default, dry):
                label = f"M={m} BN={cfg.block_n} split={cfg.split_k} w={cfg.num_warps}"
                amount = nbytes + 2 * m * (k + n)
                _try(chk, kind, label, lambda cfg=cfg, fn=fn: fn(cfg), want, amount, "GB/s", "copy_gbps", graph=True)
