"""Triton fused MoE vs the torch reference, in Triton's interpreter; the reference vs a per-token loop."""

import pytest
import torch
import torch.nn.functional as F
from kernel_cases import assert_close, randn

from kernels.reference.fused_moe import fused_moe as ref_fused_moe
from kernels.reference.fused_moe import select_experts
from kernels.triton import fused_moe as tm


def _case(tokens: int, hidden: int, inter: int, experts: int, top_k: int, dtype: torch.dtype = torch.float32):
    x = randn(tokens, hidden, dtype=dtype)
    w13 = randn(experts, 2 * inter, hidden, dtype=dtype, scale=0.2)
    w2 = randn(experts, hidden, inter, dtype=dtype, scale=0.2)
    weights, ids = select_experts(randn(tokens, experts), top_k, renormalize=False)
    return x, w13, w2, weights, ids


def _per_token(x, w13, w2, weights, ids) -> torch.Tensor:
    """The definition, token by token (the slow loop the grouped paths replace)."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (w13[e].float() @ x[t].float()).chunk(2)
            out[t] += weights[t, j] * (w2[e].float() @ (F.silu(gate) * up))
    return out


@pytest.mark.parametrize(("tokens", "top_k"), [(1, 2), (7, 2), (40, 3)])
def test_reference_matches_per_token_definition(tokens: int, top_k: int) -> None:
    args = _case(tokens, 24, 20, 6, top_k)
    assert_close(ref_fused_moe(*args), _per_token(*args), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("tokens", "experts", "top_k", "block_m"), [(1, 4, 2, None), (3, 8, 2, 16), (50, 4, 3, 16)])
def test_triton_matches_reference(tokens: int, experts: int, top_k: int, block_m: int | None) -> None:
    """H and I not multiples of the tiles; 1 and 3 tokens leave experts empty, 50 fill several blocks."""
    args = _case(tokens, 40, 36, experts, top_k)
    idle = experts - torch.unique(args[4]).numel()
    assert idle > 0 or tokens == 50
    assert_close(tm.fused_moe(*args, block_m=block_m), ref_fused_moe(*args), atol=1e-4, rtol=1e-4)


def test_triton_all_tokens_on_one_expert_bf16() -> None:
    x, w13, w2, weights, _ = _case(20, 32, 16, 4, 1, dtype=torch.bfloat16)
    ids = torch.full((20, 1), 3)
    got = tm.fused_moe(x, w13, w2, weights, ids, block_m=16)  # two blocks of expert 3, three experts idle
    assert got.dtype == torch.bfloat16
    assert_close(got, _per_token(x, w13, w2, weights, ids), atol=3e-2, rtol=3e-2)


def test_align_blocks_groups_pairs_by_expert() -> None:
    ids = torch.tensor([[2, 0], [2, 1], [0, 2], [2, 0]])
    pairs, block_experts = tm.align_blocks(ids, num_experts=4, block_m=2)
    flat = ids.flatten()
    # each real pair exactly once; each block holds one expert's pairs (or padding)
    real = pairs[pairs < flat.numel()]
    assert sorted(real.tolist()) == list(range(flat.numel()))
    for b, e in enumerate(block_experts.tolist()):
        block = pairs[2 * b : 2 * b + 2]
        members = block[block < flat.numel()].long()
        if e < 0:
            assert members.numel() == 0
        else:
            assert (flat[members] == e).all() and members.numel() > 0
    assert block_experts.tolist()[:5] == [0, 0, 1, 2, 2]  # expert 3 gets no block


def test_empty_batch_and_bad_shapes() -> None:
    x, w13, w2, weights, ids = _case(3, 16, 8, 2, 1)
    assert tm.fused_moe(x[:0], w13, w2, weights[:0], ids[:0]).shape == (0, 16)
    with pytest.raises(ValueError, match="w2 must have shape"):
        tm.fused_moe(x, w13, w2[:, :, :4], weights, ids)
