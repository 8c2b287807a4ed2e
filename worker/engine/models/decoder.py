"""One decoder-only transformer for Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2 and 3 and the
mixture-of-experts kin (Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss: the MLP of a sparse layer is
models/moe.py's block) over a paged KV cache. Gemma's block (cfg.gemma) adds a norm after attention and one after the
MLP, scales the embeddings by sqrt(hidden) and stores its (1 + w) norm weights with the 1 folded in
at load (fold_norm_offsets); a layer's sliding window and attention soft-cap go to the backend.

Module and parameter names follow Hugging Face's, except that q/k/v and gate/up projections are
fused into one nn.Linear each (`qkv_proj`, `gate_up_proj`: FUSED_PROJECTIONS). All
projections stay nn.Linear modules so worker.engine.quant can swap them. Inputs are flat (varlen):
T tokens of many sequences in one [T, ...] tensor; no padding.

The layer loop is the engine's hot path (a decode step runs it once per layer for the whole batch):
the layers, norms, attention and MLP modules are entered through `.forward` directly, not through
nn.Module.__call__ (whose hook bookkeeping, some 10 calls a layer, is host time every step pays;
bench/step_overhead.py measures it); hooks on them
do not fire. The projections (nn.Linear or its quantized replacements) go through
Backend.project, which calls any module that has hooks of its own (quantization calibration hooks
them) and applies a plain nn.Linear directly.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.attention_options import AttentionOptions
from worker.engine.backends.base import AttentionMetadata, Backend
from worker.engine.models.model_config import ModelConfig
from worker.engine.models.moe import SparseMoeBlock
from worker.engine.models.rotary import cos_sin_cache, longrope_offset

# Hugging Face projection -> (the fused module holding it, its shard index in it). Shards are
# stacked along dim 0 (output rows) in this order, for every tensor of the module: weight, bias,
# qweight, scales, ... The other projections (o_proj, down_proj) keep their names.
FUSED_PROJECTIONS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, backend: Backend) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.backend = backend

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.backend.rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: Backend, layer: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.scale = cfg.attn_scale
        self.window = cfg.window(layer)  # 0: full attention; else keys older than this many positions are masked
        self.softcap = cfg.attn_softcap
        # windowed layers rotate with their own table where the config gives them one (Gemma 3)
        self.local_rope = bool(self.window) and cfg.local_rope_theta is not None
        self.kv_group = cfg.kv_group(layer)  # 1: a local layer of a model with two KV cache groups
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_proj_bias)
        # gpt-oss: a learned logit per query head that joins each softmax's denominator (no value)
        self.sinks = nn.Parameter(torch.empty(cfg.num_heads)) if cfg.attention_sinks else None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, backend)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, backend)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        positions: torch.Tensor,  # int64 [T]
        meta: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        cos_sin: torch.Tensor,
        rows_only: bool = False,
    ) -> torch.Tensor:
        """[T, hidden] -> [T, hidden], or [N, hidden] for meta.output_rows with `rows_only`."""
        cfg = self.cfg
        tokens = x.shape[0]
        q, k, v = self.backend.project(self.qkv_proj, x).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.reshape(tokens, cfg.num_heads, cfg.head_dim)  # strided views of the qkv output; rotary writes in place
        k = k.reshape(tokens, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(tokens, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q = self.q_norm.forward(q.reshape(-1, cfg.head_dim))[0].view(tokens, cfg.num_heads, cfg.head_dim)
            k = self.k_norm.forward(k.reshape(-1, cfg.head_dim))[0].view(tokens, cfg.num_kv_heads, cfg.head_dim)
        self.backend.rotary_store(q, k, v, positions, cos_sin, kv_cache[0], kv_cache[1], meta)
        attend = self.backend.attend_rows if rows_only else self.backend.attend
        options = AttentionOptions(None if self.sinks is None else self.sinks.float(), self.window, self.softcap)
        out = attend(q, kv_cache[0], kv_cache[1], meta, self.scale, options)
        return self.backend.project(self.o_proj, out.reshape(-1, cfg.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: Backend, intermediate_size: int | None = None) -> None:
        """intermediate_size: cfg.intermediate_size unless given (a MoE model's shared expert)."""
        super().__init__()
        self.backend = backend
        size = intermediate_size or cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * size, bias=False)
        self.down_proj = nn.Linear(size, cfg.hidden_size, bias=False)
        self.geglu = cfg.hidden_act == "gelu_pytorch_tanh"  # else SwiGLU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        backend = self.backend
        gate_up = backend.project(self.gate_up_proj, x)
        act = backend.gelu_tanh_mul(gate_up) if self.geglu else backend.silu_mul(gate_up)
        return backend.project(self.down_proj, act)


