"""Applying packed allowed-token bitmasks to logits, in place (structured outputs).

bitmask row j holds bit (t % 32) of int32 word t // 32 set when token t is allowed (the layout of
llguidance and xgrammar); logits row rows[j] gets -inf at every token whose bit is clear, including
tokens past the bitmask's width. Vectorized: the words are unpacked with one shift and one AND over
[M, W, 32], no loop over the vocabulary.
"""

import torch


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """logits float [N, V] (modified in place); bitmask int32 [M, W]; rows int64 [M]: the logits row
    each bitmask row applies to (distinct). Rows not listed are left alone."""
    if not rows.numel():
        return
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).view(bitmask.shape[0], -1).bool()  # [M, W * 32]
    width = min(vocab, allowed.shape[1])
    sub = logits.index_select(0, rows)  # [M, V]
    sub[:, :width].masked_fill_(~allowed[:, :width], float("-inf"))
    if width < vocab:
        sub[:, width:] = float("-inf")
    logits.index_copy_(0, rows, sub)
