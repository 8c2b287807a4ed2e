"""RMS normalisation with an optional fused residual add."""

import torch


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [H] -> (normed [T, H], residual_out [T, H]).

    With a residual, x = x + residual first and residual_out is that sum; otherwise residual_out is x.
    Statistics are computed in fp32 whatever the input dtype.
    """
    if residual is not None:
        x = x + residual
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)
    out = (xf * torch.rsqrt(variance + eps)).to(x.dtype) * weight
    return out, x
