"""A decode step's whole decoder stack in one C call (decode_stack.c).

`NativeDecodeStack.bind(...)` takes a model's tensors once (pointers into them, kept alive by the
returned `BoundDecodeStack`); each decode step then is one call with the step's embeddings,
positions, slots, block tables and context lengths. Same result as running the layers op by op
with the CPU kernels (kernels.cpu) and F.linear, to fp32 rounding: up to `gemv_rows` (15) rows the
matmuls are C GEMVs (another summation order); beyond, torch's own sgemm (kernels.cpu.blas: the
same floats as F.linear), on one thread, up to `max_rows`. Bound with `packed=True` the stack keeps a
copy of its four matrices packed for gemm.h (the weights' bytes once more) and multiplies every step
of `packed_rows` rows or more (1: every step) with it, up to `max_rows` rows with or without an sgemm (another
summation order again: one FMA chain over k per output; with half=True the copies are fp16, the same
floats from half the bytes). A matrix given as a QuantWeight (kernels.cpu.quant_matmul: int8 or int4,
packed for quant.h) multiplies in integers at every row count, its input rows quantized to int8 per
block: the products of NativeQuantMatmul, the same floats. LoRA adapters (kernels/cpu/stack_lora.py,
bound once with `bind_lora`) add each row's adapter products to its wrapped projections in the same
call (`lora=`).
"""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.cpu.blas import torch_sgemm
from kernels.cpu.build import load_library
from kernels.cpu.quant_matmul import PACK_WIDTH as QUANT_PACK_WIDTH
from kernels.cpu.quant_matmul import QuantWeight
from kernels.reference.quant_matmul import INT8_ACT_BLOCK

SOURCE = Path(__file__).with_suffix(".c")
HALF_MATRICES = ("qkv", "o_proj", "gate_up", "down")  # fp16 in a stack bound with half=True (packed: copied)

_ptr, _i64, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _QMatrix(ctypes.Structure):
    """quant.h's QMatrix: a quantized matrix as packed (w 0: the matrix is not quantized)."""

    _fields_ = [("w", _ptr), ("scales", _ptr), ("bits", _i64), ("group", _i64), ("half_scales", _i64)]

    @classmethod
    def of(cls, weight: QuantWeight | None) -> _QMatrix:
        if weight is None:
            return cls()
        half = int(weight.scales.dtype == torch.float16)
        return cls(weight.data.data_ptr(), weight.scales.data_ptr(), weight.bits, weight.group, half)


class _Layer(ctypes.Structure):
    _fields_ = [(name, _ptr) for name in ("input_norm", "qkv", "qkv_bias", "q_norm", "k_norm", "o_proj", "post_norm",
                                          "gate_up", "down", "k_cache", "v_cache")]  # fmt: skip
    _fields_ += [("window", _i64)]
    _fields_ += [(f"{name}_packed", _ptr) for name in ("qkv", "o_proj", "gate_up", "down")]
    _fields_ += [(f"{name}_q", _QMatrix) for name in ("qkv", "o_proj", "gate_up", "down")]


class _Model(ctypes.Structure):
    _fields_ = [(name, _i64) for name in ("num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim",
                                          "intermediate", "block_size", "num_slots", "max_positions",
                                          "half_weights")]  # fmt: skip
    _fields_ += [("eps", _f32), ("scale", _f32), ("layers", _ptr), ("final_norm", _ptr), ("cos_sin", _ptr)]
    _fields_ += [("packed", _i64), ("q_block", _i64), ("head", _QMatrix), ("head_bias", _ptr), ("vocab", _i64)]
    _fields_ += [("head_packed", _ptr), ("head_half", _i64)]


