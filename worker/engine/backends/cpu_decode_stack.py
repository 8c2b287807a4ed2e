"""ModelDecodeStack: a CausalLM's decoder layers bound to the C decode stack (kernels/cpu/decode_stack).

A pure decode step then runs its whole layer stack in one C call: the step's ~12 ops a layer (norms,
qkv, rotary + K/V store, attention, o_proj, gate_up, SiLU * up, down) without Python or torch's dispatch
between them, then the final norm and the lm_head (`logits`: a quantized head's integer kernel, or the
fp32 head's packed copy, HeadCopies; the products Backend.project gives it). Up to 15 rows the stack
runs on torch's thread count; more rows run on one thread, so they go through the stack only when torch
runs one thread (with more, the op-by-op path threads attention too). The engine's stack (`for_engine`)
keeps its own copies of the four matrices, packed for the register-tiled product of kernels/cpu/gemm.h:
fp16 when every value is an fp16 value (a checkpoint stored in fp16: the same products from half the
bytes), else fp32. They multiply every step of any number of rows (stack_step.h's STACK_PACKED_ROWS: one
layout, the same floats for a token in a plain step as in a verify step), so the unpacked fp16 copies
made on the way are not kept (NativeDecodeStack.bind). Without the copies (over COPY_LIMIT_BYTES) the
matmuls are fp32 GEMVs up to 15 rows and torch's own sgemm beyond. Everything else runs the layers op by
op as before: a prefill chunk in the step, hooks on a projection, or rows that all share leading blocks
(the op-by-op attention reads a shared prefix once for the whole batch, the stack once per row).

A step with LoRA adapter tokens takes the stack too (kernels/cpu/stack_lora.py): the wrapped
projections' adapter stacks (worker/engine/lora/stacks.py: fp32, read in place, so a slot swapped in is
seen at the next call) are bound once per LoraStacks the manager builds, and each call passes the
rows' slots (LoraStep.slots); every wrapped projection then adds its rows' adapter products in the
call, as LoraLinear does op by op. A wrapper around anything but the module bound, or hooked, sends the
adapter steps op by op.

Which models take it (checked once, when the engine binds it; `ineligible` says why not): dense
models only (a mixture-of-experts config runs op by op: the stack has no router), every
projection a plain fp32 nn.Linear or an int8 / int4 quantized one (Int8Linear, Int4Linear, GPTQ
checkpoints included: the stack multiplies with the packed copy their op-by-op calls use,
`QuantLinear.cpu_weight`, in integers at every row count, whatever their `cpu_path`; fp8 or other
replaced modules run op by op), no bias but the optional qkv bias (Qwen2), fp32 norms (Qwen3's q/k norms included), fp32 contiguous KV caches, head
sizes the C attention kernel was compiled for. Sliding windows are per layer (Mistral's); Gemma's
layer (sandwich norms, GeGLU, soft-capping) is not the stack's and runs op by op. The pointers are taken at bind time: the engine never
swaps weights after loading; a caller that does must bind again (`model.decode_stack =
backend.decode_stack(model, kv_caches)`) or set it to None.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import structlog
import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu.decode_stack import (
    HALF_MATRICES,
    BoundDecodeStack,
    BoundLora,
    NativeDecodeStack,
    StackLayer,
    StackShape,
    pack_rows,
)
from kernels.cpu.draft_chain import DraftChain
from kernels.cpu.quant_matmul import QuantWeight
from kernels.cpu.stack_lora import LoraFactors, bind_lora
from kernels.reference.attention import decode_shared_blocks
from worker.engine.backends.base import AttentionMetadata
from worker.engine.lora.linear import LoraLinear
from worker.engine.lora.stacks import LoraStacks
from worker.engine.lora.step import LoraStep
from worker.engine.quant.linear import QuantLinear, native_quant_matmul

log = structlog.get_logger(__name__)

# The engine's stack copies the matrices (fp16 packed, or fp32 packed: at most their fp32 bytes once
# more in host memory) when their fp32 copies total at most this: every model the CPU
# decode stack is fast for. A larger one keeps fp32 GEMVs and torch's sgemm past 15 rows.
COPY_LIMIT_BYTES = 1 << 30


def ineligible(model: nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
               native: NativeDecodeStack) -> str | None:  # fmt: skip
    """Why this model cannot run through the decode stack, or None when it can."""
    cfg = model.cfg
    if cfg.moe is not None:  # the C stack runs one dense SwiGLU MLP per layer, no routing
        return f"{cfg.architecture} has mixture-of-experts layers (the C decode stack runs dense MLPs only)"
    if cfg.gemma or cfg.hidden_act != "silu" or cfg.attn_softcap:  # the stack's layer is Llama's
        return f"{cfg.architecture}'s layers (sandwich norms, GeGLU, soft-capping) are not the stack's"
    if getattr(model, "kv_grouped", False):  # the stack takes one block table for every layer
        return "its local and full layers keep KV in pools of their own (two block tables: kv_groups.py)"
    quantized: set[int] = set()  # ids of the quantized modules' parameters (int8 / uint8 / fp16 by design)
    for name, module in model.named_modules():
        if isinstance(module, QuantLinear):
            if module.qweight.device.type != "cpu" or native_quant_matmul() is None:
                return f"{name} is quantized and the CPU integer kernel is not available"
            if module.bias is not None and not name.endswith(("qkv_proj", "lm_head")):
                return f"{name} has a bias"
            quantized.update(id(p) for p in module.parameters())
        elif isinstance(module, nn.Linear) or name.endswith(("_proj", "lm_head")):
            if type(module) is not nn.Linear:
                return f"{name} is a {type(module).__name__}, not an nn.Linear or an int8 / int4 quantized one"
            if module.weight.dtype != torch.float32:
                return f"{name} holds {module.weight.dtype} weights (the stack is fp32)"
            if module.bias is not None and not name.endswith("qkv_proj"):
                return f"{name} has a bias"
    for param in model.parameters():
        if id(param) not in quantized and (param.dtype != torch.float32 or param.device.type != "cpu"):
            return f"a parameter is {param.dtype} on {param.device} (the stack is fp32 on the CPU)"
    for k, v in kv_caches:
        if k.dtype != torch.float32 or not (k.is_contiguous() and v.is_contiguous()):
            return "the KV cache is not contiguous fp32"
    shape = _shape(model)
    if not native.supports(shape, kv_caches[0][0].shape[1]):
        return f"no compiled attention for {cfg.num_heads} heads of {cfg.head_dim} over {cfg.num_kv_heads} KV heads"
    return None


def _shape(model: nn.Module) -> StackShape:
    cfg = model.cfg
    return StackShape(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
                      cfg.rms_norm_eps, cfg.head_dim**-0.5)  # fmt: skip


class ModelDecodeStack:
    """Call `takes` then the instance (CausalLM.forward does, for every step)."""

    def __init__(self, model: nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 native: NativeDecodeStack, half: bool = False, packed: bool = False,
                 head_copies: HeadCopies | None = None) -> None:  # fmt: skip
        """Binds the model's tensors (see the module docstring; check `ineligible` first). half: its
        matrices as fp16 copies (`halved`); packed: also copied packed (NativeDecodeStack.bind);
        head_copies: the fp32 lm_head's packed copy, multiplied in the call too (`logits`)."""
        body = model.model
        layers = []

        def mat(module: nn.Module) -> torch.Tensor | QuantWeight:
            if isinstance(module, QuantLinear):
                return module.cpu_weight()[0]
            return module.weight.detach().half().contiguous() if half else module.weight.detach()

        for layer, (k_cache, v_cache) in zip(body.layers, kv_caches, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            qk_norm = model.cfg.qk_norm
            qkv = attn.qkv_proj
            qkv_bias = qkv.cpu_weight()[1] if isinstance(qkv, QuantLinear) else _detach(qkv.bias)
            layers.append(StackLayer(
                layer.input_layernorm.weight.detach(), mat(qkv), qkv_bias,
                attn.q_norm.weight.detach() if qk_norm else None, attn.k_norm.weight.detach() if qk_norm else None,
                mat(attn.o_proj), layer.post_attention_layernorm.weight.detach(),
                mat(mlp.gate_up_proj), mat(mlp.down_proj), k_cache, v_cache, attn.window,
            ))  # fmt: skip
        self.half, self.packed = half, packed
        # the lm_head multiplies inside the stack's call (`logits`), on the product Backend.project
        # gives it (a quantized head's integer kernel, an fp32 head's packed copy), without a second
        # call (and a quantized head's own activation quantizing pass)
        head = getattr(model, "lm_head", None)
        head_weight: QuantWeight | torch.Tensor | None = None
        head_bias, vocab = None, 0
        self.head: nn.Module | None = None
        if isinstance(head, QuantLinear):
            self.head = head
            head_weight, head_bias = head.cpu_weight()
        elif head_copies is not None and head_copies.module is head:
            self.head, head_weight, vocab = head, head_copies.packed, head.weight.shape[0]
        if model.cfg.final_softcap:
            self.head, head_weight, head_bias = None, None, None
        self.head_copies = head_copies  # the fp32 head's copy, for Backend.project's other calls too
        self._stack: BoundDecodeStack = native.bind(_shape(model), layers, body.norm.weight.detach(), model.cos_sin,
                                                    half=half, packed=self.packed, head=head_weight,
                                                    head_bias=head_bias, head_rows=vocab)  # fmt: skip
        self._model, self._native = model, native
        # the projections bound, per layer: a LoRA wrapper around one of them is its product plus the
        # adapters' (`_adapters`)
        self._bound = [(layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
                       for layer in body.layers]  # fmt: skip
        # (the LoraStacks, their binding or None where the stack cannot carry them, the wrappers)
        self._lora: tuple[LoraStacks | None, BoundLora | None, list[nn.Module]] | None = None
        self._embed = body.embed_tokens.weight
        self._kv_caches = kv_caches
        # the modules the op-by-op path would call through Backend.project (hooks there must fire)
        self._projections = [m for m in model.modules() if isinstance(m, nn.Linear | QuantLinear)]
        self._block_size = kv_caches[0][0].shape[1]
        # windowed layers never cascade (the op-by-op path neither): a shared first block proves nothing
        self._windowed = any(0 < w < model.max_positions for w in model.cfg.layer_windows)
        self.gemv_rows, self.max_rows = self._stack.gemv_rows, self._stack.max_rows

    def takes(self, input_ids: torch.Tensor, meta: AttentionMetadata,
              kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:  # fmt: skip
        """A pure decode step over the bound caches (1..gemv_rows rows, or up to max_rows on one
        thread), with inputs laid out as the kernel reads them, no forward hook on any projection and
        no prefix shared by every row (see the module docstring)."""
        if not (self.fits(input_ids.shape[0]) and meta.num_prefill_tokens == 0 and meta.output_rows is None
                and kv_caches is self._kv_caches):  # fmt: skip
            return False
        rows = input_ids.shape[0]
        tables, lens, slots = meta.decode_block_tables, meta.decode_context_lens, meta.slot_mapping
        if not (tables.dtype == lens.dtype == torch.int32 and tables.stride(1) == 1 and lens.is_contiguous()
                and slots.dtype == torch.int64 and slots.is_contiguous()):  # fmt: skip
            return False
        for m in self._projections:  # (a plain loop: this runs every step)
            if m._forward_hooks or m._forward_pre_hooks:
                return False
        lora = self._model.lora
        if lora is not None and lora.active and (self._adapters(lora) is None or lora.slots.shape[0] != rows):
            return False
        if rows > 1 and tables.device.type == "cpu" and not self._windowed:
            host = tables.numpy()  # numpy compares small tables without torch's per-op dispatch
            first = host[:, 0]
            # a prefix shared by several sequences: the op-by-op cascade reads it once; the rows of one
            # sequence (speculation's verify rows: identical tables) read it per row here, still cheaper
            if ((first == first[0]).all() and not (host == host[0]).all()
                    and decode_shared_blocks(tables, lens.tolist(), self._block_size)):  # fmt: skip
                return False
        return True

    @classmethod
    def for_engine(cls, model: nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                   native: NativeDecodeStack) -> ModelDecodeStack:  # fmt: skip
        """The stack the CPU backend binds: fp16 matrices when they hold fp16 values exactly, packed
        copies (both within COPY_LIMIT_BYTES; see the module docstring), the fp32 lm_head's included
        (HeadCopies, bound for `logits`)."""
        mats = _matrices(model)
        if sum(w.numel() * 4 for w in mats) > COPY_LIMIT_BYTES:
            return cls(model, kv_caches, native)
        head = getattr(model, "lm_head", None)
        copies = HeadCopies.of(head, native.pack_width) \
            if type(head) is nn.Linear and head.weight.dtype == torch.float32 else None  # fmt: skip
        return cls(model, kv_caches, native, half=bool(mats) and all(exactly_half(w) for w in mats), packed=True,
                   head_copies=copies)  # fmt: skip

    def halved(self) -> ModelDecodeStack | None:
        """The same stack with its fp32 matrices (qkv, o_proj, gate_up, down) as fp16 copies, when every
        one of them holds fp16 values exactly (a checkpoint stored in fp16): the same products from
        half the bytes (up to gemv_rows rows). None when a value would round, or none is fp32."""
        mats = _matrices(self._model)
        if not (mats and all(exactly_half(w) for w in mats)):
            return None
        return ModelDecodeStack(self._model, self._kv_caches, self._native, half=True)

    def draft_chain(self, head: torch.Tensor, packed: torch.Tensor | None = None,
                    head_ids: np.ndarray | None = None) -> DraftChain:  # fmt: skip
        """A draft model's whole proposal in one call over this stack (kernels/cpu/draft_chain.py), with
        its lm_head weight `head` (fp32, or an fp16 copy holding the same values; or the rows of the
        tokens head_ids) and its packed copy (pack_rows, in head's dtype) or None."""
        return DraftChain(self._stack, self._embed, head, packed, head_ids)

    def fits(self, rows: int) -> bool:
        """1..gemv_rows rows on any number of threads, up to max_rows on one."""
        return 0 < rows <= self.max_rows and (rows <= self.gemv_rows or torch.get_num_threads() == 1)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The final-normed hidden states [rows, hidden] (what the layer loop and the final norm give)."""
        return self._stack(*self._step_inputs(input_ids, positions, meta), **self._step_adapters())

    def head_takes(self) -> bool:
        """Whether `logits` runs the lm_head in the call: a head is bound, with no hook on it, and a
        quantized one on the integer kernel its module's own forward runs (cpu_path "kernel")."""
        head = self.head
        return head is not None and getattr(head, "cpu_path", "kernel") == "kernel" \
            and not (head._forward_hooks or head._forward_pre_hooks)  # fmt: skip

    def logits(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The fp32 logits [rows, vocab] of every row of a step `takes` took (head_takes): the final norm
        and the lm_head in the stack's call, what compute_logits gives on __call__'s rows."""
        return self._stack.logits(*self._step_inputs(input_ids, positions, meta), **self._step_adapters())

    def _step_inputs(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> tuple:
        """The stack call's row arguments for a step `takes` took: embedded rows, int64 positions,
        slots, block tables and context lengths."""
        return (F.embedding(input_ids, self._embed), positions.to(torch.int64).contiguous(), meta.slot_mapping,
                meta.decode_block_tables, meta.decode_context_lens)  # fmt: skip

    def _step_adapters(self) -> dict:
        """The stack call's adapter arguments for the step `takes` took: its bound adapters and the
        rows' slots when it has adapter tokens, else none."""
        step = self._model.lora
        if step is None or not step.active:
            return {}
        assert self._lora is not None and self._lora[0] is step.stacks and self._lora[1] is not None  # takes checked
        return {"lora": self._lora[1], "lora_slots": step.slots}

    def _adapters(self, step: LoraStep) -> BoundLora | None:
        """The step's adapters bound to the stack (once per LoraStacks), or None when they cannot run in
        it: a wrapped projection that is not the module bound, factors the stack does not take (not
        fp32), or a hook on a wrapper (the op-by-op path calls it)."""
        if self._lora is None or self._lora[0] is not step.stacks:
            self._lora = (step.stacks, *self._bind_adapters())
        _, bound, wrappers = self._lora
        for m in wrappers:  # (a plain loop: this runs every adapter step)
            if m._forward_hooks or m._forward_pre_hooks:
                return None
        return bound

    def _bind_adapters(self) -> tuple[BoundLora | None, list[nn.Module]]:
        layers: list[dict[str, LoraFactors]] = []
        wrappers: list[nn.Module] = []
        for layer, bound in zip(self._model.model.layers, self._bound, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            mine = {}
            for name, module, base in zip(HALF_MATRICES, (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj),
                                          bound, strict=True):  # fmt: skip
                if isinstance(module, LoraLinear) and module.base is base:
                    st = module.stack
                    mine[name] = LoraFactors(st.a, st.b, st.scaling, st.bounds)
                    wrappers.append(module)
                elif module is not base:
                    log.info("decode_stack_lora_off", reason=f"{type(module).__name__} is not the projection bound")
                    return None, []
            layers.append(mine)
        try:
            return bind_lora(self._stack, layers), wrappers
        except ValueError as exc:
            log.info("decode_stack_lora_off", reason=str(exc))
            return None, []

    def rows(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, tables: torch.Tensor,
             context_lens: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """__call__ without AttentionMetadata (speculation's DraftStack): int64 ids, positions and
        slots, int32 tables [rows, W] and context lengths, in the layouts `takes` checks."""
        return self._stack(F.embedding(input_ids, self._embed), positions, slots, tables, context_lens)


@dataclass(frozen=True)
class HeadCopies:
    """The lm_head's copy, made with the engine's stack and bound to it (its `logits`), and for the CPU
    backend's `project` on the steps the stack does not take: packed for
    gemm.h (steps of packed_rows rows or more, every step: no per-call packing, bench/cpu_wide_decode.py
    times the lm_head after the stack), in fp16 when every value is an fp16 value (`half`: half the bytes,
    the same products). No unpacked fp16 copy is kept: every step takes the packed one."""

    module: nn.Linear
    half: bool
    packed: torch.Tensor

    @classmethod
    def of(cls, head: nn.Linear, pack_width: int) -> HeadCopies | None:
        """The copy of a plain nn.Linear's fp32 weight, or None over COPY_LIMIT_BYTES."""
        w = head.weight.detach()
        if w.numel() * 4 > COPY_LIMIT_BYTES:
            return None
        half = exactly_half(w)
        return cls(head, half, pack_rows(w.half() if half else w, pack_width))


def _matrices(model: nn.Module) -> list[torch.Tensor]:
    """Every layer's qkv, o_proj, gate_up and down weights that are fp32 (not quantized)."""
    modules = [m for layer in model.model.layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                           layer.mlp.gate_up_proj, layer.mlp.down_proj)]  # fmt: skip
    return [m.weight for m in modules if not isinstance(m, QuantLinear)]


def _detach(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def exactly_half(t: torch.Tensor) -> bool:
    """Every value of an fp32 tensor is an fp16 value (a copy in fp16 loses nothing)."""
    return t.dtype == torch.float32 and bool(torch.equal(t.detach().half().float(), t.detach()))
