"""The fused-MoE options gpt-oss needs (expert biases, the clamped SwiGLU) in the Triton kernel (Triton's
interpreter) against the torch reference, and the reference against a per-token definition written as
transformers' GptOssExperts computes it (the routing weight scales the down projection and its bias)."""

import pytest
import torch
from kernel_cases import assert_close, randn

from kernels.reference.fused_moe import fused_moe as ref_fused_moe
from kernels.reference.fused_moe import select_experts_topk_softmax
from kernels.triton import fused_moe as tm
from worker.engine.backends import select_backend

LIMIT, ALPHA = 1.5, 1.702  # a low limit: the random projections below cross it often


def _case(tokens: int, hidden: int, inter: int, experts: int, top_k: int, dtype: torch.dtype = torch.float32,
          idle: int = 0):  # fmt: skip
    """Random weights and biases; routing top-k-then-softmax (gpt-oss's) over the first experts - idle
    experts only (the last `idle` get no token)."""
    x = randn(tokens, hidden, dtype=dtype)
    w13 = randn(experts, 2 * inter, hidden, dtype=dtype, scale=0.5)
    w2 = randn(experts, hidden, inter, dtype=dtype, scale=0.2)
    b13 = randn(experts, 2 * inter, dtype=dtype)
    b2 = randn(experts, hidden, dtype=dtype)
    weights, ids = select_experts_topk_softmax(randn(tokens, experts - idle), top_k)
    return x, w13, w2, weights, ids, b13, b2


def _per_token(x, w13, w2, weights, ids, b13, b2, limit, alpha) -> torch.Tensor:
    """out[t] = sum_j w_j * (w2[e] @ act(w13[e] @ x[t] + b13[e]) + b2[e]), token by token, in fp32."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (w13[e].float() @ x[t].float() + b13[e].float()).chunk(2)
            if limit is None:
                act = torch.nn.functional.silu(gate) * up
            else:
                gate = gate.clamp(max=limit)
                act = (up.clamp(-limit, limit) + 1) * gate * torch.sigmoid(alpha * gate)
            out[t] += weights[t, j] * (w2[e].float() @ act + b2[e].float())
    return out


@pytest.mark.parametrize("limit", [None, LIMIT])
def test_reference_matches_per_token_definition(limit: float | None) -> None:
    x, w13, w2, weights, ids, b13, b2 = _case(30, 24, 20, 6, 3)
    got = ref_fused_moe(x, w13, w2, weights, ids, b13=b13, b2=b2, swiglu_limit=limit, swiglu_alpha=ALPHA)
    assert_close(got, _per_token(x, w13, w2, weights, ids, b13, b2, limit, ALPHA), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "idle", "block_m"),
    [(3, 8, 2, 0, None), (90, 6, 2, 2, 16), (130, 4, 4, 0, 32)],
)
def test_triton_biases_and_clamp_match_reference(tokens: int, experts: int, top_k: int, idle: int,
                                                 block_m: int | None) -> None:  # fmt: skip
    """H and I not multiples of the tiles; 3 tokens leave experts empty; 90 tokens put ~45 rows on
    each of 4 experts (several blocks of 16) and none on the last 2; 130 tokens fill every expert."""
    x, w13, w2, weights, ids, b13, b2 = _case(tokens, 40, 36, experts, top_k, idle=idle)
    counts = torch.bincount(ids.flatten(), minlength=experts)
    if tokens == 3 or idle:
        assert (counts == 0).any()
    if tokens >= 90:
        assert counts[: experts - idle].min() > 2 * (block_m or 16)
    gate_up = torch.einsum("th,enh->ten", x, w13) + b13  # the clamp is crossed both ways
    assert (gate_up > LIMIT).any() and (gate_up < -LIMIT).any()
    options = {"b13": b13, "b2": b2, "swiglu_limit": LIMIT, "swiglu_alpha": ALPHA}
    want = ref_fused_moe(x, w13, w2, weights, ids, **options)
    assert_close(tm.fused_moe(x, w13, w2, weights, ids, **options, block_m=block_m), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "options",
    [{"b13": True, "b2": False}, {"b13": False, "b2": True}, {"b13": False, "b2": False, "clamped": True}],
)
def test_triton_each_option_alone(options: dict) -> None:
    x, w13, w2, weights, ids, b13, b2 = _case(50, 32, 24, 4, 2)
    kwargs = {"b13": b13 if options["b13"] else None, "b2": b2 if options["b2"] else None}
    if options.get("clamped"):
        kwargs |= {"swiglu_limit": LIMIT, "swiglu_alpha": ALPHA}
    want = ref_fused_moe(x, w13, w2, weights, ids, **kwargs)
    assert not torch.allclose(want, ref_fused_moe(x, w13, w2, weights, ids), atol=1e-3)  # the option matters
    assert_close(tm.fused_moe(x, w13, w2, weights, ids, **kwargs, block_m=16), want, atol=1e-4, rtol=1e-4)


def test_triton_options_bf16() -> None:
    x, w13, w2, weights, ids, b13, b2 = _case(40, 32, 16, 4, 2, dtype=torch.bfloat16)
    got = tm.fused_moe(x, w13, w2, weights, ids, b13, b2, LIMIT, ALPHA, block_m=16)
    assert got.dtype == torch.bfloat16
    assert_close(got, _per_token(x, w13, w2, weights, ids, b13, b2, LIMIT, ALPHA), atol=5e-2, rtol=3e-2)


def test_bad_options_are_refused() -> None:
    x, w13, w2, weights, ids, b13, b2 = _case(3, 16, 8, 2, 1)
    with pytest.raises(ValueError, match="b2 must have shape"):
        tm.fused_moe(x, w13, w2, weights, ids, b13, b2[:, :4])
    with pytest.raises(ValueError, match="b13 must have shape"):
        tm.fused_moe(x, w13, w2, weights, ids, b13[:, :8])
    with pytest.raises(ValueError, match="swiglu_alpha"):
        tm.fused_moe(x, w13, w2, weights, ids, swiglu_limit=7.0)
    with pytest.raises(ValueError, match="swiglu_alpha"):
        ref_fused_moe(x, w13, w2, weights, ids, swiglu_limit=7.0)


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton"])
def test_every_backend_takes_the_options(backend: str) -> None:
    """Backend.fused_moe with biases and the clamp: the reference's result on each backend."""
    x, w13, w2, weights, ids, b13, b2 = _case(20, 32, 24, 6, 2, idle=1)
    options = {"b13": b13, "b2": b2, "swiglu_limit": LIMIT, "swiglu_alpha": ALPHA}
    got = select_backend(backend, torch.device("cpu")).fused_moe(x, w13, w2, weights, ids, **options)
    assert_close(got, ref_fused_moe(x, w13, w2, weights, ids, **options), atol=1e-4, rtol=1e-4)
