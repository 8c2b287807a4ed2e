"""Round-to-nearest int8 / int4: error bounds, exact layouts, and the quantized Linear modules."""

from __future__ import annotations

import pytest
import torch

from kernels.reference.quant_matmul import INT8_ACT_BLOCK, dynamic_rounding_bound
from worker.engine.quant import Int4Linear, Int8Linear
from worker.engine.quant.formats import (
    check_group_size,
    dequantize_int4,
    dequantize_int8,
    pack_int4,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)


def _weight(n: int = 96, k: int = 256, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[3, 17] = 0.9  # an outlier: its row's (group's) scale grows, others must not
    return w


def test_int8_error_is_at_most_half_a_step_per_channel() -> None:
    w = _weight()
    q, scales = quantize_int8(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and scales.shape == (w.shape[0],)
    torch.testing.assert_close(scales, w.abs().amax(dim=1) / 127)
    err = (dequantize_int8(q, scales) - w).abs()
    assert bool((err <= scales[:, None] / 2 + 1e-7).all())
    assert int(q.abs().max()) == 127  # every row's largest weight maps to +-127
    assert float(err[4].max()) < float(scales[3]) / 2  # the outlier row does not widen row 4's step


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_error_is_at_most_half_a_step_per_group(group_size: int) -> None:
    w = _weight()
    qweight, scales = quantize_int4(w, group_size)
    assert qweight.dtype == torch.uint8 and qweight.shape == (96, 128)
    assert scales.shape == (96, 256 // group_size)
    full = scales.repeat_interleave(group_size, dim=1)
    deq = dequantize_int4(qweight, scales, group_size)
    assert bool(((deq - w).abs() <= full / 2 + 1e-7).all())
    q = unpack_int4(qweight)
    assert int(q.min()) >= -7 and int(q.max()) == 7  # symmetric: +-7 used, -8 only by rounding ties
    # rounding error is ~uniform over a step: its RMS is about step / sqrt(12)
    err_rms = float((deq - w).pow(2).mean().sqrt())
    assert err_rms <= 1.1 * float(full.pow(2).mean().div(12).sqrt())


def test_int4_nibble_order_matches_the_kernel_contract() -> None:
    q = torch.tensor([[-8, 7, 0, -1]], dtype=torch.int8)
    packed = pack_int4(q)
    # byte 0: k=0 low (-8+8=0), k=1 high (7+8=15) -> 0xF0; byte 1: k=2 low 8, k=3 high 7 -> 0x78
    assert packed.tolist() == [[0xF0, 0x78]]
    assert torch.equal(unpack_int4(packed), q)


def test_group_size_must_be_allowed_and_divide_k() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        check_group_size(96, 64)
    with pytest.raises(ValueError, match="not supported"):
        check_group_size(256, 48)
    with pytest.raises(ValueError, match="does not divide"):
        quantize_int4(torch.randn(8, 96), 128)


@pytest.mark.parametrize("bias", [False, True])
def test_quantized_linear_matches_dequantized_weights(bias: bool) -> None:
    """Each CPU path: the weights' exact product; the integer kernel against its torch reference (the
    same math in float64) to fp32 rounding, and against the exact product within the bound the
    activations' int8 rounding allows."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 64, bias=bias).requires_grad_(False)
    x = torch.randn(3, 5, 256)  # any leading shape
    for module, deq, block in (
        (m8 := Int8Linear.from_linear(linear), lambda: dequantize_int8(m8.qweight, m8.scales), INT8_ACT_BLOCK),
        (m4 := Int4Linear.from_linear(linear, 64), lambda: dequantize_int4(m4.qweight, m4.scales, 64), 64),
    ):
        want = x @ deq().T + (linear.bias if bias else 0)
        module.cpu_path = "weight_only"
        torch.testing.assert_close(module(x), want, atol=1e-5, rtol=1e-5)
        module.cpu_path = "dynamic"
        dynamic = module(x)
        module.cpu_path = "kernel"
        fast = module(x)
        assert fast.shape == want.shape and fast.dtype == x.dtype
        torch.testing.assert_close(fast, dynamic, atol=1e-5, rtol=1e-5)
        bound = dynamic_rounding_bound(x.reshape(-1, 256), deq(), block).view(3, 5, 64)
        assert bool(((fast - want).abs() <= bound + 1e-5).all())
        assert set(dict(module.state_dict())) == {"qweight", "scales"} | ({"bias"} if bias else set())
        assert module(torch.empty(0, 256)).shape == (0, 64)


@pytest.mark.parametrize("bits", [8, 4])
def test_cpu_repack_follows_new_weights(bits: int) -> None:
    torch.manual_seed(1)
    a, b = torch.nn.Linear(128, 32, bias=True), torch.nn.Linear(128, 32, bias=True)
    make = Int8Linear.from_linear if bits == 8 else lambda lin: Int4Linear.from_linear(lin, 32)
    module = make(a)
    x = torch.randn(2, 128)
    first = module(x)
    src = make(b)
    with torch.no_grad():
        module.qweight.copy_(src.qweight)  # what a loader does: write in place
        module.scales.copy_(src.scales)
        module.bias.copy_(src.bias)
    torch.testing.assert_close(module(x), src(x))
    assert not torch.allclose(first, module(x))