def _mlp(cfg: ModelConfig, backend: Backend, layer: int) -> nn.Module:
    """Layer `layer`'s MLP: dense, or a sparse mixture of experts (models/moe.py) where cfg.moe says."""
    if cfg.moe is None or not cfg.moe.is_sparse(layer):
        return MLP(cfg, backend)
    shared = MLP(cfg, backend, cfg.moe.shared_expert_size) if cfg.moe.shared_expert_size else None
    return SparseMoeBlock(cfg, backend, shared)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: Backend, layer: int = 0) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, backend, layer)
        self.mlp = _mlp(cfg, backend, layer)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, backend)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, backend)
        self.gemma = cfg.gemma
        if cfg.gemma:  # sandwich norms: post_attention_layernorm normalizes the attention output
            self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, backend)
            self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, backend)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        cos_sin: torch.Tensor,
        rows_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """rows_only: every row's K/V goes to the cache; the output holds meta.output_rows only."""
        h, residual = self.input_layernorm.forward(x, residual)
        h = self.self_attn.forward(h, positions, meta, kv_cache, cos_sin, rows_only)
        if rows_only:
            residual = residual.index_select(0, meta.output_rows)
        if self.gemma:  # residual + norm(attn), then residual + norm(mlp(norm(.)))
            h = self.post_attention_layernorm.forward(h)[0]
            h, residual = self.pre_feedforward_layernorm.forward(h, residual)
            return self.post_feedforward_layernorm.forward(self.mlp.forward(h))[0], residual
        h, residual = self.post_attention_layernorm.forward(h, residual)
        return self.mlp.forward(h), residual


