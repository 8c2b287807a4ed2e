"""Applying packed allowed-token bitmasks to logits in place (Triton). Same signature and result as
kernels.reference.token_bitmask.apply_token_bitmask_: logits row rows[j] gets -inf at every token
whose bit in bitmask row j is clear (bit t % 32 of int32 word t // 32), and past the mask's width.
One program per (bitmask row, vocabulary block): it reads BLOCK_V / 32 words once and writes only
the disallowed positions, so the logits' traffic is a read of the block and a masked store."""

import torch
import triton
import triton.language as tl

from kernels.checks import check_tensor
from kernels.triton.launch import check_launchable


@triton.jit
def _apply_token_bitmask_kernel(
    logits_ptr,  # [N, V], row stride stride_l
    bitmask_ptr,  # int32 [M, W], row stride stride_b
    rows_ptr,  # int64 [M]
    vocab,
    words,
    stride_l,
    stride_b,
    BLOCK_V: tl.constexpr,
):
    j = tl.program_id(0)
    block = tl.program_id(1)
    row = tl.load(rows_ptr + j)
    offs = block * BLOCK_V + tl.arange(0, BLOCK_V)
    word = offs // 32
    bits = tl.load(bitmask_ptr + j * stride_b + word, mask=(offs < vocab) & (word < words), other=0)
    allowed = ((bits >> (offs % 32)) & 1) != 0
    blocked = (offs < vocab) & ~allowed
    tl.store(logits_ptr + row * stride_l + offs, float("-inf"), mask=blocked)


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """logits float [N, V] (modified in place; last dim contiguous); bitmask int32 [M, W]; rows int64
    [M]: the logits row each bitmask row applies to. Rows not listed are left alone."""
    check_tensor("logits", logits, ndim=2)
    check_tensor("bitmask", bitmask, ndim=2, dtypes=(torch.int32,))
    check_tensor("rows", rows, ndim=1, dtypes=(torch.int64,))
    if logits.stride(1) != 1 or bitmask.stride(1) != 1:
        raise ValueError("logits and bitmask must have a contiguous last dimension")
    if rows.shape[0] != bitmask.shape[0]:
        raise ValueError(f"rows has {rows.shape[0]} entries for {bitmask.shape[0]} bitmask rows; give one each")
    check_launchable(_apply_token_bitmask_kernel, logits.device)
    m, vocab = rows.shape[0], logits.shape[1]
    if not m:
        return
    block = 1024
    grid = (m, triton.cdiv(vocab, block))
    _apply_token_bitmask_kernel[grid](logits, bitmask, rows, vocab, bitmask.shape[1], logits.stride(0),
                                      bitmask.stride(0), BLOCK_V=block)  # fmt: skip
