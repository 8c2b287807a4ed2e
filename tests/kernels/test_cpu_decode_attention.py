"""The C decode-attention kernel (kernels/cpu) against the torch reference, and its build and fallback."""

import pytest
import structlog
import torch
from kernel_cases import assert_close, poisoned, randn
from paged_cases import block_tables_for, random_cache

from kernels.cpu import build
from kernels.cpu.paged_decode_attention import NativeDecodeAttention
from kernels.reference import paged_decode_attention
from kernels.reference.attention import _attend_math
from worker.engine.backends import select_backend
from worker.engine.backends.base import AttentionMetadata
from worker.engine.backends.cpu_backend import CpuBackend


@pytest.fixture(scope="module")
def native() -> NativeDecodeAttention:
    return NativeDecodeAttention()


def _case(lens: list[int], hq: int, hkv: int, d: int, bs: int, num_blocks: int = 256):
    k_cache, v_cache = random_cache(num_blocks, bs, hkv, d, torch.float32)
    tables = block_tables_for(lens, bs, num_blocks)
    return randn(len(lens), hq, d), k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize(
    ("hq", "hkv", "d", "bs", "lens"),
    [
        (4, 2, 16, 16, [1, 15, 16, 17, 40]),  # the engine tests' shape; lengths around a block edge
        (8, 4, 64, 16, [3, 200, 333, 64, 129, 1]),  # the benchmark model's shape
        (8, 8, 32, 4, [5, 9, 1, 12]),  # no GQA, small blocks
        (16, 2, 128, 16, [100, 31, 257]),  # group of 8, head_dim 128
        (2, 1, 256, 32, [70, 33]),  # the largest compiled head_dim, large blocks
    ],
)
def test_matches_reference(native, hq: int, hkv: int, d: int, bs: int, lens: list[int]) -> None:
    q, k_cache, v_cache, tables, cl = _case(lens, hq, hkv, d, bs)
    expected = paged_decode_attention(q, k_cache, v_cache, tables, cl, d**-0.5)
    out = poisoned(len(lens), hq, d)
    assert native.supports(q, k_cache)
    native(q, k_cache, v_cache, tables, cl, d**-0.5, out)
    assert_close(out, expected, atol=2e-5, rtol=1e-5)


