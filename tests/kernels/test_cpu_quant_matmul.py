"""The CPU integer matmuls (kernels/cpu/quant.h) against their torch references.

Two references: int8_dynamic_matmul / int4_dynamic_matmul compute what the kernel computes (the rows
quantized per block, exact integer block sums, the scales) in float64, so the kernel must match them
to its fp32 rounding; and the weight-only references (dequantize, one fp32 matmul), which the kernel
must match within the bound the activations' int8 rounding allows (dynamic_rounding_bound). Shapes
are odd on purpose: K not a multiple of the 4 or 8 k of a step nor of the 128-k block, N not a
multiple of the 64-row tile, every row count 1-17 (the register tiles' sizes and their remainders).
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
from kernel_cases import randn

from kernels.cpu.build import KernelBuildError
from kernels.cpu.quant_matmul import PACK_WIDTH, NativeQuantMatmul, pack_int4, pack_int8
from kernels.reference import quant_matmul as ref
from kernels.reference.quant_matmul import INT8_ACT_BLOCK

EPS32 = 2.0**-24  # fp32 unit roundoff


@pytest.fixture(scope="module")
def native() -> NativeQuantMatmul:
    return NativeQuantMatmul()


def _int8(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = randn(n, k)
    scales = w.abs().amax(dim=1) / 127
    return torch.clamp(torch.round(w / scales[:, None]), -127, 127).to(torch.int8), scales


def _int4(n: int, k: int, group: int, half: bool) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.randint(-8, 8, (n, k), dtype=torch.int8)
    scales = torch.rand(n, k // group) * 0.1 + 0.01
    return ref.pack_int4(q), scales.half().float() if half else scales


def _block_magnitude(x: torch.Tensor, w: torch.Tensor, block: int) -> torch.Tensor:
    """sum over blocks of |scale_b * block dot| (float64 [M, N]): what the fp32 accumulation rounds."""
    q, s = ref.quantize_rows(x, block)
    m, k = x.shape
    nb = s.shape[1]
    xs = torch.nn.functional.pad(q.double(), (0, nb * block - k)).view(m, nb, block)
    ws = torch.nn.functional.pad(w.double(), (0, nb * block - k)).view(w.shape[0], nb, block)
    return (torch.einsum("mbk,nbk->mnb", xs, ws).abs() * s.double()[:, None, :]).sum(-1)


def _check(y: torch.Tensor, want: torch.Tensor, magnitude: torch.Tensor, nb: int, bias: torch.Tensor | None) -> None:
    """|y - want| within the fp32 rounding of nb fused multiply-adds, a scale product and the bias."""
    assert not torch.isnan(y).any()
    slack = (nb + 3) * EPS32 * (magnitude + (0 if bias is None else bias.double().abs()[None, :]))
    assert ((y.double() - want.double()).abs() <= slack + 1e-30).all(), float((y.double() - want.double()).abs().max())


@pytest.mark.parametrize("k", [7, 130, 257, 1000])
def test_activation_rows_quantize_as_the_reference(native, k: int) -> None:
    x = randn(9, k) * torch.linspace(0.01, 100, k)  # blocks of very different ranges
    x[3] = 0  # an all-zero row: scale 0, q 0
    x[5, : min(k, INT8_ACT_BLOCK)] = 0  # an all-zero block
    x[6, ::3] = 0.5 * x[6, 1]  # ties at the rounding threshold are rare; exact values repeat
    for block in (32, 64, INT8_ACT_BLOCK):
        q, scale, total = native.quantize_rows(x, block)
        want_q, want_scale = ref.quantize_rows(x, block)
        assert torch.equal(q, want_q) and torch.equal(scale, want_scale)
        nb = want_scale.shape[1]
        padded = torch.nn.functional.pad(want_q.int(), (0, nb * block - k)).view(9, nb, block)
        assert torch.equal(total, padded.sum(-1).int())


@pytest.mark.parametrize("rows", range(1, 18))
@pytest.mark.parametrize(("n", "k"), [(1, 7), (70, 130), (200, 257)])
def test_int8_matches_the_references(native, rows: int, n: int, k: int) -> None:
    x, (q, scales) = randn(rows, k), _int8(n, k)
    bias = randn(n) if rows % 2 else None
    y = native(x, pack_int8(q, scales), bias)
    want = ref.int8_dynamic_matmul(x, q, scales, bias)
    magnitude = _block_magnitude(x, q.float(), INT8_ACT_BLOCK) * scales.double()[None, :]
    _check(y, want, magnitude, -(-k // INT8_ACT_BLOCK), bias)
    w = q.float() * scales[:, None]
    weight_only = ref.int8_matmul(x, q, scales) + (0 if bias is None else bias)
    bound = ref.dynamic_rounding_bound(x, w, INT8_ACT_BLOCK)  # + the fp32 matmul's own rounding:
    assert ((y.double() - weight_only.double()).abs() <= bound + 1e-5 * (1 + weight_only.double().abs())).all()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 16, 17])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("half", [False, True])
def test_int4_matches_the_references(native, rows: int, group: int, half: bool) -> None:
    n, k = 130, 3 * group  # 3 groups; 130 rows: a cut third tile
    x, (qweight, scales) = randn(rows, k), _int4(n, k, group, half)
    bias = randn(n) if rows % 2 else None
    packed = pack_int4(qweight, scales, group)
    assert packed.scales.dtype == (torch.float16 if half else torch.float32)
    y = native(x, packed, bias)
    want = ref.int4_dynamic_matmul(x, qweight, scales, group, bias)
    w = ref.unpack_int4(qweight).float() * scales.repeat_interleave(group, dim=1)
    _check(y, want, _block_magnitude(x, w, group), k // group, bias)
    weight_only = ref.int4_matmul(x, qweight, scales, group) + (0 if bias is None else bias)
    bound = ref.dynamic_rounding_bound(x, w, group)
    assert ((y.double() - weight_only.double()).abs() <= bound + 1e-5 * (1 + weight_only.double().abs())).all()


def test_threads_split_tiles_and_give_the_same_floats(native) -> None:
    x, (q, scales) = randn(5, 1000), _int8(1100, 1000)
    q4, s4 = _int4(1100, 1024, 32, half=True)
    x4 = randn(5, 1024)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native(x, pack_int8(q, scales)), native(x4, pack_int4(q4, s4, 32))
        torch.set_num_threads(3)  # three threads even on two cores: uneven tile shares
        three = native(x, pack_int8(q, scales)), native(x4, pack_int4(q4, s4, 32))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], three[0]) and torch.equal(one[1], three[1])


def test_out_rows_with_a_stride_and_bad_inputs(native) -> None:
    q, scales = _int8(64, 96)
    packed = pack_int8(q, scales)
    wide = randn(4, 200)
    x = wide[:, 10:106]  # rows 200 floats apart
    assert torch.equal(native(x, packed), native(x.contiguous(), packed))
    with pytest.raises(ValueError, match="fp32 CPU rows"):
        native(x.double(), packed)
    with pytest.raises(ValueError, match="fp32 CPU rows"):
        native(randn(4, 95), packed)
    with pytest.raises(ValueError, match="bias"):
        native(x, packed, randn(63))


def test_packed_layouts() -> None:
    """int8: byte (t, s, i, j) = q[64 t + i, 4 s + j] + 128; int4: the low nibble k = 8 s + j, the high
    one 8 s + 4 + j, each q + 8; zero weights past N and K; int4 scales [t, group, i]."""
    q, scales = _int8(70, 10)
    p = pack_int8(q, scales)
    assert p.data.shape == (2, 3, PACK_WIDTH, 4) and p.scales.shape == (128,)
    for t, s, i, j in [(0, 0, 0, 0), (0, 2, 5, 1), (1, 1, 3, 3), (0, 1, 63, 2)]:
        assert int(p.data[t, s, i, j]) == int(q[64 * t + i, 4 * s + j]) + 128
    assert (p.data[:, 2, :, 2:] == 128).all() and (p.data[1, :, 6:] == 128).all()  # k 10, 11; rows 70..127
    qweight, s4 = _int4(70, 64, 32, half=False)
    u = ref.unpack_int4(qweight).int() + 8
    p4 = pack_int4(qweight, s4, 32)
    assert p4.data.shape == (2, 8, PACK_WIDTH, 4) and p4.scales.shape == (2, 2, PACK_WIDTH)
    for t, s, i, j in [(0, 0, 0, 0), (0, 7, 9, 3), (1, 4, 5, 1)]:
        byte = int(p4.data[t, s, i, j])
        assert byte & 15 == int(u[64 * t + i, 8 * s + j]) and byte >> 4 == int(u[64 * t + i, 8 * s + 4 + j])
        assert float(p4.scales[t, (8 * s) // 32, i]) == float(s4[64 * t + i, (8 * s) // 32])
    assert (p4.data[1, :, 6:] == 0x88).all()


def _x86_cpu_flags() -> set[str]:
    try:
        line = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        return set()
    return set(line.split(":", 1)[1].split())


# the narrower instruction sets this CPU also runs, as compiler flags after -march=native
NARROWER = {"avx-vnni": ("-mno-avx512f",), "avx2": ("-mno-avx512f", "-mno-avxvnni"),
            "portable C": ("-mno-avx512f", "-mno-avx2")}  # fmt: skip


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 instruction sets")
def test_every_instruction_set_gives_the_same_floats(native, tmp_path, monkeypatch) -> None:
    """AVX-512 VNNI, AVX-VNNI, AVX2 (sign-folded int8) and the portable loop compute the same block
    integers and the same float steps: bit-identical results. Built here from the native flags
    minus the wider sets (each library in this test's own kernel cache)."""
    monkeypatch.setenv("FREIGHT_KERNEL_CACHE", str(tmp_path))
    flags = _x86_cpu_flags()
    x, (q, scales) = randn(17, 257), _int8(130, 257)
    x4, (q4, s4) = randn(17, 192), _int4(130, 192, 64, half=False)
    bias = randn(130)
    want = native(x, pack_int8(q, scales), bias), native(x4, pack_int4(q4, s4, 64), bias)
    built = []
    for isa, extra in NARROWER.items():
        if isa == "avx-vnni" and "avx_vnni" not in flags:
            continue
        try:
            other = NativeQuantMatmul(extra)
        except KernelBuildError:
            continue  # a compiler without these flags
        if other.isa == native.isa:
            continue  # the native build already is this one
        assert other.isa == isa
        built.append(isa)
        assert torch.equal(other(x, pack_int8(q, scales), bias), want[0]), isa
        assert torch.equal(other(x4, pack_int4(q4, s4, 64), bias), want[1]), isa
    assert "portable C" in built or native.isa == "portable C"
