"""The BLAS sgemm torch's CPU build links (MKL on x86-64 wheels), for C kernels to call directly.

torch's F.linear on fp32 CPU tensors ends in the Fortran BLAS symbol `sgemm_`; libtorch_cpu exports
it. A C kernel handed its address multiplies with exactly the GEMM F.linear uses (the same floats)
without a Python round trip per matmul. Its integer arguments are passed as pointers to int64 values
below 2^31, which an LP64 BLAS (32-bit integers, read from the low half on a little-endian machine)
and an ILP64 one read alike. The address is only handed out after a small product through it matched
F.linear's; otherwise None, and callers keep to their own GEMVs or to torch.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

_SGEMM_ARGS = [ctypes.c_char_p, ctypes.c_char_p] + [ctypes.c_void_p] * 11


@functools.cache
def torch_sgemm() -> int | None:
    """The address of torch's `sgemm_`, or None where it is not found or does not compute F.linear."""
    if sys.byteorder != "little":
        return None
    lib_dir = Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
        path = lib_dir / name
        if not path.exists():
            continue
        try:
            fn = ctypes.CDLL(str(path)).sgemm_
        except (OSError, AttributeError):
            return None
        fn.argtypes, fn.restype = _SGEMM_ARGS, None
        return ctypes.cast(fn, ctypes.c_void_p).value if _agrees(fn) else None
    return None


def _agrees(fn) -> bool:
    """y = x w^T through fn, column-major, against F.linear, on a 3 x 5 x 7 product."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 7, generator=gen), torch.randn(5, 7, generator=gen)
    y = torch.full((3, 5), float("nan"))

    def i(v: int):
        return ctypes.byref(ctypes.c_int64(v))

    def f(v: float):
        return ctypes.byref(ctypes.c_float(v))

    fn(b"T", b"N", i(5), i(3), i(7), f(1.0), ctypes.c_void_p(w.data_ptr()), i(7), ctypes.c_void_p(x.data_ptr()), i(7),
       f(0.0), ctypes.c_void_p(y.data_ptr()), i(5))  # fmt: skip
    return bool(torch.allclose(y, F.linear(x, w), atol=1e-5, rtol=1e-5))
