"""Weight-only quantized matmuls: int8 per output channel and int4 group-wise along K.

Layouts (docs/ARCHITECTURE.md, "Kernel contract"):
- int8: qweight int8 [N, K], scales [N]; w[n, k] = qweight[n, k] * scales[n].
- int4: qweight uint8 [N, K // 2]; byte j of row n holds k = 2j in its low nibble and k = 2j + 1 in
  its high nibble, each stored as q + 8 with q in [-8, 7]; scales [N, K // G];
  w[n, k] = q * scales[n, k // G].
The references dequantize the whole weight and run one matmul in fp32, then cast to x's dtype.
"""

import torch
import torch.nn.functional as F


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K // 2] -> int8 [N, K] of values in [-8, 7] (low nibble first)."""
    low = (qweight & 0x0F).to(torch.int8) - 8
    high = (qweight >> 4).to(torch.int8) - 8
    return torch.stack((low, high), dim=-1).reshape(qweight.shape[0], qweight.shape[1] * 2)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int [N, K] of values in [-8, 7], K even -> uint8 [N, K // 2] (the inverse of unpack_int4)."""
    if q.shape[-1] % 2:
        raise ValueError(f"int4 packing needs an even K, got K={q.shape[-1]}")
    if q.numel() and (int(q.min()) < -8 or int(q.max()) > 7):
        raise ValueError("int4 values must lie in [-8, 7]")
    biased = (q.to(torch.int16) + 8).to(torch.uint8)
    return biased[:, 0::2] | (biased[:, 1::2] << 4)


def int8_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (qweight int8 [N, K] * scales [N, None]).T -> [M, N] in x's dtype."""
    w = qweight.float() * scales.float()[:, None]  # [N, K]
    return (x.float() @ w.T).to(x.dtype)


def int4_matmul(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int
) -> torch.Tensor:
    """x [M, K] @ dequant(qweight uint8 [N, K // 2], scales [N, K // G]).T -> [M, N] in x's dtype."""
    q = unpack_int4(qweight).float()  # [N, K]
    n, k = q.shape
    w = (q.view(n, k // group_size, group_size) * scales.float()[:, :, None]).view(n, k)
    return (x.float() @ w.T).to(x.dtype)


# Dynamic int8 activations (the CPU kernels, kernels/cpu/quant.h): each row of x is quantized per block
# of `block` k to int8 (scale max |x| / 127, ties to even), the block's integer dot products with the
# weights' integers are exact, and the scales multiply each block's sum. INT8_ACT_BLOCK is the block of
# an int8 matrix; an int4 matrix's is its group size.
INT8_ACT_BLOCK = 128


def quantize_rows(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x fp32 [M, K] -> (q int8 [M, K], scales fp32 [M, ceil(K / block)]): per block of `block` k (the
    last one partial), q = round(x * (127 / max |x|)) to nearest even, scale = max |x| / 127 (an all-zero
    block: q 0, scale 0)."""
    m, k = x.shape
    nb = -(-k // block)
    padded = torch.zeros(m, nb * block, dtype=torch.float32)
    padded[:, :k] = x.float()
    blocks = padded.view(m, nb, block)
    top = blocks.abs().amax(dim=-1, keepdim=True)  # [M, nb, 1]
    inv = torch.where(top > 0, 127.0 / top, torch.zeros_like(top))
    q = torch.round(blocks * inv).to(torch.int8).view(m, nb * block)[:, :k]
    return q.contiguous(), (top / 127.0).squeeze(-1)


def _block_dots(q_x: torch.Tensor, q_w: torch.Tensor, block: int) -> torch.Tensor:
    """Exact integer dot products per block: [M, K], [N, K] -> float64 [M, N, nb]."""
    m, k = q_x.shape
    nb = -(-k // block)
    pad = nb * block - k
    xs = F.pad(q_x.double(), (0, pad)).view(m, nb, block)
    ws = F.pad(q_w.double(), (0, pad)).view(q_w.shape[0], nb, block)
    return torch.einsum("mbk,nbk->mnb", xs, ws)  # integers below 2^53: exact in float64


def int8_dynamic_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """What the CPU int8 kernel computes, in float64 then fp32: x [M, K] quantized per block of
    INT8_ACT_BLOCK, times qweight int8 [N, K] with scales [N] -> fp32 [M, N] (+ bias [N])."""
    q_x, s_x = quantize_rows(x, INT8_ACT_BLOCK)
    dots = _block_dots(q_x, qweight, INT8_ACT_BLOCK)  # [M, N, nb]
    y = (dots * s_x.double()[:, None, :]).sum(-1) * scales.double()[None, :]
    if bias is not None:
        y = y + bias.double()
    return y.float()


def int4_dynamic_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
                        bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """What the CPU int4 kernel computes, in float64 then fp32: x [M, K] quantized per group of
    group_size, times qweight uint8 [N, K // 2] with scales [N, K // G] -> fp32 [M, N] (+ bias [N])."""
    q_x, s_x = quantize_rows(x, group_size)
    dots = _block_dots(q_x, unpack_int4(qweight), group_size)  # [M, N, K // G]
    y = (dots * s_x.double()[:, None, :] * scales.double()[None, :, :]).sum(-1)
    if bias is not None:
        y = y + bias.double()
    return y.float()


def dynamic_rounding_bound(x: torch.Tensor, w: torch.Tensor, block: int) -> torch.Tensor:
    """A bound on |x w^T - q(x) w^T| for x [M, K] quantized per block (quantize_rows) and any weight w
    fp32 [N, K]: each |x - q(x) * scale| is at most half its block's scale, so the error of output
    (m, n) is at most sum over blocks b of scale[m, b] / 2 * sum over k in b of |w[n, k]|. -> [M, N]."""
    m, k = x.shape
    _, s_x = quantize_rows(x, block)
    nb = s_x.shape[1]
    w_abs = F.pad(w.double().abs(), (0, nb * block - k)).view(w.shape[0], nb, block).sum(-1)  # [N, nb]
    return (s_x.double() / 2) @ w_abs.T
