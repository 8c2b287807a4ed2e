"""The C kernels' 8-lane (AVX2) build, on machines whose native build is the 16-lane AVX-512 one.

The kernels pick their vector width at compile time (`-march=native`), so an AVX-512 machine never
runs the 8-lane code its AVX2 users get (a head_dim-256 bug once hid there). Here they are rebuilt
with `-mno-avx512f` into a private cache and checked against the references on the shapes where
the width matters: head sizes of 1 to 32 vectors, tails, blocks smaller than a vector.
"""

import platform
from pathlib import Path

import pytest
import torch
from kernel_cases import assert_close, randn
from paged_cases import block_tables_for, random_cache

from kernels import reference
from kernels.cpu import build
from kernels.cpu.decode_stack import NativeDecodeStack
from kernels.cpu.elementwise import NativeElementwise
from kernels.cpu.gemv import NativeGemv
from kernels.cpu.paged_decode_attention import NativeDecodeAttention
from kernels.cpu.paged_prefill_attention import NativePrefillAttention


def _has_avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not _has_avx512(),
    reason="the native build already is the AVX2 one (or not x86)",
)


@pytest.fixture(scope="module")
def avx2_build(tmp_path_factory):
    """The kernels built without AVX-512 into their own cache; the native build's is left alone."""
    cache = tmp_path_factory.mktemp("avx2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FREIGHT_KERNEL_CACHE", str(cache))
        mp.setattr(build, "FLAGS", (*build.FLAGS, "-mno-avx512f"))
        yield cache, NativeDecodeAttention(), NativePrefillAttention(), NativeElementwise(), NativeGemv(), \
            NativeDecodeStack()  # fmt: skip


def test_built_apart_from_the_native_build(avx2_build, monkeypatch) -> None:
    """The flags are part of the cache key: the 8-lane libraries never shadow the native ones."""
    cache = avx2_build[0]
    monkeypatch.setattr(build, "FLAGS", tuple(f for f in build.FLAGS if f != "-mno-avx512f"))  # the native key
    built = sorted(p.name for p in cache.glob("*.so"))
    assert [name.rsplit("-", 1)[0] for name in built] == ["decode_stack", "elementwise", "gemv",
                                                          "paged_decode_attention", "paged_prefill_attention"]  # fmt: skip
    compiler = build._compiler()
    sources = [Path(build.__file__).with_name(f"{name.rsplit('-', 1)[0]}.c") for name in built]
    assert not {build.library_path(src, compiler).name for src in sources} & set(built)


