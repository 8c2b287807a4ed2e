"""What the paged-attention C kernels' wrappers share: loading `<name>_f32` and `<name>_supports`
from the compiled source, the check that tensors fit, and the checks of the caller's out / lse / options."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import ClassVar

import torch

from kernels.attention_options import AttentionOptions
from kernels.cpu.build import load_library

PTR, I64, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


def reject_sinks(options: AttentionOptions) -> None:
    """The C kernels apply no sinks: their caller scales the output by the returned log-sum-exp
    (kernels.reference.attention.apply_sinks), as worker/engine/backends/cpu_backend.py does."""
    if options.sinks is not None:
        raise ValueError("the C attention kernels take no sinks: pass lse and apply them with apply_sinks")


class PagedAttentionKernel:
    """A compiled kernel, loaded once per instance (the build is cached on disk). Subclasses name
    their C source and the argument types of `<name>_f32`, which returns 0, -1 for sizes it does not
    fit, -2 when out of memory."""

    source: ClassVar[Path]
    argtypes: ClassVar[list]

    def __init__(self) -> None:
        lib = load_library(self.source)
        fn = getattr(lib, f"{self.source.stem}_f32")
        fn.restype = ctypes.c_int
        fn.argtypes = self.argtypes
        fits = getattr(lib, f"{self.source.stem}_supports")
        fits.restype = ctypes.c_int
        fits.argtypes = [I64, I64, I64, I64]
        self._fn, self._fits = fn, fits

    def supports(self, q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        """Whether these tensors fit the kernel: fp32 on the CPU, contiguous caches, head rows of q
        contiguous, head sizes it was compiled for. Otherwise use the torch reference."""
        num_heads, head_dim = q.shape[1], q.shape[2]
        return (
            q.device.type == "cpu"
            and q.dtype == k_cache.dtype == torch.float32
            and k_cache.is_contiguous()
            and q.stride(2) == 1
            and q.stride(1) == head_dim
            and bool(self._fits(num_heads, k_cache.shape[2], head_dim, k_cache.shape[1]))
        )

    def _outputs(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor | None,
        lse: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        """Checks the inputs and the caller's out / lse (raising ValueError with what to fix); returns
        out, allocated when None."""
        if not self.supports(q, k_cache) or not v_cache.is_contiguous():
            raise ValueError(f"{type(self).__name__} needs fp32 CPU tensors with contiguous caches and head rows")
        if out is None:
            out = torch.empty(q.shape, dtype=torch.float32)
        if not (out.is_contiguous() and out.dtype == torch.float32 and out.shape == q.shape):
            raise ValueError("out must be a contiguous fp32 tensor shaped like q")
        rows, num_heads = q.shape[0], q.shape[1]
        if lse is not None and not (lse.is_contiguous() and lse.dtype == torch.float32 and lse.numel() == rows * num_heads):
            raise ValueError(f"lse must be a contiguous fp32 [{rows}, {num_heads}] tensor (a row per query, a column per head)")
        return out

    def _check(self, status: int) -> None:
        if status == -2:
            raise MemoryError(f"{self.source.stem}_f32 could not allocate its scratch buffers")
        if status != 0:
            raise ValueError(f"{self.source.stem}_f32 refused these sizes (status {status})")
