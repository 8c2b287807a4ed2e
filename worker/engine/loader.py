"""Load a Hugging Face checkpoint folder into a CausalLM: path-based, safetensors only.

Quantization hooks (worker.engine.quant): if config.json carries "quantization_config", the model
is handed to `prepare_quantized_model(model, quantization_config)` on the meta device BEFORE any
tensor loads, so the quantized modules' state-dict names (e.g. `...qkv_proj.qweight`) load by name
through internal_name(); if EngineConfig.quantization is set and the checkpoint is not quantized,
`quantize_model(model, method)` runs after loading.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import structlog
import torch
from safetensors import safe_open

from worker.engine.backends.base import Backend
from worker.engine.config import EngineConfig
from worker.engine.host_memory import pack_parameters
from worker.engine.model_size import check_model_size
from worker.engine.models import CausalLM, ModelConfig
from worker.engine.models.decoder import FUSED_PROJECTIONS
from worker.engine.models.expert_weights import expert_pieces, expert_tensor, moe_name
from worker.engine.models.gpt_oss_weights import GptOssTensors
from worker.engine.models.rotary import partial_rotary_order

log = structlog.get_logger(__name__)

_FUSED_RE = re.compile(rf"^(.*\.)({'|'.join(FUSED_PROJECTIONS)})\.([A-Za-z_]+)$")
_IGNORED_RE = re.compile(r"(rotary_emb\.inv_freq|\.masked_bias|\.attn\.bias)$")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def internal_name(hf_name: str) -> tuple[str, int | None]:
    """Checkpoint tensor name -> (our state-dict name, shard index in a fused module or None).

    "model.layers.3.self_attn.k_proj.qweight" -> ("model.layers.3.self_attn.qkv_proj.qweight", 1)
    Per-expert tensors of a MoE model are not handled here (expert_weights.expert_tensor).
    """
    hf_name = moe_name(hf_name)
    m = _FUSED_RE.match(hf_name)
    if m is None:
        return hf_name, None
    module, shard = FUSED_PROJECTIONS[m.group(2)]
    return f"{m.group(1)}{module}.{m.group(3)}", shard


def fused_shard_rows(cfg: ModelConfig, internal: str) -> list[int]:
    """Output rows of each shard of the fused module that `internal` (a tensor name) belongs to."""
    if ".qkv_proj." in internal:
        return [cfg.q_size, cfg.kv_size, cfg.kv_size]
    if ".gate_up_proj." in internal:
        size = cfg.moe.shared_expert_size if cfg.moe is not None and ".shared_expert." in internal else None
        return [size or cfg.intermediate_size] * 2
    raise ValueError(f"{internal} is not part of a fused module")


def read_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} has no config.json; pass a Hugging Face checkpoint folder")
    return json.loads(path.read_text(encoding="utf-8"))


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint; refuses pickle-only folders."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index.name} lists missing shards {missing}; the download is incomplete")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for p in model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(
            f"{model_dir} holds only pickle weights ({', '.join(pickles)}); freight never loads pickle "
            "files because they can run code. Convert the checkpoint to safetensors first (e.g. "
            "model.save_pretrained(dir, safe_serialization=True) in a trusted environment)."
        )
    raise ValueError(f"{model_dir} has no model.safetensors (or sharded index); nothing to load")


def load_model(model_dir: Path, config: EngineConfig, backend: Backend, max_positions: int) -> CausalLM:
    """Build the model on the meta device, materialise it on config.device and load the weights."""
    raw = read_config(model_dir)
    cfg = ModelConfig.from_dict(raw)
    files = checkpoint_files(model_dir)
    quant_config = raw.get("quantization_config")
    if isinstance(quant_config, dict) and quant_config.get("quant_method") == "mxfp4":
        quant_config = None  # gpt-oss's MXFP4 experts: dequantized as they load (models/gpt_oss_weights.py)
    if quant_config is not None and cfg.rotary_dim:
        raise ValueError(
            f"{cfg.architecture} with partial rotary (rotary_dim {cfg.rotary_dim} of head_dim {cfg.head_dim}) "
            "cannot load a pre-quantized checkpoint yet; load the unquantized one and pass "
            "EngineConfig(quantization=...) to quantize it at load"
        )
    with torch.device("meta"):
        model = CausalLM(cfg, backend, max_positions)
    if quant_config is not None:
        from worker.engine.quant import prepare_quantized_model

        prepare_quantized_model(model, quant_config, config.torch_device)
    elif config.quantization is not None:
        from worker.engine.quant import check_quantization

        check_quantization(model, config.quantization, config.torch_device, config.quant_group)  # before any weight loads
    check_model_size(model, files, config.torch_device, model.rotary_bytes())  # before anything is allocated
    model.to_empty(device=config.torch_device)
    model.to(config.torch_dtype)  # floating-point tensors only; packed integer weights keep theirs
    model.tie_weights()
    _load_tensors(model, cfg, files)
    model.fold_norm_offsets()
    if cfg.rotary_dim:
        _permute_rotary_dims(model, cfg)
    model.init_rotary(config.torch_device)
    if config.quantization is not None and quant_config is None:
        from worker.engine.quant import quantize_model

        quantize_model(model, config.quantization, config.quant_group)
    model.eval()
    if config.torch_device.type == "cpu":  # weights streamed in layer order from huge pages (host_memory)
        pack_parameters(model)
    log.info("model_loaded", model_dir=str(model_dir), architecture=cfg.architecture, files=len(files))
    return model


def _shard_dim(model: CausalLM, name: str) -> tuple[int | None, int]:
    """(dim along which a fused module stacks its shards, output rows per element) for one tensor.

    Dim 0, one row per element, unless the module says otherwise in `shard_dims` (quantized
    modules: GPTQ keeps output columns on dim 1, eight per int32 in qzeros).
    """
    module_name, _, tensor = name.rpartition(".")
    return getattr(model.get_submodule(module_name), "shard_dims", {}).get(tensor, (0, 1))


def _permute_rotary_dims(model: CausalLM, cfg: ModelConfig) -> None:
    """Partial rotary: reorder each q and k head's dimensions (rows of qkv_proj) as
    rotary.partial_rotary_order says, so the full-width rotary kernels rotate exactly the rotary
    dimensions; v and o_proj are untouched, and q . k does not change."""
    order = partial_rotary_order(cfg.head_dim, cfg.rotary_dim)
    heads = cfg.num_heads + cfg.num_kv_heads  # q heads, then k heads, in qkv_proj's rows
    rows = (torch.arange(heads)[:, None] * cfg.head_dim + order[None, :]).reshape(-1)
    with torch.no_grad():
        for layer in model.model.layers:
            proj = layer.self_attn.qkv_proj
            for t in (proj.weight, proj.bias):
                if t is not None:
                    t[: rows.numel()] = t.index_select(0, rows.to(t.device))


def _checkpoint_tensors(f: Any, hf_name: str, gpt_oss: GptOssTensors | None) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs one checkpoint tensor gives: itself, or gpt-oss's experts converted."""
    if gpt_oss is None:
        return [(hf_name, f.get_tensor(hf_name))]
    return gpt_oss.convert(hf_name, f.get_tensor(hf_name))


