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
shared by every projection); each slot present runs one matmul (shrink) or one per slice (expand)
over its tokens: in place when they are one contiguous run of the step (the engine batches rows
adapter by adapter), else gathered once with the other scattered slots' and folded back by one
index_copy / index_add of whole rows. Python loops over the slots present and the slices, never
over tokens.
"""

from __future__ import annotations

import torch

from kernels.checks import FLOAT_DTYPES, check_shape, check_tensor

Plan = tuple[torch.Tensor, list[tuple[int, int, int, int]]]


def plan_slots(slots: torch.Tensor, num_slots: int) -> Plan:
    """(order int64 [T]: token indices grouped by slot (stable), [(slot, lo, hi, start)]: order[lo:hi]
    are the tokens of each slot >= 0 present, ascending; start >= 0 when they are the contiguous run
    start .. start + hi - lo - 1 of the step's tokens (rows batched adapter by adapter: read in place,
    no gather), else -1). Reads the counts and the order to the host."""
    order = torch.argsort(slots, stable=True)
    counts = torch.bincount(slots.long() + 1, minlength=num_slots + 1).tolist()
    host = order.tolist()
    segments, lo = [], counts[0]  # tokens of slot -1 come first
    for slot, n in enumerate(counts[1:]):
        if n:
            run = host[lo + n - 1] - host[lo] == n - 1  # ascending within a slot: contiguous iff its span is n
            segments.append((slot, lo, lo + n, host[lo] if run else -1))
            lo += n
    return order, segments


def _gathered(order: torch.Tensor, segments: list[tuple[int, int, int, int]]) -> tuple[torch.Tensor, list]:
    """The tokens of the segments that are not contiguous runs, grouped by slot, and those segments
    with their rows' offsets in it: [(slot, first, last)]."""
    parts, spans, pos = [], [], 0
    for slot, lo, hi, start in segments:
        if start < 0:
            parts.append(order[lo:hi])
            spans.append((slot, pos, pos + hi - lo))
            pos += hi - lo
    return (torch.cat(parts) if len(parts) > 1 else parts[0]) if parts else order[:0], spans


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor, plan: Plan | None = None) -> torch.Tensor:
    """x [T, K], a [S, L * R, K], slots int [T] -> h fp32 [T, L * R] (module docstring). plan:
    `plan_slots(slots, S)` when the caller shares it across calls."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("a", a, ndim=3, dtypes=FLOAT_DTYPES)
    check_shape("a", a, [None, None, x.shape[1]])
    check_shape("slots", slots, [x.shape[0]])
    order, segments = plan if plan is not None else plan_slots(slots, a.shape[0])
    tokens = x.shape[0]
    if len(segments) == 1 and segments[0][2] - segments[0][1] == tokens:  # every token one adapter's
        return torch.mm(x.float(), a[segments[0][0]].float().t())
    h = torch.zeros((tokens, a.shape[1]), dtype=torch.float32, device=x.device)
    for slot, lo, hi, start in segments:  # contiguous runs: in place
        if start >= 0:
            torch.mm(x[start : start + hi - lo].float(), a[slot].float().t(), out=h[start : start + hi - lo])
    rows, spans = _gathered(order, segments)
    if spans:  # the rest gathered once, each slot's rows a contiguous block of them
        xs = x.index_select(0, rows).float()
        hs = torch.empty((rows.shape[0], a.shape[1]), dtype=torch.float32, device=x.device)
        for slot, first, last in spans:
            torch.mm(xs[first:last], a[slot].float().t(), out=hs[first:last])
        h.index_copy_(0, rows, hs)
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
    for slot, lo, hi, start in segments:  # contiguous runs: added in place
        if start >= 0:
            part, block = h[start : start + hi - lo], out[start : start + hi - lo]
            for i in range(slices):
                c0, c1 = bounds[i], bounds[i + 1]
                y = torch.mm(part[:, i * rank : (i + 1) * rank], b[slot, c0:c1].float().t()).mul_(scaling[slot, i])
                block[:, c0:c1] += y.to(out.dtype)
    rows, spans = _gathered(order, segments)
    if not spans:
        return
    # the rest: every slot's slices into one buffer of their tokens (grouped by slot), then one add of
    # whole rows into out; each element of out gets exactly its one product added, as in place
    hs = h.index_select(0, rows)
    y = torch.empty((hs.shape[0], out.shape[1]), dtype=torch.float32, device=out.device)
    for slot, first, last in spans:
        part, block = hs[first:last], y[first:last]
        for i in range(slices):
            c0, c1 = bounds[i], bounds[i + 1]
            product = torch.mm(part[:, i * rank : (i + 1) * rank], b[slot, c0:c1].float().t(),
                               out=block if slices == 1 else None)  # fmt: skip
            torch.mul(product, scaling[slot, i], out=block[:, c0:c1])
    out.index_add_(0, rows, y.to(out.dtype))
