"""The sizes a config.json implies, checked before anything is allocated.

A config is the checkpoint's description of itself, and a wrong or hostile one (intermediate_size
10^9, max_position_embeddings 10^12) would make the loader allocate terabytes and die in a
traceback, or take the machine's memory from everything else. `check_model_size` runs on the model
built on the meta device (its tensors have shapes and dtypes but no storage) and refuses, with one
line, a model whose parameters the checkpoint's tensors cannot fill (config and weights of different
models) or whose parameters and rotary tables do not fit the device's free memory.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

# Values a checkpoint element can carry at most: a 4-bit GPTQ checkpoint packs 8 weights in each
# int32 element, MXFP4 two per byte; 16 leaves room for both and their scales. A config that implies
# more parameters than this x the checkpoint's elements describes another model.
PACKING_MAX = 16
SLACK_ELEMENTS = 1 << 20  # norms and biases a checkpoint may leave to their defaults


def checkpoint_elements(files: list[Path]) -> int:
    """Elements of every tensor in the safetensors files, from their headers alone."""
    total = 0
    for file in files:
        with file.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            numel = 1
            for d in info["shape"]:
                numel *= int(d)
            total += numel
    return total


def free_bytes(device: torch.device) -> int:
    """Memory free for the model on `device`: the GPU's free memory, or the host's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_model_size(model: torch.nn.Module, files: list[Path], device: torch.device, rotary_bytes: int) -> None:
    """ValueError (one line) when the meta-device `model` cannot be the checkpoint in `files`, or when
    its parameters (as allocated: before any cast) and `rotary_bytes` of rotary tables exceed what
    `device` has free. Reads only the files' headers."""
    params = {id(p): p for p in model.parameters()}.values()  # tied weights once
    elements = sum(p.numel() for p in params)
    stored = checkpoint_elements(files)
    if elements > PACKING_MAX * stored + SLACK_ELEMENTS:
        raise ValueError(
            f"config.json implies {elements:,} parameters but the checkpoint's tensors hold {stored:,} "
            "values: config.json (hidden_size, intermediate_size, num_hidden_layers, vocab_size) and the "
            "weights are of different models"
        )
    need = sum(p.numel() * p.element_size() for p in params) + sum(b.numel() * b.element_size() for b in model.buffers())
    need += rotary_bytes
    free = free_bytes(device)
    if need > free:
        raise ValueError(
            f"the model needs {_gib(need)} on {device} (weights as loaded {_gib(need - rotary_bytes)}, rotary "
            f"tables {_gib(rotary_bytes)}) but {_gib(free)} is free: check config.json, pass a smaller "
            "max_model_len (the rotary tables grow with it), or use a machine with more memory"
        )
