"""Compile every Triton kernel for Hopper (sm_90) on a machine without a GPU, at the launch configs
the wrappers use and the ones bench/gpu_check.py sweeps, and print what the GPU would get:
shared memory, registers and spills (from the cubin, through the cuobjdump bundled with triton) and
whether the dots became tensor-core instructions. Catches what the interpreter cannot: code that
does not compile, configs that overflow shared memory (228 KiB per SM on H100/H200) or spill.

    .venv/bin/python bench/compile_check.py            # defaults + sweep configs
    .venv/bin/python bench/compile_check.py --defaults # the wrappers' default configs only

For the quantized matmuls it also counts the SASS instructions of the main loop per weight each
thread handles in one trip ("sass/w"): what the dequantization and the multiply-adds cost in issue
slots. 132 SMs x 4 schedulers x 1.98 GHz issue ~1.05e12 warp instructions a second on an H200, so
sass/w x weights / 33.4e12 bounds a kernel from below (14336 x 4096: 58.7M weights -> 1.76 us
per sass/w), next to the weight read (bytes / copy bandwidth).

Exit status 1 when a config fails to compile, overflows shared memory or spills registers. Run without
TRITON_INTERPRET (compiled kernels are what is checked).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED_LIMIT = 227 * 1024  # usable shared memory per block on sm_90, bytes
FLOAT_ARGS = {"eps", "scale_log2"}
# What a real launch specializes (Triton does it from the values): unit strides become the constant
# 1, and pointers plus these ints are known multiples of 16 at the sizes that matter (head_dim 128,
# block_size 16, hidden / N / K multiples of 128), which is what lets loads vectorize.
UNIT_STRIDES = {"stride_kd", "stride_vd", "stride_cd", "stride_xk", "stride_wk", "stride_sg", "stride_on", "stride_ak",
                "stride_hr", "stride_br", "stride_sl"}
ALIGNED_INTS = {"head_dim", "half", "hidden", "tokens_per_split", "k_per_split", "bytes_per_split", "N", "K"}


def _cases(defaults_only: bool) -> list[tuple[str, object, dict, dict, dict, int | None]]:
    """(label, kernel, pointer dtypes, constexprs, options, weights per thread and loop step or
    None) per compile."""
    from kernels.triton import quant_gemv as qg
    from kernels.triton import quant_matmul as qm
    from kernels.triton.fp8_matmul import _quantize_rows_kernel
    from kernels.triton.lora import _expand_kernel, _shrink_kernel
    from kernels.triton.paged_decode_attention import _decode_merge_kernel, _decode_split_kernel
    from kernels.triton.prefill_attention import _prefill_kernel
    from kernels.triton.rms_norm import _rms_norm_kernel
    from kernels.triton.rotary import _rotary_kernel
    from kernels.triton.store_kv_cache import _store_kv_cache_kernel

    bf = "*bf16"
    attn_ptrs = {
        "bt_ptr": "*i32",
        "lens_ptr": "*i32",
        "cu_ptr": "*i32",
        "po_ptr": "*fp32",
        "pml_ptr": "*fp32",
    }
    cases = [
        ("store_kv_cache", _store_kv_cache_kernel, {"slot_ptr": "*i64"}, {"BLOCK_H": 8, "BLOCK_D": 128}, {}),
        ("rms_norm H=4096", _rms_norm_kernel, {}, {"HAS_RESIDUAL": True, "BLOCK_H": 4096}, {"num_warps": 16}),
        (
            "rotary D=128",
            _rotary_kernel,
            {"pos_ptr": "*i64", "cs_ptr": "*fp32"},
            {"BLOCK_HQ": 32, "BLOCK_HKV": 8, "BLOCK_HALF": 64},
            {},
        ),
        (
            "decode merge",
            _decode_merge_kernel,
            {"po_ptr": "*fp32", "pml_ptr": "*fp32"},
            {"BLOCK_S": 16, "BLOCK_D": 128},
            {},
        ),
    ]
    decode = (
        [(64, 4, 2)]
        if defaults_only
        else [(64, 4, 2), (32, 4, 2), (64, 4, 3), (64, 8, 2), (128, 4, 2), (128, 8, 3)]
    )
    for bn, w, s in decode:
        for split in (False, True):
            cases.append(
                (
                    f"decode BN={bn} w={w} s={s} split={split}",
                    _decode_split_kernel,
                    attn_ptrs,
                    {
                        "block_size": 16,
                        "SPLIT": split,
                        "BLOCK_G": 16,
                        "BLOCK_N": bn,
                        "BLOCK_D": 128,
                        "UPCAST": False,
                    },
                    {"num_warps": w, "num_stages": s},
                )
            )
    if not defaults_only:  # an fp32 model on CUDA: full-precision dots
        fp32 = {"default": "*fp32", **attn_ptrs}
        cases.append(
            (
                "decode fp32 BN=64 w=4 s=2",
                _decode_split_kernel,
                fp32,
                {
                    "block_size": 16,
                    "SPLIT": False,
                    "BLOCK_G": 16,
                    "BLOCK_N": 64,
                    "BLOCK_D": 128,
                    "UPCAST": False,
                },
                {"num_warps": 4, "num_stages": 2},
            )
        )
        cases.append(
            (
                "prefill fp32 BM=128 BN=64 w=8 s=3",
                _prefill_kernel,
                fp32,
                {"block_size": 16, "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_D": 128, "UPCAST": False},
                {"num_warps": 8, "num_stages": 3},
            )
        )
    prefill = (
        [(128, 64, 8, 3)]
        if defaults_only
        else [
            (128, 64, 8, 3),
            (128, 32, 8, 3),
            (128, 128, 8, 2),
            (64, 64, 4, 3),
            (128, 64, 4, 3),
            (64, 128, 4, 2),
        ]
    )
    for bm, bn, w, s in prefill:
        cases.append(
            (
                f"prefill BM={bm} BN={bn} w={w} s={s}",
                _prefill_kernel,
                attn_ptrs,
                {"block_size": 16, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": 128, "UPCAST": False},
                {"num_warps": w, "num_stages": s},
            )
        )
    mm = [(16, 64, 128, 4, 4), (128, 128, 64, 8, 3)]
    if not defaults_only:
        mm += [
            (16, 32, 128, 4, 4),
            (16, 128, 128, 4, 3),
            (16, 128, 64, 8, 4),
            (16, 64, 64, 4, 5),
            (128, 64, 64, 4, 4),
            (64, 128, 64, 4, 4),
            (128, 256, 64, 8, 3),
            (256, 128, 64, 8, 3),
        ]
    # x's per-token e4m3 quantization before torch._scaled_mm: rows of up to 1024 per loop step
    cases.append(
        (
            "fp8 quantize rows BK=1024",
            _quantize_rows_kernel,
            {"q_ptr": "*fp8e4nv", "s_ptr": "*fp32"},
            {"FP8_MAX": 448.0, "MIN_SCALE": 1e-12 / 448.0, "BLOCK_K": 1024},
            {"num_warps": 4},
        )
    )
    # LoRA: the shrink at L * R = 48 (q/k/v at rank 16) and 192 (rank 64, three tiles of 64); the expand
    # at ranks 16 and 64 over three slices
    lora_ptrs = {"h_ptr": "*fp32", "scale_ptr": "*fp32", "rows_ptr": "*i32", "slots_ptr": "*i32"}
    for block_r in (64,) if defaults_only else (16, 64):
        cases.append((f"lora shrink BR={block_r}", _shrink_kernel, lora_ptrs,
                      {"BLOCK_M": 16, "BLOCK_R": block_r, "BLOCK_K": 64, "UPCAST": False}, {}))  # fmt: skip
    for block_r in (16,) if defaults_only else (16, 64):
        cases.append((f"lora expand L=3 BR={block_r}", _expand_kernel, lora_ptrs,
                      {"SLICES": 3, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_R": block_r, "UPCAST": False}, {}))  # fmt: skip
    weights = {}  # label -> weights per thread and loop step, for the sass/w column
    for bm, bn, bk, w, s in mm:
        meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "UPCAST": False}
        opts = {"num_warps": w, "num_stages": s}
        for bits, kernel, ptrs, extra in (
            (4, qm._int4_matmul_kernel, {"w_ptr": "*u8", "out_ptr": "*fp32"}, {"GROUP": 128, "SCALE_WEIGHTS": bm > bk}),
            (8, qm._int8_matmul_kernel, {"w_ptr": "*i8"}, {}),
        ):
            label = f"int{bits} BM={bm} BN={bn} BK={bk} w={w} s={s}"
            weights[label] = bn * bk // (32 * w)
            cases.append((label, kernel, ptrs, {**meta, **extra}, opts))
    gemv = [(128, 1)] if defaults_only else [(128, 1), (256, 2), (512, 4), (256, 4), (128, 4)]
    for bn, w in gemv:
        for bits, kernel, ptrs, extra, ms in (
            (8, qg._int8_gemv_kernel, {"w_ptr": "*i8", "out_ptr": "*fp32"}, {}, (1, 2)),
            (4, qg._int4_gemv_kernel, {"w_ptr": "*u8", "out_ptr": "*fp32"}, {"GROUP": 128}, (1, 2, 4)),
        ):
            for bm in ms if defaults_only else (1, 2, 4, 8, 16):
                label = f"gemv int{bits} M<={bm} BN={bn} w={w}"
                weights[label] = 32 * bn // (32 * w)  # rows per thread x 32 weights a step
                cases.append((label, kernel, ptrs, {"BLOCK_M": bm, "BLOCK_N": bn, **extra}, {"num_warps": w}))
    return [
        (label, k, p if "default" in p else {"default": bf, **p}, c, o, weights.get(label))
        for label, k, p, c, o in cases
    ]


def _loop_sass(cubin: bytes) -> int:
    """SASS instructions of the kernel's largest loop: from the target of its widest backward branch
    to that branch (16 bytes an instruction), every path of the body counted (a GEMV's rows of x
    past M included, as when M fills BLOCK_M)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    spans = [
        (int(at, 16) - int(to, 16)) // 16 + 1
        for at, to in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?BRA\s+0x([0-9a-f]+)", text)
        if int(to, 16) < int(at, 16)
    ]
    return max(spans, default=0)