@dataclass(frozen=True)
class StackLayer:
    """One decoder layer's tensors (fp32, contiguous): nn.Linear weights [out, in] with q, k, v stacked
    in qkv and gate, up in gate_up; qkv_bias, q_norm, k_norm None where the architecture has none. Any
    of the four matrices may be a QuantWeight instead (int8 or int4 of the same [out, in])."""

    input_norm: torch.Tensor
    qkv: torch.Tensor | QuantWeight
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o_proj: torch.Tensor | QuantWeight
    post_norm: torch.Tensor
    gate_up: torch.Tensor | QuantWeight
    down: torch.Tensor | QuantWeight
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    window: int = 0  # sliding window in tokens (HF convention); 0: the whole context


@dataclass(frozen=True)
class BoundLora:
    """LoRA adapters bound for a decode stack of the same shape and layers (stack_lora.bind_lora;
    `ptr`: its StackLora, stack_step.h), as a call's `lora=` takes them."""

    ptr: int
    rank: int
    num_slots: int
    keep: tuple  # the ctypes structures and the tensors the pointers point into


@dataclass(frozen=True)
class StackShape:
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    scale: float


class NativeDecodeStack:
    """The compiled kernel, loaded once per instance (the build is cached on disk)."""

    def __init__(self, use_sgemm: bool = True) -> None:
        """use_sgemm: steps of more than gemv_rows rows through torch's sgemm where it is found."""
        lib = load_library(SOURCE)
        self._fn = lib.decode_stack_f32
        self._fn.argtypes = [_ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _i64]
        self._fn.restype = ctypes.c_int
        self._logits = lib.decode_stack_logits_f32  # the same, then a bound quantized head's logits
        self._logits.argtypes = [_ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _i64]
        self._logits.restype = ctypes.c_int
        self._draft = lib.decode_stack_draft  # a DraftChain's call (draft_chain.py sets its argtypes)
        self._lora = lib.decode_stack_lora_f32  # either call with the rows' LoRA adapters (stack_lora.py)
        self._lora.argtypes = [_ptr, _ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _i64]
        self._lora.restype = ctypes.c_int
        self._fits = lib.decode_stack_supports
        self._fits.argtypes = [_i64, _i64, _i64, _i64]
        self._fits.restype = ctypes.c_int
        lib.decode_stack_max_rows.argtypes = [ctypes.c_int]
        self.pack_width: int = lib.decode_stack_pack_width()  # weight rows per packed tile (gemm.h)
        self.packed_rows: int = lib.decode_stack_packed_rows()  # steps of this many rows or more: packed
        self.sgemm: int | None = torch_sgemm() if use_sgemm else None
        self.gemv_rows: int = lib.decode_stack_max_rows(0)  # on any number of threads
        self._most_rows = lib.decode_stack_max_rows
        self.max_rows: int = lib.decode_stack_max_rows(int(self.sgemm is not None))  # past gemv_rows: one thread

    def supports(self, shape: StackShape, block_size: int) -> bool:
        """Whether the kernel was compiled for these head sizes (else run the layers op by op)."""
        return bool(self._fits(shape.num_heads, shape.num_kv_heads, shape.head_dim, block_size))

    def bind(self, shape: StackShape, layers: list[StackLayer], final_norm: torch.Tensor,
             cos_sin: torch.Tensor, half: bool = False, packed: bool = False,
             head: QuantWeight | torch.Tensor | None = None, head_bias: torch.Tensor | None = None,
             head_rows: int = 0) -> BoundDecodeStack:  # fmt: skip
        """A callable stack over these tensors. Raises ValueError naming the first tensor that is not
        fp32 (half: the four matrices qkv, o_proj, gate_up and down fp16 instead, widened exactly in
        the GEMVs: half the bytes, the products of their fp32 copies; up to gemv_rows rows), contiguous
        and shaped for `shape` (callers check eligibility first; this is the guard). packed: the four
        matrices also copied in gemm.h's packed layout (in their dtype), for steps of packed_rows rows
        or more, up to 4096 rows (with half too); with packed_rows 1 (every step) the stack then keeps
        only the packed copies of the four matrices: a caller's fp16 copies are freed with the call.
        A matrix given as a QuantWeight is read as packed (no copy is made; half and packed concern
        the others); a stack whose matrices are all quantized takes up to 4096 rows. head: the lm_head
        quantized ([vocab, hidden]), or packed by pack_rows(weight, pack_width) (fp32 or fp16, whatever
        `half` says) with head_rows its vocab; head_bias fp32 [vocab] or None: BoundDecodeStack.logits
        then multiplies it in the same call."""
        h, d, inter = shape.hidden, shape.head_dim, shape.intermediate
        q, kv = shape.num_heads * d, shape.num_kv_heads * d
        want = {"input_norm": (h,), "qkv": (q + 2 * kv, h), "qkv_bias": (q + 2 * kv,), "q_norm": (d,), "k_norm": (d,),
                "o_proj": (h, q), "post_norm": (h,), "gate_up": (2 * inter, h), "down": (h, inter)}  # fmt: skip
        cache = layers[0].k_cache.shape if layers else None
        structs = (_Layer * len(layers))()
        packs: list[list[torch.Tensor | None]] = []  # the packed copies, kept alive with the stack
        kept: list[StackLayer] = []  # the layers' tensors the stack reads, kept alive with it
        blocks: set[int] = set()  # the quantized matrices' activation blocks
        for i, layer in enumerate(layers):
            quant = {name: getattr(layer, name) for name in HALF_MATRICES if isinstance(getattr(layer, name), QuantWeight)}
            for name, size in want.items():
                if name in quant:
                    _check_quant(f"layer {i} {name}", quant[name], size)
                    continue
                _check(f"layer {i} {name}", getattr(layer, name), size, optional=name in ("qkv_bias", "q_norm", "k_norm"),
                       dtype=torch.float16 if half and name in HALF_MATRICES else torch.float32)  # fmt: skip
            blocks.update(INT8_ACT_BLOCK if w.bits == 8 else w.group for w in quant.values())
            for name in ("k_cache", "v_cache"):
                t = getattr(layer, name)
                _check(f"layer {i} {name}", t, tuple(cache))
                if t.shape[2:] != (shape.num_kv_heads, d):
                    raise ValueError(f"layer {i} {name}: shape {tuple(t.shape)} has not [.., .., {shape.num_kv_heads}, {d}]")
            fields = [f for f, _ in _Layer._fields_[:11]]
            pointers = [None if f in quant or getattr(layer, f) is None else getattr(layer, f).data_ptr() for f in fields]
            copies = [None if name in quant else pack_rows(getattr(layer, name), self.pack_width)
                      for name in HALF_MATRICES] if packed else [None] * len(HALF_MATRICES)  # fmt: skip
            if packed and self.packed_rows == 1:  # every step takes the packed copies: the unpacked
                # matrices are never read (NULL), nor kept (a caller's fp16 copies are freed with it)
                pointers = [None if f in HALF_MATRICES else ptr for f, ptr in zip(fields, pointers, strict=True)]
                layer = dataclasses.replace(layer, **{name: None for name in HALF_MATRICES if name not in quant})
            kept.append(layer)
            packs.append(copies)
            structs[i] = _Layer(*pointers, layer.window, *(None if t is None else t.data_ptr() for t in copies),
                                *(_QMatrix.of(quant.get(name)) for name in HALF_MATRICES))  # fmt: skip
        _check("final_norm", final_norm, (h,))
        quant_head = head if isinstance(head, QuantWeight) else None
        packed_head = head if isinstance(head, torch.Tensor) else None
        vocab = head.n if quant_head is not None else head_rows if packed_head is not None else 0
        if quant_head is not None:
            _check_quant("head", quant_head, (vocab, h))
            blocks.add(INT8_ACT_BLOCK if quant_head.bits == 8 else quant_head.group)
        if packed_head is not None:
            _check("head", packed_head, (-(-vocab // self.pack_width), h, self.pack_width),
                   dtype=torch.float16 if packed_head.dtype == torch.float16 else torch.float32)  # fmt: skip
        if head is not None:
            _check("head_bias", head_bias, (vocab,), optional=True)
        if not (cos_sin.dtype == torch.float32 and cos_sin.is_contiguous() and cos_sin.dim() == 2 and cos_sin.shape[1] == d):
            raise ValueError(f"cos_sin must be a contiguous fp32 [max_positions, {d}] tensor")
        if cache is not None and not self.supports(shape, cache[1]):
            raise ValueError(f"the decode stack was not compiled for {shape.num_heads} heads of {d} floats, "
                             f"{shape.num_kv_heads} KV heads and blocks of {cache[1]}")  # fmt: skip
        all_quantized = bool(layers) and all(isinstance(getattr(layer, n), QuantWeight) for layer in layers for n in HALF_MATRICES)
        packed = packed or all_quantized
        model = _Model(len(layers), h, shape.num_heads, shape.num_kv_heads, d, inter, cache[1] if cache else 1,
                       cache[0] * cache[1] if cache else 0, cos_sin.shape[0], int(half), shape.eps, shape.scale,
                       ctypes.cast(structs, _ptr), final_norm.data_ptr(), cos_sin.data_ptr(), int(packed),
                       min(blocks, default=0), _QMatrix.of(quant_head),
                       None if head_bias is None else head_bias.data_ptr(), vocab,
                       None if packed_head is None else packed_head.data_ptr(),
                       int(packed_head is not None and packed_head.dtype == torch.float16))  # fmt: skip
        keep = (kept, final_norm, cos_sin, structs, packs, head, head_bias)
        sgemm, most = (None, self.gemv_rows) if half else (self.sgemm, self.max_rows)
        if packed:
            most = self._most_rows(1)
        return BoundDecodeStack(self._fn, model, keep, h, sgemm, self.gemv_rows, most, self._draft, self.pack_width,
                                self._logits if head is not None else None, self._lora)  # fmt: skip


class BoundDecodeStack:
    """A model's tensors bound to the kernel; call it once per decode step."""

    def __init__(self, fn, model: _Model, keep: tuple, hidden: int, sgemm: int | None, gemv_rows: int,
                 max_rows: int, draft_fn=None, pack_width: int = 0, logits_fn=None, lora_fn=None) -> None:  # fmt: skip
        self._fn, self._model, self._keep = fn, model, keep  # keep: the tensors the pointers point into
        self._logits_fn = logits_fn  # with a head bound: decode_stack_logits_f32
        self._lora_fn = lora_fn  # decode_stack_lora_f32: either call with LoRA adapters
        self.vocab: int = model.vocab if logits_fn is not None else 0  # the head's logits per row; 0: no head
        # for a DraftChain over this stack (draft_chain.py): the model and the library's draft call
        self.model_ptr, self.draft_fn = ctypes.addressof(model), draft_fn
        self._sgemm = sgemm
        self.hidden, self.gemv_rows, self.max_rows = hidden, gemv_rows, max_rows
        self.pack_width = pack_width  # gemm.h's tile width: what a DraftChain's packed head is packed with

    @property
    def shape(self) -> StackShape:
        m = self._model
        return StackShape(m.hidden, m.num_heads, m.num_kv_heads, m.head_dim, m.intermediate, m.eps, m.scale)

    @property
    def num_layers(self) -> int:
        return self._model.num_layers

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, lora: BoundLora | None = None,
                 lora_slots: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """x [rows, hidden] fp32 contiguous (the embeddings; 1 <= rows <= max_rows), positions and slots
        int64 [rows] contiguous, block_tables int32 [rows, W] with dense rows, context_lens int32 [rows]
        contiguous -> the final-normed hidden states [rows, hidden]. The caller guarantees the layouts
        (the engine checks them once per step); values are range-checked in C (IndexError). Past
        gemv_rows rows the call runs on one thread whatever torch.get_num_threads() says. lora: adapters
        bound to this stack (stack_lora.bind_lora), with lora_slots an int32 tensor [rows] (contiguous): each row's
        slot of them (-1: none)."""
        out = torch.empty(x.shape[0], self.hidden, dtype=torch.float32)
        self._run(x, positions, slots, block_tables, context_lens, out, None, lora, lora_slots)
        return out

    def logits(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, block_tables: torch.Tensor,
               context_lens: torch.Tensor, lora: BoundLora | None = None,
               lora_slots: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """__call__'s step, then the bound head over its final-normed rows in the same call: the fp32
        logits [rows, vocab] (a quantized head: its QuantLinear's integer kernel's floats; a packed one:
        NativeGemv.packed's on the same copy). ValueError when no head is bound (vocab 0)."""
        if self._logits_fn is None:
            raise ValueError("no lm_head is bound to this decode stack")
        rows = x.shape[0]
        out = torch.empty(rows, self.hidden, dtype=torch.float32)
        logits = torch.empty(rows, self.vocab, dtype=torch.float32)
        self._run(x, positions, slots, block_tables, context_lens, out, logits, lora, lora_slots)
        return logits

    def _run(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, block_tables: torch.Tensor,
             context_lens: torch.Tensor, out: torch.Tensor, logits: torch.Tensor | None, lora: BoundLora | None,
             lora_slots: torch.Tensor | None) -> None:  # fmt: skip
        rows = x.shape[0]
        if not 0 < rows <= self.max_rows:
            raise ValueError(f"the decode stack takes 1 to {self.max_rows} rows, not {rows}; run the layers op by op")
        step = (self._sgemm, x.data_ptr(), rows, positions.data_ptr(), slots.data_ptr(), block_tables.data_ptr(),
                block_tables.stride(0), context_lens.data_ptr(), out.data_ptr())  # fmt: skip
        if lora is not None:
            if lora_slots is None or lora_slots.dtype != torch.int32 or lora_slots.shape != (rows,) \
                    or not lora_slots.is_contiguous():  # fmt: skip
                raise ValueError(f"lora_slots must be a contiguous int32 tensor of {rows} slots")
            status = self._lora_fn(self.model_ptr, lora.ptr, lora_slots.data_ptr(), *step,
                                   None if logits is None else logits.data_ptr(), torch.get_num_threads())  # fmt: skip
        elif logits is not None:
            status = self._logits_fn(self.model_ptr, *step, logits.data_ptr(), torch.get_num_threads())
        else:
            status = self._fn(self.model_ptr, *step, torch.get_num_threads())
        if status == -2:
            raise MemoryError("decode_stack_f32 could not allocate its activations")
        if status:
            raise IndexError("decode_stack_f32 refused the step: a position, slot or context length out of range")


def pack_rows(w: torch.Tensor, width: int) -> torch.Tensor:
    """An nn.Linear weight [N, K] packed as gemm.h reads it: [ceil(N / width), K, width] (rows past N
    zero), contiguous, in w's dtype."""
    n, k = w.shape
    tiles = -(-n // width)
    padded = torch.zeros(tiles * width, k, dtype=w.dtype)
    padded[:n] = w
    return padded.view(tiles, width, k).transpose(1, 2).contiguous()


def _check_quant(name: str, w: QuantWeight, shape: tuple) -> None:
    tiles = -(-w.n // QUANT_PACK_WIDTH)
    if (w.n, w.k) != shape or w.data.dtype != torch.uint8 or not w.data.is_contiguous() \
            or not w.scales.is_contiguous() or w.data.shape[0] != tiles:  # fmt: skip
        raise ValueError(f"{name} must be a QuantWeight of [{shape[0]}, {shape[1]}] packed for quant.h, "
                         f"got [{w.n}, {w.k}] with data {tuple(w.data.shape)}")  # fmt: skip


def _check(name: str, t: torch.Tensor | None, shape: tuple, optional: bool = False,
           dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
    if t is None and optional:
        return
    if t is None or t.dtype != dtype or t.device.type != "cpu" or not t.is_contiguous() or tuple(t.shape) != shape:
        got = "None" if t is None else f"{t.dtype} {tuple(t.shape)} on {t.device}, contiguous={t.is_contiguous()}"
        raise ValueError(f"{name} must be a contiguous {dtype} CPU tensor of shape {shape}, got {got}")
