"""Paged KV caches filled with random values, and block tables that scatter sequences over them."""

import torch
from kernel_cases import randn


def random_cache(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)


def block_tables_for(context_lens: list[int], block_size: int, num_blocks: int) -> torch.Tensor:
    """int32 [B, max_blocks]: each sequence gets distinct random blocks; unused entries hold -1
    (never to be read)."""
    need = [-(-n // block_size) for n in context_lens]
    if sum(need) > num_blocks:
        raise ValueError(f"{sum(need)} blocks needed, cache has {num_blocks}")
    perm = torch.randperm(num_blocks).tolist()
    table = torch.full((len(context_lens), max(need + [1])), -1, dtype=torch.int32)
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor(perm[:n], dtype=torch.int32)
        perm = perm[n:]
    return table