def _load_tensors(model: CausalLM, cfg: ModelConfig, files: list[Path]) -> None:
    targets = dict(model.named_parameters())
    targets.update((n, b) for n, b in model.named_buffers() if not n.startswith("cos_sin"))
    needed = {name: 1 for name in targets}
    for name in targets:
        if ".qkv_proj." in name or ".gate_up_proj." in name:
            needed[name] = len(fused_shard_rows(cfg, name))
        elif cfg.moe is not None:
            needed[name] = expert_pieces(name, cfg.moe.num_experts) or 1
    seen: dict[str, set[object]] = {}
    gpt_oss = GptOssTensors() if cfg.architecture == "GptOssForCausalLM" else None
    with torch.no_grad():
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                names = [n for n in f.keys()  # noqa: SIM118 (safe_open is not a mapping)
                         if not (_IGNORED_RE.search(n) or (cfg.tie_word_embeddings and n == "lm_head.weight"))]  # fmt: skip
                for hf_name, src in (pair for n in names for pair in _checkpoint_tensors(f, n, gpt_oss)):
                    expert = expert_tensor(hf_name) if cfg.moe is not None else None
                    name, shard = (expert[0], expert[1:]) if expert else internal_name(hf_name)
                    if name not in targets:
                        raise ValueError(f"{file.name}: unexpected tensor {hf_name!r} for {cfg.architecture}")
                    dst = targets[name]
                    if expert is not None:  # one expert's slice of a stacked [E, ...] tensor
                        e, half = expert[1], expert[2]
                        if e >= dst.shape[0]:
                            raise ValueError(f"{hf_name}: expert {e} of {dst.shape[0]} (config.json's expert count)")
                        dst = dst[e] if half is None else dst[e].narrow(0, half * (dst.shape[1] // 2), dst.shape[1] // 2)
                    elif shard is not None:
                        rows = fused_shard_rows(cfg, name)
                        dim, per = _shard_dim(model, name)
                        if dim is not None:  # None: every shard carries the same tensor (GPTQ g_idx)
                            dst = dst.narrow(dim, sum(rows[:shard]) // per, rows[shard] // per)
                    if tuple(dst.shape) != tuple(src.shape):
                        raise ValueError(
                            f"{hf_name}: checkpoint shape {tuple(src.shape)} != expected {tuple(dst.shape)}"
                        )
                    dst.copy_(src)
                    seen.setdefault(name, set()).add(shard)
    if gpt_oss is not None:
        gpt_oss.finish(next(model.parameters()).dtype)
    # None in seen: the whole tensor loaded at once (an unfused or already stacked checkpoint tensor)
    missing = sorted(n for n, k in needed.items() if None not in seen.get(n, ()) and len(seen.get(n, ())) < k)
    if missing:
        raise ValueError(
            f"checkpoint is missing tensors for {missing[:5]}{' ...' if len(missing) > 5 else ''}"
        )