@pytest.mark.parametrize(("hq", "hkv", "d", "bs"), [(4, 2, 16, 16), (8, 4, 64, 16), (2, 1, 256, 32), (8, 8, 8, 4)])
def test_decode_matches_reference(avx2_build, hq: int, hkv: int, d: int, bs: int) -> None:
    decode = avx2_build[1]
    lens = [1, 7, 8, 9, 40, 77]
    k_cache, v_cache = random_cache(128, bs, hkv, d, torch.float32)
    tables, cl = block_tables_for(lens, bs, 128), torch.tensor(lens, dtype=torch.int32)
    q = randn(len(lens), hq, d)
    expected = reference.paged_decode_attention(q, k_cache, v_cache, tables, cl, d**-0.5)
    assert_close(decode(q, k_cache, v_cache, tables, cl, d**-0.5), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(("hq", "hkv", "d", "bs"), [(4, 2, 16, 16), (8, 4, 64, 16), (2, 1, 256, 32), (8, 8, 8, 4)])
def test_prefill_matches_reference(avx2_build, hq: int, hkv: int, d: int, bs: int) -> None:
    prefill = avx2_build[2]
    q_lens, ctxs = [1, 9, 30, 13], [1, 20, 30, 50]
    k_cache, v_cache = random_cache(128, bs, hkv, d, torch.float32)
    tables, cl = block_tables_for(ctxs, bs, 128), torch.tensor(ctxs, dtype=torch.int32)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = randn(sum(q_lens), hq, d)
    expected = reference.prefill_attention(q, k_cache, v_cache, cu, cl, tables, d**-0.5)
    assert_close(prefill(q, k_cache, v_cache, cu, cl, tables, d**-0.5), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [64, 21, 5])  # vector multiple, vector + tail, tail only
def test_elementwise_matches_reference(avx2_build, n: int) -> None:
    elementwise = avx2_build[3]
    x, residual, weight = randn(33, n), randn(33, n), randn(n)
    out, res = elementwise.rms_norm(x, weight, 1e-6, residual)
    ref_out, ref_res = reference.rms_norm(x, weight, 1e-6, residual)
    assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    assert_close(res, ref_res, atol=1e-6, rtol=1e-6)
    gate_up = randn(33, 2 * n)
    assert_close(elementwise.silu_mul(gate_up), reference.silu_mul(gate_up), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("rows", "k"), [(1, 512), (3, 72), (8, 5)])  # 4 chains, 2 chains + tail, tail only
def test_gemv_matches_linear(avx2_build, rows: int, k: int) -> None:
    x, w, b = randn(rows, k), randn(37, k, scale=0.1), randn(37)
    assert_close(avx2_build[4](x, w, b), torch.nn.functional.linear(x, w, b), atol=1e-4, rtol=1e-4)


def test_decode_stack_matches_layers(avx2_build) -> None:
    """The 8-lane stack against the kernel tests' op-by-op reference (head_dim 8: one 8-lane vector)."""
    from test_cpu_decode_stack import _case, _copy_caches, _reference

    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(72, 4, 2, 8, 40, 4, [3, 19], True, True)
    want = _reference(shape, _copy_caches(layers), final_norm, cos_sin, x, positions, slots, tables, cl)
    got = avx2_build[5].bind(shape, layers, final_norm, cos_sin)(x, positions, slots, tables, cl)
    assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_decode_stack_packed_matches_layers(avx2_build) -> None:
    """The 8-lane packed products (tiles of 2 vectors) against the same reference, on 11 rows."""
    from test_cpu_decode_stack import _case, _copy_caches, _reference

    lens = [3, 19, 7, 1, 30, 12, 5, 8, 22, 2, 9]
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(72, 4, 2, 8, 40, 4, lens, True, True)
    want = _reference(shape, _copy_caches(layers), final_norm, cos_sin, x, positions, slots, tables, cl)
    stack = avx2_build[5]
    assert stack.pack_width == 16
    got = stack.bind(shape, layers, final_norm, cos_sin, packed=True)(x, positions, slots, tables, cl)
    assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_decode_stack_lora_matches_layers(avx2_build) -> None:
    """The 8-lane LoRA products (8 B rows dotted at a time, ranks with a tail) against the reference."""
    from test_cpu_decode_stack import _adapters, _case, _copy_caches, _reference

    from kernels.cpu.stack_lora import bind_lora

    lens = [3, 19, 7, 1, 30, 12, 5, 8, 22, 2, 9]
    shape, layers, final_norm, cos_sin, x, positions, slots, tables, cl = _case(72, 4, 2, 8, 40, 4, lens, True, True)
    adapters = _adapters(shape, layers, num_slots=3, rank=12)
    row_slots = torch.tensor([0, 0, -1, 2, 1, 1, 1, 0, -1, 2, 2], dtype=torch.int32)
    want = _reference(shape, _copy_caches(layers), final_norm, cos_sin, x, positions, slots, tables, cl,
                      adapters=(adapters, row_slots))  # fmt: skip
    stack = avx2_build[5].bind(shape, layers, final_norm, cos_sin, packed=True)
    got = stack(x, positions, slots, tables, cl, lora=bind_lora(stack, adapters), lora_slots=row_slots)
    assert_close(got, want, atol=2e-4, rtol=1e-4)
