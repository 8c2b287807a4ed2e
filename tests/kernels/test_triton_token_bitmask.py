"""Triton apply_token_bitmask_ vs the torch reference, in Triton's interpreter."""

import pytest
import torch

from kernels.reference.token_bitmask import apply_token_bitmask_ as reference
from kernels.triton.token_bitmask import apply_token_bitmask_


def _case(n: int, vocab: int, words: int, rows: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (len(rows), words), generator=g, dtype=torch.int64).to(torch.int32)
    return logits, bitmask, torch.tensor(rows, dtype=torch.int64)


@pytest.mark.parametrize(
    ("n", "vocab", "words", "rows"),
    [(4, 1024, 32, [0, 2]), (3, 1000, 32, [2, 0, 1]), (5, 1100, 32, [4]), (2, 70, 3, [1, 0])],
)  # vocab a multiple of 32; not; wider than the mask (tail at -inf); a partial last word
def test_matches_reference(n: int, vocab: int, words: int, rows: list[int]) -> None:
    logits, bitmask, idx = _case(n, vocab, words, rows)
    want = logits.clone()
    reference(want, bitmask, idx)
    apply_token_bitmask_(logits, bitmask, idx)
    assert torch.equal(logits, want)


def test_reference_semantics() -> None:
    """Bit t % 32 of word t // 32 allows token t; unlisted rows untouched; past the mask: -inf."""
    logits = torch.zeros(3, 40)
    bitmask = torch.zeros(1, 1, dtype=torch.int32)
    bitmask[0, 0] = (1 << 3) - (1 << 31)  # bits 3 and 31 (the sign bit)
    reference(logits, bitmask, torch.tensor([1]))
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [3, 31]
    assert torch.equal(logits[0], torch.zeros(40)) and torch.equal(logits[2], torch.zeros(40))


def test_rejects_bad_arguments() -> None:
    logits = torch.zeros(2, 64)
    with pytest.raises(ValueError, match="int32"):
        apply_token_bitmask_(logits, torch.zeros(1, 2, dtype=torch.int64), torch.tensor([0]))
    with pytest.raises(ValueError, match="one each"):
        apply_token_bitmask_(logits, torch.zeros(1, 2, dtype=torch.int32), torch.tensor([0, 1]))