class DecoderBody(nn.Module):
    """Hugging Face's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig, backend: Backend) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, backend, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, backend)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: Backend, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.model = DecoderBody(cfg, backend)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.max_positions = max_positions
        # Filled by init_rotary() once the model sits on its device (not checkpoint tensors);
        # cos_sin_local: the windowed layers' table where they have their own rope (Gemma 3).
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)
        self.register_buffer("cos_sin_local", torch.empty(0), persistent=False)
        # Gemma: embeddings times sqrt(hidden), rounded to the model's dtype as transformers does (set at load)
        self.embed_scale: float | None = None
        # Backend.decode_stack's fused path for the steps it takes (set by ModelRunner); None: op by op.
        self.decode_stack = None
        # the LoRA adapters' per-step token slots, read by the wrapped projections (lora/step.py; set by
        # lora/manager.py when the engine serves adapters) and by a decode stack that carries them
        self.lora = None
        # the local layers' caches are a pool of their own (set by ModelRunner; kv_groups.py)
        self.kv_grouped = False
        # LongRoPE: the cos/sin table's all-long half starts at this row (models/rotary.py); 0: none
        local = cfg.local_rope_theta is not None  # a second table without that half (no model has both)
        self.long_rope_rows = 0 if local else longrope_offset(max_positions, cfg.rope_scaling)

    def rope_offset(self, num_prompt_tokens: int) -> int:
        """What a sequence with this many prompt tokens adds to its positions to get its rows of the
        cos/sin table (forward's `positions`): the all-long half for a prompt longer than LongRoPE's
        threshold (transformers rotates every position of it with the long factors), else 0."""
        threshold = self.cfg.longrope_threshold
        return self.long_rope_rows if self.long_rope_rows and num_prompt_tokens > threshold else 0

    def rotary_bytes(self) -> int:
        """Bytes init_rotary's fp32 tables take (each [max_positions (+ LongRoPE's all-long half),
        head_dim]), x 2 for the positions x frequencies products built on the way (host memory)."""
        rows = self.max_positions + self.long_rope_rows
        tables = 2 if self.cfg.local_rope_theta is not None else 1
        return 2 * tables * rows * self.cfg.head_dim * 4

    def init_rotary(self, device: torch.device) -> None:
        cfg = self.cfg
        self.cos_sin = cos_sin_cache(
            cfg.head_dim, self.max_positions, cfg.rope_theta, cfg.rope_scaling, cfg.rotary_dim or None
        ).to(device)
        if cfg.local_rope_theta is not None:
            self.cos_sin_local = cos_sin_cache(
                cfg.head_dim, self.max_positions, cfg.local_rope_theta, cfg.local_rope_scaling, cfg.rotary_dim or None
            ).to(device)

    def fold_norm_offsets(self) -> None:
        """Gemma's RMSNorm multiplies by (1 + w): add the 1 into every norm weight once, after loading
        (computed in fp32, then stored in the weight's dtype), so the norms run as plain RMSNorm."""
        if not self.cfg.gemma:
            return
        dtype = self.model.embed_tokens.weight.dtype
        self.embed_scale = torch.tensor(self.cfg.hidden_size**0.5, dtype=dtype).item()
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, RMSNorm):
                    module.weight.copy_(module.weight.float() + 1.0)

    def tie_weights(self) -> None:
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,  # int64 [T]
        positions: torch.Tensor,  # int64 [T]: rows of the cos/sin table (see below)
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (k_cache, v_cache)
        stacked: bool | None = None,
    ) -> torch.Tensor:
        """Final hidden states (normed): [T, hidden], or [N, hidden] for meta.output_rows when set
        (the last layer then skips the other rows: only their K/V are needed, by later tokens).
        `positions` feed the rotary only (attention reads meta): each token's position, plus its
        sequence's rope_offset in a prefill (LongRoPE's all-long rows for a prompt past the threshold;
        0 for every other model; decodes need none: step_inputs). stacked: `stack_takes` of this step
        when the caller has asked it already (None: asked here)."""
        if stacked is None:
            stacked = self.stack_takes(input_ids, meta, kv_caches)
        if stacked:
            return self.decode_stack(input_ids, positions, meta)
        body = self.model
        x = body.embed_tokens(input_ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        residual = None
        tables = (self.cos_sin, self.cos_sin_local)
        # two KV cache groups (kv_groups.py): the local layers' caches are a pool of their own, read
        # through meta.local; a model without (or a draft model's runner, one pool) reads meta only
        metas = (meta, meta if meta.local is None else meta.local)
        if self.kv_grouped and meta.local is None:
            raise ValueError("this model's local layers have a KV pool of their own: the step needs meta.local")
        last = len(body.layers) - 1
        for i, (layer, kv_cache) in enumerate(zip(body.layers, kv_caches, strict=True)):
            rows_only = i == last and meta.output_rows is not None
            attn = layer.self_attn
            x, residual = layer.forward(x, residual, positions, metas[attn.kv_group], kv_cache, tables[attn.local_rope],
                                        rows_only)  # fmt: skip
        return body.norm.forward(x, residual)[0]

    def stack_takes(self, input_ids: torch.Tensor, meta: AttentionMetadata,
                    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:  # fmt: skip
        """Whether the bound decode stack runs this step's layers in one call (it takes the step: its
        LoRA adapter tokens too, where it can carry them); asked once per step."""
        stack = self.decode_stack
        return stack is not None and stack.takes(input_ids, meta, kv_caches)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> fp32 logits [N, vocab] (soft-capped where the config says: Gemma 2)."""
        logits = self.backend.project(self.lm_head, hidden).float()
        cap = self.cfg.final_softcap
        if cap:
            logits = torch.tanh(logits / cap).mul_(cap)
        return logits
