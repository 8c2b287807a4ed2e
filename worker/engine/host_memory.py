"""Host memory for the CPU engine's big tensors (weights, KV cache) on transparent huge pages.

A batch-1 decode step streams every weight once (109 MB on the bench model) and attention reads
KV blocks scattered over the cache. On 4 KB pages that is a TLB miss every 4 KB and hardware
prefetchers that stop at each page edge; 2 MB pages take both away (bench/step_overhead.py
--batch1-medium prints the read rate of one core over the bench model's weights and of the GEMVs of
kernels/cpu/gemv.h; run it with transparent huge pages "never" and "madvise" to compare). torch's CPU
allocator only
asks for huge pages when THP_MEM_ALLOC_ENABLE is set in the environment (process-wide), so the
engine maps its own: anonymous memory, 2 MB aligned, advised
MADV_HUGEPAGE (Linux honours it when /sys/kernel/mm/transparent_hugepage/enabled is "always" or
"madvise"; elsewhere these are ordinary pages, with the same results).
"""

from __future__ import annotations

import mmap

import structlog
import torch
from torch import nn

log = structlog.get_logger(__name__)

HUGE_PAGE = 2 << 20
_ALIGN = 64  # bytes: each tensor packed into an arena starts on a cache line


def huge_page_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised 1-D CPU tensor whose memory starts 2 MB aligned, advised to use huge pages
    (plain torch.empty below 2 MB or where the platform has no MADV_HUGEPAGE)."""
    size = numel * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or size < HUGE_PAGE:
        return torch.empty(numel, dtype=dtype)
    region = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(advice)
    except OSError as exc:  # THP compiled out of the kernel: ordinary pages
        log.debug("huge_pages_unavailable", reason=str(exc))
    raw = torch.frombuffer(region, dtype=torch.uint8)  # keeps `region` alive as long as any view of it
    start = -raw.data_ptr() % HUGE_PAGE
    return raw[start : start + size].view(dtype)


def huge_page_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.zeros(shape, dtype) on huge pages (see huge_page_empty)."""
    numel = 1
    for n in shape:
        numel *= n
    return huge_page_empty(numel, dtype).zero_().view(shape)


def pack_parameters(model: nn.Module) -> int:
    """Moves the model's floating-point parameters (each once: tied ones stay tied) into one huge-page
    arena, in the order the model registers them (layer by layer: the order a decode step reads
    them), each 64-byte aligned; returns the arena's bytes. Parameters keep their objects, shapes and
    values (`param.data` is swapped), so modules and state dicts see no difference. Quantized modules'
    packed integer tensors are left where they are."""
    params = [p for p in model.parameters() if p.is_floating_point() and p.device.type == "cpu"]
    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += -(-p.numel() * p.element_size() // _ALIGN) * _ALIGN
    if not params:
        return 0
    arena = huge_page_empty(total, torch.uint8)
    with torch.no_grad():
        for p, offset in zip(params, offsets, strict=True):
            nbytes = p.numel() * p.element_size()
            packed = arena[offset : offset + nbytes].view(p.dtype).view(p.shape)
            packed.copy_(p.data)
            p.data = packed
    return total
