"""Split-K for the quantized matmuls: when the output tiles alone cannot fill the GPU, programs also
split K, each writing fp32 partial sums of its K range to its own [M, N] slice; one sum over the
slices finishes the product."""

import torch
import triton


def split_k_bounds(k_units: int, step: int, split_k: int) -> tuple[int, int]:
    """(K units per split, a multiple of the kernel's loop step; the number of splits that get work)
    for at most `split_k` splits of `k_units` (elements, or packed bytes for int4)."""
    per_split = triton.cdiv(triton.cdiv(k_units, split_k), step) * step
    return per_split, triton.cdiv(k_units, per_split)


def split_k_out(x: torch.Tensor, n: int, splits: int) -> torch.Tensor:
    """The kernel's output [splits, M, N]: fp32 partial sums with a K split, else x's dtype."""
    return torch.empty((splits, x.shape[0], n), device=x.device, dtype=torch.float32 if splits > 1 else x.dtype)


def sum_splits(out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[splits, M, N] -> [M, N] in `dtype`: the sum over the splits (a view of the only one)."""
    return out[0] if out.shape[0] == 1 else out.sum(0).to(dtype)
