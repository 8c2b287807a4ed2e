"""Wide CPU matmuls (prefill chunks, decode steps of many rows) in int8 and int4: freight's integer
kernel (kernels/cpu/quant.h) against fp32 (torch's sgemm, and the packed tiles of gemm.h that the
decode stack multiplies with) and against torch's own int8 GEMMs (`torch.ops.quantized.linear_dynamic`
on its FBGEMM, oneDNN and x86 engines), one thread, same run.

    PYTHONPATH=. .venv/bin/python bench/cpu_quant_gemm.py
    PYTHONPATH=. .venv/bin/python bench/cpu_quant_gemm.py --rows 16,128,512,2048 --repeats 7

Shapes: the medium demo model's (bench/llama_cpp_decode.py: hidden 512, MLP 1536, GQA 8/4) qkv,
gate_up and down, and the 4096-wide layer of a 7B model. Every product takes fp32 rows and gives fp32
rows: freight's quantizes each row per block to int8 (per-channel int8 weights; int4 in groups of 32),
torch's quantizes the whole x per tensor (FBGEMM and x86 to 7 bits: reduce_range), so their products
are not the same numbers; the table is about speed. Times: the calling thread's CPU time, best of
--repeats (a shared machine's other tenants inflate wall time, not this).
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch.nn.functional as F

from kernels.cpu.decode_stack import pack_rows
from kernels.cpu.gemv import NativeGemv
from kernels.cpu.quant_matmul import NativeQuantMatmul, pack_int4, pack_int8
from kernels.reference.quant_matmul import pack_int4 as pack_nibbles

SHAPES = ((1024, 512, "qkv"), (3072, 512, "gate_up"), (512, 1536, "down"), (4096, 4096, "7B attention"))
ENGINES = ("fbgemm", "onednn", "x86")


def best_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="16,64,128,512", help="rows per product (M), comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    native, gemv = NativeQuantMatmul(), NativeGemv()
    engines = [e for e in ENGINES if e in torch.backends.quantized.supported_engines]
    print(f"freight's integer kernel: {native.isa}; torch {torch.__version__}, quantized engines {engines}")
    head = f"{'layer':>16} {'N x K':>11} {'M':>5} {'sgemm':>7} {'packed':>7} {'int8':>7} {'int4':>7} " + \
           " ".join(f"{'t-' + e:>8}" for e in engines) + f" {'int8/fp32':>10} {'int4/fp32':>10} " + \
           " ".join(f"{'t-' + e + '/fp32':>14}" for e in engines)  # fmt: skip
    print("ms per product (thread CPU time); /fp32: the best fp32 (sgemm or packed) time over the other's\n" + head)
    for n, k, name in SHAPES:
        w = torch.randn(n, k) * k**-0.5
        s8 = w.abs().amax(dim=1) / 127
        q8 = torch.round(w / s8[:, None]).clamp(-127, 127).to(torch.int8)
        s4 = w.view(n, k // 32, 32).abs().amax(-1) / 7
        q4 = torch.round(w / s4.repeat_interleave(32, dim=1)).clamp(-8, 7)
        p8, p4 = pack_int8(q8, s8), pack_int4(pack_nibbles(q4), s4, 32)
        packed = pack_rows(w, gemv.pack_width)
        torch_packed = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensors' creation functions are deprecated
            for e in engines:
                torch.backends.quantized.engine = e
                qw = torch.quantize_per_channel(w, s8.double(), torch.zeros(n, dtype=torch.long), 0, torch.qint8)
                torch_packed[e] = torch.ops.quantized.linear_prepack(qw, None)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k)
            sgemm = best_ms(lambda: F.linear(x, w), args.repeats)  # noqa: B023 (called before the next iteration)
            tiles = best_ms(lambda: gemv.packed(x, packed, n), args.repeats)  # noqa: B023
            i8 = best_ms(lambda: native(x, p8), args.repeats)  # noqa: B023
            i4 = best_ms(lambda: native(x, p4), args.repeats)  # noqa: B023
            theirs = []
            for e in engines:
                torch.backends.quantized.engine = e
                theirs.append(best_ms(lambda: torch.ops.quantized.linear_dynamic(x, torch_packed[e], True),  # noqa: B023
                                      args.repeats))  # fmt: skip
            fp32 = min(sgemm, tiles)
            print(f"{name:>16} {f'{n} x {k}':>11} {m:>5} {sgemm:>7.2f} {tiles:>7.2f} {i8:>7.2f} {i4:>7.2f} "
                  + " ".join(f"{t:>8.2f}" for t in theirs)
                  + f" {fp32 / i8:>9.2f}x {fp32 / i4:>9.2f}x " + " ".join(f"{fp32 / t:>13.2f}x" for t in theirs),
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
