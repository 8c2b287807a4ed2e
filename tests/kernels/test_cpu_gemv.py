"""The C GEMV (kernels/cpu/gemv.c) against F.linear, and the CPU backend's use of it in project()."""

import pytest
import torch
import torch.nn.functional as F
from kernel_cases import assert_close, randn
from torch import nn
from torch_threads import torch_threads

from kernels.cpu.gemv import NativeGemv
from worker.engine.backends.cpu_backend import CpuBackend


@pytest.fixture(scope="module")
def gemv() -> NativeGemv:
    return NativeGemv()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize(("n", "k"), [(1024, 512), (37, 64), (9, 75), (5, 7)])  # vector multiples, tails only
@pytest.mark.parametrize("bias", [False, True])
def test_matches_linear(gemv, rows: int, n: int, k: int, bias: bool) -> None:
    x, w = randn(rows, k), randn(n, k, scale=0.1)
    b = randn(n) if bias else None
    got = gemv(x, w, b)
    assert got is not None and got.shape == (rows, n)
    assert_close(got, F.linear(x, w, b), atol=1e-4, rtol=1e-4)


def test_strided_rows_and_threads(gemv) -> None:
    """x as rows of a wider tensor; 1, 2 and 3 threads give the same floats (rows split, not sums)."""
    wide = randn(4, 600)
    x = wide[:, 7:519]
    w = randn(2048, 512, scale=0.05)  # 4 MB: enough weights for the threads to split
    outs = []
    for threads in (1, 2, 3):
        with torch_threads(threads):
            outs.append(gemv(x, w))
    assert_close(outs[0], F.linear(x, w), atol=1e-4, rtol=1e-4)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_refuses_what_it_does_not_take(gemv) -> None:
    w = randn(16, 32)
    assert gemv(randn(gemv.max_rows + 1, 32), w) is None  # many rows: torch's GEMM
    assert gemv(randn(2, 32).to(torch.float64), w.double()) is None
    assert gemv(randn(2, 32), randn(32, 16).t()) is None  # a transposed (non-contiguous) weight
    assert gemv(randn(32, 2).t(), w) is None  # x with strided columns
    assert gemv(randn(2, 32), w, randn(8)) is None  # bias of the wrong size


def test_backend_project_uses_it_for_few_rows(monkeypatch) -> None:
    backend = CpuBackend()
    linear = nn.Linear(64, 48).float()
    calls = []
    real = backend.gemv.__call__
    monkeypatch.setattr(type(backend.gemv), "__call__", lambda self, *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    with torch.no_grad():
        for rows in (1, 8, 9, 64):
            x = randn(rows, 64)
            assert_close(backend.project(linear, x), F.linear(x, linear.weight, linear.bias), atol=1e-4, rtol=1e-4)
        seen = []
        linear.register_forward_hook(lambda _m, args, _o: seen.append(args[0].shape[0]))
        backend.project(linear, randn(2, 64))  # hooks: the module is called, its hook fires
    assert calls == [1, 8]
    assert seen == [2]


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize(("n", "k"), [(4096, 128), (37, 64), (9, 75)])
def test_fp16_weights_give_the_fp32_weights_floats(gemv, rows: int, n: int, k: int) -> None:
    """fp16 weights (half the bytes) are widened exactly on load: the very floats of the fp32 GEMV over
    their fp32 copy, vector tails included."""
    x, w = randn(rows, k), randn(n, k, scale=0.1).half()
    got = gemv(x, w)
    assert got is not None and torch.equal(got, gemv(x, w.float()))
    assert_close(got, F.linear(x, w.float()), atol=1e-4, rtol=1e-4)


def test_top1_is_the_argmax_and_its_softmax_probability(gemv) -> None:
    """A draft's greedy token and confidence: torch's argmax (the first of equal maxima) and softmax
    probability, for flat and peaked rows (e^x of very negative gaps included)."""
    logits = torch.cat([randn(2, 4099), 40 * randn(2, 4099)])
    logits[0, 5] = logits[0, 9] = logits[0].max() + 1  # a tie: the first wins
    token, prob = gemv.top1(logits)
    assert torch.equal(torch.from_numpy(token), logits.argmax(-1)) and token[0] == 5
    assert_close(torch.from_numpy(prob), torch.softmax(logits, -1).max(-1).values, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("rows", "n", "k"), [(1, 37, 5), (3, 64, 72), (7, 130, 256), (16, 4096, 256), (40, 100, 33)])
def test_packed_matches_linear_and_fp16_gives_the_fp32_floats(gemv, rows: int, n: int, k: int) -> None:
    """gemm.h over a weight packed by pack_rows (partial last tiles, K tails, any rows); its fp16 copy
    widens exactly: the same floats; so do 2 threads (whole tiles each)."""
    from kernels.cpu.decode_stack import pack_rows

    x, w, b = randn(rows, k), randn(n, k, scale=0.1).half().float(), randn(n)
    got = gemv.packed(x, pack_rows(w, gemv.pack_width), n, b)
    assert_close(got, F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    assert torch.equal(gemv.packed(x, pack_rows(w.half(), gemv.pack_width), n, b), got)
    with torch_threads(2):
        assert torch.equal(gemv.packed(x, pack_rows(w, gemv.pack_width), n, b), got)
    with pytest.raises(ValueError, match="packed"):
        gemv.packed(x, w, n, b)  # not packed