def _resources(cubin: bytes) -> dict[str, int]:
    """REG / SHARED / LOCAL (spill) figures of the cubin's kernel, via triton's cuobjdump."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    return {k.lower(): int(v) for k, v in re.findall(r"(REG|SHARED|LOCAL):(\d+)", text)}


def _compile(kernel, ptrs: dict, consts: dict, options: dict):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, attrs, consts = {}, {}, dict(consts)
    for i, name in enumerate(kernel.arg_names):
        if name in UNIT_STRIDES:
            consts[name] = 1
        if name in consts:
            sig[name] = "constexpr"
            continue
        if name.endswith("_ptr"):
            sig[name] = ptrs.get(name, ptrs["default"])
        else:
            sig[name] = "fp32" if name in FLOAT_ARGS else "i32"
        if name.endswith("_ptr") or name in ALIGNED_INTS or name.startswith("stride_"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(kernel, sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--defaults", action="store_true", help="only the wrappers' default configs")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: this checks the compiled kernels")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    failures = 0
    print(f"{'kernel / config':<44} {'regs':>5} {'spill':>6} {'shared':>8} {'mma':>6} {'sass/w':>6} {'s':>5}")
    for label, kernel, ptrs, consts, options, weights in _cases(args.defaults):
        t0 = time.perf_counter()
        try:
            compiled = _compile(kernel, ptrs, consts, options)
        except Exception as exc:  # report every config, then fail
            failures += 1
            print(f"{label:<44} FAILED {str(exc).splitlines()[-1][:120]}")
            continue
        res = _resources(compiled.asm["cubin"])
        shared = compiled.metadata.shared
        ptx = compiled.asm["ptx"]
        mma = "wgmma" if "wgmma" in ptx else "mma" if "mma.sync" in ptx else "-"
        per_weight = f"{_loop_sass(compiled.asm['cubin']) / weights:.1f}" if weights else "-"
        problems = [
            p
            for p, bad in (("SHARED OVERFLOW", shared > SHARED_LIMIT), ("SPILLS", res.get("local", 0) > 0))
            if bad
        ]
        failures += bool(problems)
        print(
            f"{label:<44} {res.get('reg', -1):>5} {res.get('local', 0):>6} {shared:>8} {mma:>6} "
            f"{per_weight:>6} {time.perf_counter() - t0:5.1f}  {' '.join(problems)}",
            flush=True,
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
