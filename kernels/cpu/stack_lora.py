"""LoRA adapters inside the decode stack (stack_lora.h): after each wrapped projection's base product
the stack adds, for every row of an adapter slot, the slot's low-rank products (shrink, then expand
times the scaling: kernels/reference/lora.py's, in another summation order) in the same call.

`bind_lora(stack, layers)` takes each layer's factors once, in worker/engine/lora/stacks.py's layout
(pointers into the tensors, kept alive by the returned decode_stack.BoundLora; a slot rewritten in
place is read as it is at each call); a call then names each row's slot
(`BoundDecodeStack(..., lora=, lora_slots=)`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from kernels.cpu.decode_stack import HALF_MATRICES, BoundDecodeStack, BoundLora, StackShape

_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64
MAX_SLICES = 3  # stack_step.h's LORA_MAX_SLICES: q | k | v


@dataclass(frozen=True)
class LoraFactors:
    """One projection's adapters (fp32, contiguous): a [S, L * R, in] (slice i's A in rows [i R, i R +
    R)), b [S, out, R] (slice i's B in its output columns), scaling [S, L]; bounds: the L + 1 output
    column offsets of the slices (qkv: 0, q, q + kv, q + 2 kv; gate_up: 0, I, 2 I; else 0, out)."""

    a: torch.Tensor
    b: torch.Tensor
    scaling: torch.Tensor
    bounds: tuple[int, ...]


class _LoraMatrix(ctypes.Structure):
    _fields_ = [("a", _ptr), ("b", _ptr), ("scaling", _ptr), ("slices", _i64), ("bounds", _i64 * (MAX_SLICES + 1))]


class _LoraLayer(ctypes.Structure):
    _fields_ = [(name, _LoraMatrix) for name in HALF_MATRICES]


class _StackLora(ctypes.Structure):
    _fields_ = [("layers", _ptr), ("rank", _i64), ("num_slots", _i64)]


def slice_bounds(shape: StackShape) -> dict[str, tuple[int, ...]]:
    """The output column offsets of each stacked matrix's slices."""
    q, kv, inter = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim, shape.intermediate
    return {"qkv": (0, q, q + kv, q + 2 * kv), "o_proj": (0, shape.hidden), "gate_up": (0, inter, 2 * inter),
            "down": (0, shape.hidden)}  # fmt: skip


def bind_lora(stack: BoundDecodeStack, layers: list[dict[str, LoraFactors]]) -> BoundLora:
    """Each of the stack's layers' adapters, by matrix name (qkv, o_proj, gate_up, down; a name left
    out carries none). Every projection's factors must share one rank R and one number of slots S;
    ValueError naming the first that does not, or that is not fp32, contiguous, on the CPU and of its
    matrix's shape and slices."""
    shape = stack.shape
    if len(layers) != stack.num_layers:
        raise ValueError(f"the stack has {stack.num_layers} layers, got adapters for {len(layers)}")
    h, q = shape.hidden, shape.num_heads * shape.head_dim
    sizes = {"qkv": (h, q + 2 * shape.num_kv_heads * shape.head_dim), "o_proj": (q, h),
             "gate_up": (h, 2 * shape.intermediate), "down": (shape.intermediate, h)}  # fmt: skip
    bounds = slice_bounds(shape)
    first = next((f for layer in layers for f in layer.values()), None)
    if first is None:
        raise ValueError("no layer carries an adapter")
    num_slots, rank = first.a.shape[0], first.a.shape[1] // (len(first.bounds) - 1)
    structs = (_LoraLayer * len(layers))()
    for i, layer in enumerate(layers):
        for name, f in layer.items():
            where = f"layer {i} {name}"
            if name not in sizes:
                raise ValueError(f"{where}: the stack's matrices are {', '.join(sizes)}")
            if f.bounds != bounds[name]:
                raise ValueError(f"{where}: slices {f.bounds}, the stack's are {bounds[name]}")
            k, n = sizes[name]
            slices = len(f.bounds) - 1
            for t, want in ((f.a, (num_slots, slices * rank, k)), (f.b, (num_slots, n, rank)),
                            (f.scaling, (num_slots, slices))):  # fmt: skip
                if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() or tuple(t.shape) != want:
                    raise ValueError(f"{where}: factors must be contiguous fp32 CPU tensors of {want}, "
                                     f"got {t.dtype} {tuple(t.shape)} on {t.device}")  # fmt: skip
            padded = (*f.bounds, *[0] * (MAX_SLICES + 1 - len(f.bounds)))
            setattr(structs[i], name, _LoraMatrix(f.a.data_ptr(), f.b.data_ptr(), f.scaling.data_ptr(), slices,
                                                  (_i64 * (MAX_SLICES + 1))(*padded)))  # fmt: skip
    lora = _StackLora(ctypes.cast(structs, _ptr), rank, num_slots)
    return BoundLora(ctypes.addressof(lora), rank, num_slots, (lora, structs, layers))
