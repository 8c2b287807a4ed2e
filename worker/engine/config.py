"""EngineConfig: how an Engine uses its hardware. Frozen and validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from contracts.lora.config import MAX_LORAS
from contracts.quantization import check_quant_group
from worker.engine.speculation.config import SpeculativeConfig

BACKEND_NAMES = ("auto", "cpu", "torch", "triton")
QUANTIZATION_METHODS = (None, "int8", "int4", "fp8")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class EngineConfig:
    """Scheduling, memory and numeric settings of one Engine.

    Memory for the paged KV cache comes from kv_cache_bytes when set, else (CUDA only) from
    gpu_memory_fraction of the device's total memory minus what the weights already use; on the CPU
    without kv_cache_bytes, 1 GiB.
    """

    device: str = "cpu"
    dtype: str = "auto"  # "auto": float32 on CPU, bfloat16 on CUDA; or a key of DTYPES
    block_size: int = 16  # tokens per KV block; prefix caching shares whole blocks
    max_num_seqs: int | None = None  # sequences in one step (decode width); None: min(256, token budget)
    max_num_batched_tokens: int = 2048  # tokens computed in one step (prefill chunks + decodes)
    kv_cache_bytes: int | None = None
    gpu_memory_fraction: float = 0.85
    enable_prefix_caching: bool = True
    backend: str = "auto"  # "auto": triton on CUDA, cpu (C decode kernel) on the CPU, else torch
    quantization: str | None = None  # quantize on the fly when the checkpoint is not quantized
    quant_group: int | None = None  # int4 on the fly: the group size (None: the largest dividing every layer)
    max_model_len: int | None = None  # cap on prompt + completion; None: the model's own limit
    seed: int = 0  # seed of requests whose SamplingParams.seed is None (salted by request index)
    # torch intra-op threads, set process-wide at load; None leaves torch's choice. On a CPU shared
    # with other busy processes, 1 avoids threads spin-waiting on each other, which can cost more
    # than the work (bench/engine_vs_hf.py --threads 1 and --threads 2 on a loaded machine show it).
    num_threads: int | None = None
    # Decode steps as CUDA graphs captured at start (padded batch sizes 1, 2, 4, 8, 16, ...). None: on
    # for CUDA; the CPU has no graphs (True there is refused).
    cuda_graphs: bool | None = None
    # Decode steps on the graphs' static padded buffers; None: exactly when cuda_graphs is on. On the
    # CPU it runs them eagerly (no speed-up: it exists so tests check padding changes no token).
    static_decode: bool | None = None
    # Schedule step n+1 while the device runs step n (its tokens are applied after). None: on for
    # CUDA; on the CPU there is nothing to overlap with (the host runs the model too).
    overlap_steps: bool | None = None
    # Pure decode steps through the backend's whole-stack decode where it has one (the CPU backend:
    # every layer in one C call, up to 15 rows on any thread count, more on one thread; fp32, int8 and
    # int4 models, others run op by op). False: always op by op (same tokens, to fp32 rounding).
    decode_stack: bool = True
    # Speculative decoding (speculation/config.py): None off. Its steps need the previous step's
    # tokens on the host, so it runs without overlapped steps (overlap_steps None turns off; True is refused).
    speculative: SpeculativeConfig | None = None
    # LoRA adapters resident on the device at once (lora/slots.py): a sequence whose adapter is not
    # resident waits for a slot no running sequence holds, swapped in from host memory (LRU).
    max_loras: int = 8

    def __post_init__(self) -> None:
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a positive power of two, got {self.block_size}")
        if self.max_num_seqs is None:
            object.__setattr__(self, "max_num_seqs", min(256, self.max_num_batched_tokens))
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}) so every running sequence can decode in each step"
            )
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes must be positive or None, got {self.kv_cache_bytes}")
        if not 0.0 < self.gpu_memory_fraction <= 1.0:
            raise ValueError(f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}")
        if self.backend not in BACKEND_NAMES:
            raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {self.backend!r}")
        if self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS}, got {self.quantization!r}")
        check_quant_group(self.quantization, self.quant_group)
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {self.num_threads}")
        cuda = self.torch_device.type == "cuda"
        if self.cuda_graphs and not cuda:
            raise ValueError(
                "cuda_graphs=True needs device='cuda': the CPU has no CUDA graphs (leave it None; "
                "static_decode=True runs the same padded decode buffers eagerly on the CPU)"
            )
        if self.cuda_graphs is None:
            object.__setattr__(self, "cuda_graphs", cuda)
        if self.static_decode is None:
            object.__setattr__(self, "static_decode", self.cuda_graphs)
        if self.cuda_graphs and not self.static_decode:
            raise ValueError("cuda_graphs=True replays the static decode buffers; drop static_decode=False")
        if self.speculative is not None and not isinstance(self.speculative, SpeculativeConfig):
            raise ValueError(f"speculative must be a SpeculativeConfig or None, got {type(self.speculative).__name__}")
        if self.speculative is not None and self.overlap_steps:
            raise ValueError("speculative decoding proposes from the tokens of the step before, which "
                             "overlapped steps have not applied yet; leave overlap_steps None or False")  # fmt: skip
        if self.overlap_steps is None:
            object.__setattr__(self, "overlap_steps", cuda and self.speculative is None)
        if not 1 <= self.max_loras <= MAX_LORAS:
            raise ValueError(f"max_loras must be in 1..{MAX_LORAS}, got {self.max_loras}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 or None, got {self.max_model_len}")

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.float32 if self.torch_device.type == "cpu" else torch.bfloat16
        return DTYPES[self.dtype]
