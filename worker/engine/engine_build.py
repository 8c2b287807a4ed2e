"""How an Engine is built from a checkpoint folder (Engine.from_pretrained): the device and threads,
the model's config and tokenizer, a draft model (refused before the target's weights load), the
weights, the KV pools out of what the budget leaves after the decode graphs and the draft, the CUDA
graphs, and a frozen heap (see below)."""

from __future__ import annotations

import atexit
import dataclasses
import gc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import structlog
import torch

from worker.engine.backends import select_backend
from worker.engine.config import EngineConfig
from worker.engine.decode_graphs import activation_bytes
from worker.engine.kv_groups import kv_context_bound, kv_pool_sizes
from worker.engine.loader import load_model, read_config
from worker.engine.model_runner import ModelRunner
from worker.engine.models import ModelConfig
from worker.engine.speculation.draft import DraftModel
from worker.engine.tokenizer import Tokenizer

log = structlog.get_logger(__name__)

CPU_DEFAULT_KV_BYTES = 1 << 30
E = TypeVar("E")  # Engine (not imported: engine.py imports this module)


def build_engine(engine_cls: Callable[..., E], model_dir: Path, config: EngineConfig) -> E:
    """engine_cls (Engine) over the checkpoint in model_dir, loaded as `config` says."""
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA device; use device='cpu'")
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    mcfg = ModelConfig.from_dict(read_config(model_dir))
    if mcfg.moe is not None and config.cuda_graphs:
        # MoE routing sizes its expert blocks from counts read back to the host (torch.bincount,
        # repeat_interleave), which stream capture forbids: such models decode eagerly for now
        log.warning("cuda_graphs_off", reason="mixture-of-experts routing syncs with the host")
        config = dataclasses.replace(config, cuda_graphs=False, static_decode=False)
    # a sliding window does not cap the context: blocks its window left are released (block_manager)
    # and no sequence outgrows the KV pool: the context served (and the rotary tables built for it)
    # is at most what the KV budget holds, whatever max_position_embeddings says
    max_len = min(mcfg.max_position_embeddings, config.max_model_len or 1 << 62,
                  kv_context_bound(mcfg, config.torch_dtype, kv_budget(config)) or 1 << 62)  # fmt: skip
    tokenizer = Tokenizer(model_dir)  # before the weights: a folder without one fails at once
    backend = select_backend(config.backend, config.torch_device)
    draft = None
    if config.speculative is not None and config.speculative.method == "draft":  # refused before the weights load
        draft = DraftModel(config.speculative.draft_model, config, backend, tokenizer, mcfg.vocab_size, max_len)
    model = load_model(model_dir, config, backend, max_positions=max_len)
    # the decode graphs' memory pool comes out of the KV budget (a generous bound of its size)
    graph_bytes = activation_bytes(model, config.max_num_seqs, config.torch_dtype) if config.cuda_graphs else 0
    draft_bytes = draft.kv_bytes if draft is not None else 0
    budget = max(0, kv_budget(config) - graph_bytes - draft_bytes)
    num_blocks, num_local_blocks = kv_pool_sizes(model, config, budget, max_len)
    runner = ModelRunner(model, num_blocks, config.block_size, config.torch_device, config.torch_dtype,
                         config.decode_stack, num_local_blocks)  # fmt: skip
    log.info("engine_ready", model_dir=str(model_dir), backend=backend.name, num_blocks=num_blocks,
             num_local_blocks=num_local_blocks, max_model_len=max_len)  # fmt: skip
    engine = engine_cls(model_dir, config, runner, tokenizer, max_len, num_blocks, draft)
    if config.cuda_graphs:
        before = torch.cuda.memory_reserved(config.torch_device)
        seconds = runner.graphs.capture()
        log.info("cuda_graphs_captured", sizes=runner.graphs.sizes, seconds=round(seconds, 2),
                 pool_bytes=torch.cuda.memory_reserved(config.torch_device) - before,
                 reserved_bytes=graph_bytes)  # fmt: skip
    # Everything alive now (torch, the model, the libraries: ~300k objects) lives as long as the
    # engine. Freezing it keeps Python's cyclic collector from walking it again on each full
    # collection of a bulk job, each such walk a pause as long as the heap is big
    # (bench/job_overhead.py: the time a 20,000-row job spends outside the engine).
    # Unfreezing first lets this collection reclaim what an earlier engine froze and dropped.
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)
    atexit.register(gc.unfreeze)  # the final collection at exit sees them (nanobind counts leaks)
    return engine


def kv_budget(config: EngineConfig) -> int:
    """The KV cache's bytes: the config's, else 1 GiB on the CPU, else the GPU memory fraction's free part."""
    if config.kv_cache_bytes is not None:
        return config.kv_cache_bytes
    if config.torch_device.type == "cpu":
        return CPU_DEFAULT_KV_BYTES
    free, total = torch.cuda.mem_get_info(config.torch_device)
    return max(0, int(total * config.gpu_memory_fraction) - (total - free))
