"""The gathered LoRA product: the torch reference against a per-token formula, then the Triton
kernels (in Triton's interpreter) against the reference: 1-3 slices with unaligned column bounds,
ranks 8-64, base tokens (-1) mixed in, slots absent from the step, fp32 / fp16 / bf16."""

import pytest
import torch
from kernel_cases import assert_close, randn

from kernels.reference import lora as ref
from kernels.triton import lora as tl_lora

# half precision: the kernels round h to the factors' dtype before B (as PEFT does), and out to its dtype:
# one unit in the last place of outputs up to ~8
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 3e-3), torch.bfloat16: (8e-2, 3e-2)}


def _case(tokens: int, slots: int, bounds: tuple[int, ...], rank: int, k: int, dtype: torch.dtype,
          base_share: float = 0.3) -> tuple:  # fmt: skip
    g = torch.Generator().manual_seed(tokens * 131 + slots * 7 + rank)
    slices = len(bounds) - 1
    x = randn(tokens, k, dtype=dtype)
    a = randn(slots, slices * rank, k, dtype=dtype, scale=0.2)
    b = randn(slots, bounds[-1], rank, dtype=dtype, scale=0.2)
    scaling = torch.rand(slots, slices, generator=g) + 0.5
    ids = torch.randint(0, slots, (tokens,), generator=g, dtype=torch.int32)
    ids[torch.rand(tokens, generator=g) < base_share] = -1
    out = randn(tokens, bounds[-1], dtype=dtype)
    return x, a, b, scaling, ids, out


def _per_token(x, a, b, scaling, ids, bounds, out):
    """The contract written token by token: what both implementations must equal."""
    rank = b.shape[2]
    want = out.float().clone()
    for t, s in enumerate(ids.tolist()):
        if s < 0:
            continue
        h = x[t].float() @ a[s].float().t()
        for i in range(len(bounds) - 1):
            c0, c1 = bounds[i], bounds[i + 1]
            want[t, c0:c1] += scaling[s, i] * (h[i * rank : (i + 1) * rank] @ b[s, c0:c1].float().t())
    return want


CASES = [
    (1, 1, (0, 40), 8, 48),  # one decode token, o_proj-like
    (5, 3, (0, 24, 40), 16, 64),  # gate/up-like, unaligned bound
    (37, 8, (0, 64, 96, 128), 16, 130),  # qkv-like, 8 adapters, K not a multiple of 64
    (20, 4, (0, 48, 56, 64), 64, 96),  # rank 64, slices narrower than a column tile
]


@pytest.mark.parametrize(("tokens", "slots", "bounds", "rank", "k"), CASES)
def test_reference_matches_per_token_formula(tokens, slots, bounds, rank, k) -> None:
    x, a, b, scaling, ids, out = _case(tokens, slots, bounds, rank, k, torch.float32)
    # scattered slots (gathered), then rows batched adapter by adapter with one slot's run split in
    # two (contiguous runs read in place, the split one gathered)
    grouped = torch.sort(ids, stable=True).values
    if tokens > 2:
        grouped = torch.cat([grouped[-1:], grouped[:-1]])  # the last slot's last token first
    for slots_of in (ids, grouped):
        segments = ref.plan_slots(slots_of, slots)[1]
        assert slots_of is ids or tokens < 3 or any(start >= 0 for *_, start in segments)
        got = out.clone()
        want = _per_token(x, a, b, scaling, slots_of, bounds, got)
        h = ref.lora_shrink(x, a, slots_of)
        assert not h[slots_of < 0].any(), "base tokens' h must be zero"
        ref.lora_expand(h, b, scaling, slots_of, bounds, got)
        assert_close(got, want, 1e-5, 1e-5)


@pytest.mark.parametrize(("tokens", "slots", "bounds", "rank", "k"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_matches_reference(tokens, slots, bounds, rank, k, dtype) -> None:
    x, a, b, scaling, ids, out = _case(tokens, slots, bounds, rank, k, dtype)
    want_h = ref.lora_shrink(x, a, ids)
    got_h = tl_lora.lora_shrink(x, a, ids)
    assert_close(got_h, want_h, *TOL[dtype])
    want, got = out.clone(), out.clone()
    ref.lora_expand(want_h, b, scaling, ids, bounds, want)
    plan = tl_lora.plan_slots(ids, slots)
    tl_lora.lora_expand(want_h, b, scaling, ids, bounds, got, plan)
    assert_close(got, want, *TOL[dtype])
    base = ids < 0
    assert torch.equal(got[base], out[base]), "base tokens' outputs must be left as they were"


def test_all_base_tokens_and_empty_step() -> None:
    x, a, b, scaling, ids, out = _case(9, 2, (0, 32), 16, 64, torch.float32)
    ids.fill_(-1)
    for impl in (ref, tl_lora):
        got = out.clone()
        h = impl.lora_shrink(x, a, ids)
        impl.lora_expand(h, b, scaling, ids, (0, 32), got)
        assert torch.equal(got, out)
        empty = impl.lora_shrink(x[:0], a, ids[:0])
        assert empty.shape == (0, 16)


def test_plans_group_tokens_by_slot() -> None:
    ids = torch.tensor([2, -1, 0, 2, 2, -1, 0], dtype=torch.int32)
    order, segments = ref.plan_slots(ids, 3)
    assert segments == [(0, 2, 4, -1), (2, 4, 7, -1)]  # scattered: gathered
    assert ref.plan_slots(torch.tensor([-1, 1, 1, 0, 2, 2, -1], dtype=torch.int32), 3)[1] == [
        (0, 2, 3, 3), (1, 3, 5, 1), (2, 5, 7, 4)]  # runs: read in place from their first token  # fmt: skip
    assert sorted(order[2:4].tolist()) == [2, 6] and sorted(order[4:7].tolist()) == [0, 3, 4]
    rows, block_slots = tl_lora.plan_slots(ids, 3)
    used = {int(s): rows[i * tl_lora.BLOCK_M : (i + 1) * tl_lora.BLOCK_M] for i, s in enumerate(block_slots) if s >= 0}
    assert sorted(used) == [0, 2]
    assert sorted(r for r in used[2].tolist() if r < ids.numel()) == [0, 3, 4]
    assert sorted(r for r in used[0].tolist() if r < ids.numel()) == [2, 6]


def test_bad_arguments_are_refused() -> None:
    x, a, b, scaling, ids, out = _case(4, 2, (0, 16, 32), 8, 32, torch.float32)
    h = ref.lora_shrink(x, a, ids)
    with pytest.raises(ValueError, match="bounds"):
        tl_lora.lora_expand(h, b, scaling, ids, (0, 16, 30), out)
    with pytest.raises(ValueError, match="a must have shape"):
        tl_lora.lora_shrink(x, a[:, :, :16], ids)
