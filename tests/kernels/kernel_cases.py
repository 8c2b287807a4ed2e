"""Inputs for the kernel tests: random (never zeros), and poisoned output buffers."""

import torch


def randn(*shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    """Normal values shifted off zero so an all-zero (unwritten) result cannot pass."""
    t = torch.randn(*shape, dtype=torch.float32) * scale
    return (t + 0.05 * torch.sign(t) * scale).to(dtype)


def poisoned(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A buffer full of NaN: any element a kernel forgets to write fails the comparison."""
    return torch.full(shape, float("nan"), dtype=dtype)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float = 0.0) -> None:
    """Element-wise closeness that never lets NaN through (NaN != NaN in both tensors)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert not torch.isnan(actual).any(), "output holds NaN: some element was not written"
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)
