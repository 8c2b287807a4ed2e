"""Weight-only quantized matmuls: int8 per output channel and int4 group-wise along K.

Layouts (docs/ARCHITECTURE.md, "Kernel contract"):
- int8: qweight int8 [N, K], scales [N]; w[n, k] = qweight[n, k] * scales[n].
- int4: qweight uint8 [N, K // 2]; byte j of row n holds k = 2j in its low nibble and k = 2j + 1 in
  its high nibble, each stored as q + 8 with q in [-8, 7]; scales [N, K // G];
  w[n, k] = q * scales[n, k // G].
The references dequantize the whole weight and run one matmul in fp32, then cast to x's dtype.
"""

import torch


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