def test_strided_queries_and_threads(native) -> None:
    """q as a view into a wider qkv row (as the model passes it); 1, 2 and 3 threads agree exactly."""
    lens = [37, 5, 90, 16, 64, 1, 200]
    _, k_cache, v_cache, tables, cl = _case(lens, 8, 4, 64, 16)
    qkv = randn(len(lens), 8 * 64 + 2 * 4 * 64)
    q = qkv[:, : 8 * 64].view(len(lens), 8, 64)
    assert not q.is_contiguous()
    expected = paged_decode_attention(q.contiguous(), k_cache, v_cache, tables, cl, 0.125)
    outs = [native(q, k_cache, v_cache, tables, cl, 0.125, num_threads=n) for n in (1, 2, 3)]
    assert_close(outs[0], expected, atol=2e-5, rtol=1e-5)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_start_block_and_lse(native) -> None:
    """Keys from start_block on only, with each head's log-sum-exp, against plain math on those keys."""
    lens, bs, start = [40, 17, 33], 8, 2
    q, k_cache, v_cache, tables, cl = _case(lens, 4, 2, 16, bs)
    lse = poisoned(len(lens), 4)
    out = native(q, k_cache, v_cache, tables, cl, 0.25, start_block=start, lse=lse)
    for b, n in enumerate(lens):
        slots = torch.tensor([int(tables[b, i // bs]) * bs + i % bs for i in range(start * bs, n)])
        k = k_cache.view(-1, 2, 16)[slots].transpose(0, 1)  # [Hkv, L, D]
        v = v_cache.view(-1, 2, 16)[slots].transpose(0, 1)
        qb = q[b].view(2, 2, 16)  # [Hkv, G, D]
        o, s = _attend_math(qb[None], k[None], v[None], None, 0.25)
        assert_close(out[b], o[0].reshape(4, 16), atol=2e-5, rtol=1e-5)
        assert_close(lse[b], s[0].reshape(4), atol=2e-5, rtol=1e-5)


def test_unsupported_sizes_are_refused(native) -> None:
    q, k_cache, v_cache, tables, cl = _case([10], 4, 2, 24, 16)  # head_dim 24: no compiled kernel
    assert not native.supports(q, k_cache)
    with pytest.raises(ValueError, match="fp32 CPU tensors"):
        native(q, k_cache, v_cache, tables, cl, 0.2)
    assert not native.supports(q.double(), k_cache.double())


def _decode_meta(tables: torch.Tensor, cl: torch.Tensor) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.int64), num_prefill_tokens=0, prefill_cu_seqlens_q=None,
        prefill_context_lens=None, prefill_block_tables=None, decode_context_lens=cl, decode_block_tables=tables,
    )  # fmt: skip


@pytest.mark.parametrize("head_dim", [64, 24])  # the C kernel, and the torch fallback it hands off to
def test_backend_cascade_over_shared_prefix(head_dim: int) -> None:
    """Sequences sharing 8 leading blocks: the backend attends those once (torch cascade), the rest
    in C, and merges; equal to the reference (which also cascades) and to the unshared computation."""
    bs, shared = 16, 8
    lens = [shared * bs + n for n in (1, 20, 47, 3)]
    q, k_cache, v_cache, tables, cl = _case(lens, 8, 4, head_dim, bs)
    tables[:, :shared] = tables[0, :shared]  # every sequence starts with the same blocks
    expected = paged_decode_attention(q, k_cache, v_cache, tables, cl, 0.125)
    backend = CpuBackend()
    meta = _decode_meta(tables, cl)
    out = poisoned(len(lens), 8, head_dim)
    backend.decode_rows(q, k_cache, v_cache, meta, 0.125, out)
    if head_dim == 64:
        assert meta.scratch["native_decode"][2] == shared  # (tables, lens, shared blocks)
    else:  # the torch path's plan, cascade included
        assert meta.scratch["decode"].shared_ids.tolist() == tables[0, :shared].tolist()
    assert_close(out, expected, atol=2e-5, rtol=1e-5)
    via_rows_api = backend.paged_decode_attention(q, k_cache, v_cache, tables, cl, 0.125)
    assert_close(via_rows_api, expected, atol=2e-5, rtol=1e-5)


def test_build_is_cached_per_source(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FREIGHT_KERNEL_CACHE", str(tmp_path))
    first = NativeDecodeAttention()
    (lib,) = tmp_path.glob("paged_decode_attention-*.so")
    stamp = lib.stat().st_mtime_ns
    second = NativeDecodeAttention()  # loads the cached library: no second build
    assert lib.stat().st_mtime_ns == stamp and list(tmp_path.iterdir()) == [lib]
    q, k_cache, v_cache, tables, cl = _case([9, 30], 4, 2, 16, 16)
    assert torch.equal(first(q, k_cache, v_cache, tables, cl, 0.25), second(q, k_cache, v_cache, tables, cl, 0.25))


def test_no_compiler_falls_back_to_torch(tmp_path, monkeypatch) -> None:
    """A machine where the kernel cannot be built still runs: "auto" picks the torch backend and says
    why; asking for "cpu" explicitly is an error that names the way out."""
    monkeypatch.setenv("FREIGHT_KERNEL_CACHE", str(tmp_path))  # empty: forces a build
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    with pytest.raises(build.KernelBuildError, match="could not build paged_decode_attention.c"):
        NativeDecodeAttention()
    with structlog.testing.capture_logs() as logs:
        backend = select_backend("auto", torch.device("cpu"))
    assert backend.name == "torch"
    assert [e["event"] for e in logs] == ["cpu_kernels_unavailable"] and logs[0]["fallback"] == "torch"
    with pytest.raises(ValueError, match="backend 'cpu' is unavailable here.*use backend='torch'"):
        select_backend("cpu", torch.device("cpu"))
    assert list(tmp_path.iterdir()) == []  # nothing half-built left behind
