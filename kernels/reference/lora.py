"""The gathered low-rank (LoRA) product of many adapters in one batch: each token picks its adapter.

Layouts (docs/design/kernels.md, "LoRA"): S adapter slots, each a stack of L slices of one fused
projection (q, k, v of qkv_proj: L = 3; gate, up: L = 2; o_proj, down_proj: L = 1), every slice
padded to rank R with zeros (a zero row of A and column of B add exactly nothing):
- a [S, L * R, K]: slice i's A in rows [i R, (i + 1) R);
- b [S, N, R]: slice i's B in rows [bounds[i], bounds[i + 1]) (the slice's output columns);
- scaling fp32 [S, L]: slice i's alpha / r (0 where the adapter does not wrap the slice);
- slots int [T]: the token's slot, -1 for a token of the base model (it gets nothing added).
lora_shrink(x, a, slots)[t] = x[t] @ a[slots[t]].T (fp32 [T, L * R]; rows of slot -1 are 0), then
lora_expand(h, b, scaling, slots, bounds, out) adds, for each slice i and token t of slot s >= 0,
  out[t, bounds[i]:bounds[i + 1]] += scaling[s, i] * (h[t, i R:(i + 1) R] @ b[s, bounds[i]:bounds[i + 1]].T),
PEFT's order: B of A of x, then the scaling, then the sum with the base projection's output.

The reference is also the CPU fast path: tokens are grouped by slot (`plan_slots`, once per step and
shared by every projection), and each slot present runs one matmul per slice over its gathered rows;
index_add folds them back. Python loops over the slots present and the slices, never over tokens.
"""

from __future__ import annotations

import torch

from kernels.checks import FLOAT_DTYPES, check_shape, check_tensor

Plan = tuple[torch.Tensor, list[tuple[int, int, int]]]


def plan_slots(slots: torch.Tensor, num_slots: int) -> Plan:
    """(order int64 [T]: token indices grouped by slot (stable), [(slot, lo, hi)]: order[lo:hi] are
    the tokens of each slot >= 0 present, ascending). Reads the counts to the host."""
    order = torch.argsort(slots, stable=True)
    counts = torch.bincount(slots.long() + 1, minlength=num_slots + 1).tolist()
    segments, lo = [], counts[0]  # tokens of slot -1 come first
    for slot, n in enumerate(counts[1:]):
        if n:
            segments.append((slot, lo, lo + n))
            lo += n
    return order, segments


def _rows(order: torch.Tensor, lo: int, hi: int, total: int) -> torch.Tensor | None:
    """The segment's token indices, or None when it is every token (no gather needed)."""
    return None if hi - lo == total else order[lo:hi]


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor, plan: Plan | None = None) -> torch.Tensor:
    """x [T, K], a [S, L * R, K], slots int [T] -> h fp32 [T, L * R] (module docstring). plan:
    `plan_slots(slots, S)` when the caller shares it across calls."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("a", a, ndim=3, dtypes=FLOAT_DTYPES)
    check_shape("a", a, [None, None, x.shape[1]])
    check_shape("slots", slots, [x.shape[0]])
    order, segments = plan if plan is not None else plan_slots(slots, a.shape[0])
    tokens = x.shape[0]
    h = torch.zeros((tokens, a.shape[1]), dtype=torch.float32, device=x.device)
    for slot, lo, hi in segments:
        rows = _rows(order, lo, hi, tokens)
        xs = x if rows is None else x.index_select(0, rows)
        part = torch.mm(xs.float(), a[slot].float().t())
        if rows is None:
            h = part
        else:
            h.index_copy_(0, rows, part)
    return h


def lora_expand(h: torch.Tensor, b: torch.Tensor, scaling: torch.Tensor, slots: torch.Tensor,
                bounds: tuple[int, ...], out: torch.Tensor, plan: Plan | None = None) -> None:  # fmt: skip
    """out [T, N] += the adapters' products (module docstring): h fp32 [T, L * R], b [S, N, R],
    scaling fp32 [S, L], bounds: L + 1 column offsets (0, ..., N). plan: as lora_shrink's."""
    check_tensor("out", out, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("b", b, ndim=3, dtypes=FLOAT_DTYPES)
    rank, slices = b.shape[2], len(bounds) - 1
    check_shape("b", b, [None, out.shape[1], None])
    check_shape("h", h, [out.shape[0], slices * rank])
    check_shape("scaling", scaling, [b.shape[0], slices])
    if bounds[0] != 0 or bounds[-1] != out.shape[1] or any(x > y for x, y in zip(bounds, bounds[1:], strict=False)):
        raise ValueError(f"bounds must rise from 0 to out's {out.shape[1]} columns, got {bounds}")
    order, segments = plan if plan is not None else plan_slots(slots, b.shape[0])
    tokens = out.shape[0]
    for slot, lo, hi in segments:
        rows = _rows(order, lo, hi, tokens)
        hs = h if rows is None else h.index_select(0, rows)
        for i in range(slices):
            c0, c1 = bounds[i], bounds[i + 1]
            y = torch.mm(hs[:, i * rank : (i + 1) * rank], b[slot, c0:c1].float().t()).mul_(scaling[slot, i])
            if rows is None:
                out[:, c0:c1] += y.to(out.dtype)
            else:
                out[:, c0:c1].index_add_(0, rows, y.to(out.dtype))
