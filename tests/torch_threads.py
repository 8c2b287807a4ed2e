"""torch's intra-op thread count set for a block of a test and restored after it, whatever the block
raises: the count is process-wide, and the next test must find the one it left."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with torch.set_num_threads(n), then set the previous count again."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
