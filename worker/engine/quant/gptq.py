"""GPTQ for group-wise symmetric int4 (Frantar et al., 2022), written from the paper's algorithm.

Given a layer's weight W [N, K] and the Hessian of its reconstruction error H = 2/n sum_t x_t x_t^T
[K, K] over calibration activations x_t, columns are quantized one by one; each column's rounding
error is spread onto the not yet quantized columns through the upper Cholesky factor of H^-1, so the
layer's output error ||X W^T - X Q^T|| is what gets minimized, not the weight error.

Group scales: without act-order, group g's scales are taken from the error-updated columns when the
sweep reaches the group's first column (the paper's variant). With act-order (columns visited by
decreasing diag(H)) the scales are fixed up front from the original weight ("static groups"), so
the result still fits freight's [N, K // G] scale layout indexed by the original column.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.engine.quant.formats import check_group_size, fp16_scales, int4_group_scales


class HessianAccumulator:
    """Running H = 2/n * X^T X over the rows fed to one Linear (float64 [K, K] on the CPU)."""

    def __init__(self, in_features: int) -> None:
        self.in_features = in_features
        self.hessian = torch.zeros(in_features, in_features, dtype=torch.float64)
        self.rows = 0

    def add(self, x: torch.Tensor) -> None:
        """x: [..., K] activations entering the layer."""
        x = x.reshape(-1, x.shape[-1]).to(device="cpu", dtype=torch.float64)
        if x.shape[1] != self.in_features:
            raise ValueError(f"activation width {x.shape[1]} != layer input {self.in_features}")
        n = x.shape[0]
        if n == 0:
            return
        total = self.rows + n
        self.hessian *= self.rows / total
        self.hessian += (2.0 / total) * (x.T @ x)
        self.rows = total


@dataclass(frozen=True)
class GPTQConfig:
    group_size: int = 128
    damp: float = 0.01  # fraction of mean(diag(H)) added to the diagonal before inverting
    act_order: bool = False
    block_size: int = 128  # columns updated lazily together (speed only, same result)

    def __post_init__(self) -> None:
        if not 0.0 < self.damp < 1.0:
            raise ValueError(f"GPTQ dampening must be in (0, 1), got {self.damp}")
        if self.block_size < 1:
            raise ValueError(f"GPTQ block size must be positive, got {self.block_size}")


def _inverse_cholesky(hessian: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp * mean(diag H) * I)^-1, float64 [K, K]."""
    h = hessian.clone()
    h.diagonal().add_(damp * h.diagonal().mean())
    lower = torch.linalg.cholesky(h)
    return torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True)


def gptq_quantize_int4(
    weight: torch.Tensor, hessian: torch.Tensor, config: GPTQConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize W [N, K] with Hessian [K, K]: (q int8 [N, K] in [-8, 7], scales fp32 [N, K // G]).

    Both outputs are indexed by the original column order.
    """
    n, k = weight.shape
    g = config.group_size
    check_group_size(k, g)
    if hessian.shape != (k, k):
        raise ValueError(f"Hessian shape {tuple(hessian.shape)} does not match weight input {k}")
    w = weight.detach().to(device="cpu", dtype=torch.float32).clone()
    h = hessian.to(torch.float64).clone()
    dead = h.diagonal() == 0  # inputs never active: any value is exact, zero them
    h[dead, dead] = 1.0
    w[:, dead] = 0.0

    static_scales = int4_group_scales(w, g) if config.act_order else None
    perm = torch.argsort(h.diagonal(), descending=True) if config.act_order else torch.arange(k)
    w = w[:, perm]
    h = h[perm][:, perm]
    hinv = _inverse_cholesky(h, config.damp).float()  # factorised in float64, swept in float32

    q_perm = torch.zeros(n, k)
    scales = torch.zeros(n, k // g) if static_scales is None else static_scales
    block = -(-config.block_size // g) * g  # a multiple of G: a group never spans two blocks
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        w_blk = w[:, b0:b1].clone()
        err_blk = torch.zeros_like(w_blk)
        hinv_blk = hinv[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i
            orig = int(perm[col])
            if static_scales is None and col % g == 0:
                # scales of the group starting here, from the error-updated columns
                scales[:, col // g] = fp16_scales(w_blk[:, i : i + g].abs().amax(dim=1).clamp(min=1e-8) / 7.0)
            s = scales[:, orig // g]
            x = w_blk[:, i]
            q = torch.clamp(torch.round(x / s), -8, 7)
            q_perm[:, col] = q
            e = (x - q * s) / hinv_blk[i, i]
            w_blk[:, i:] -= e[:, None] * hinv_blk[i, i:][None, :]
            err_blk[:, i] = e
        w[:, b1:] -= err_blk @ hinv[b0:b1, b1:]

    q = torch.empty_like(q_perm)
    q[:, perm] = q_perm
    return q.to(torch.int8), scales
