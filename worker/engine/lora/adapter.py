"""LoraAdapter: one PEFT LoRA adapter folder loaded into host memory, checked against the base model.

The checks are contracts/lora's (the submit-time check runs the same ones from the files' headers):
adapter_config.json's options, target modules, ranks, missing or extra weights, the base's shapes
and name. The factors are kept on the host in the model's dtype (pinned for a CUDA engine, so a
swap-in to the device is an asynchronous copy); the device holds only the resident ones
(lora/slots.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from contracts.lora.check import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterLayout,
    base_name_problem,
    check_adapter,
)
from contracts.lora.config import AdapterError, LoraAdapterConfig


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    folder: Path
    layout: AdapterLayout
    # Hugging Face module name -> (A [r, in], B [out, r]) on the host, in the model's dtype
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]
    # (path, size, mtime_ns) of the weights file: an adapter folder rewritten in place is loaded again
    stamp: tuple[str, int, int]

    @property
    def rank(self) -> int:
        return self.layout.max_rank

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.factors.values())


def weights_stamp(folder: Path) -> tuple[str, int, int]:
    """What identifies the adapter's weights file as loaded: its resolved path, size and mtime."""
    path = (folder / ADAPTER_WEIGHTS).resolve()
    st = path.stat()
    return str(path), st.st_size, st.st_mtime_ns


def load_adapter(name: str, folder: Path, base_config: dict[str, Any], base_names: list[str | None],
                 dtype: torch.dtype, pin: bool = False) -> LoraAdapter:  # fmt: skip
    """The adapter in `folder` (local), checked against the base model (its config.json and the names
    it goes by). Raises AdapterError (a ValueError) naming the adapter."""
    if not (folder / ADAPTER_CONFIG).is_file():
        raise AdapterError(f"adapter {name}: {folder} has no {ADAPTER_CONFIG}: give a PEFT adapter folder "
                           f"({ADAPTER_CONFIG} + {ADAPTER_WEIGHTS})")  # fmt: skip
    if not (folder / ADAPTER_WEIGHTS).is_file():
        raise AdapterError(f"adapter {name}: {folder} has no {ADAPTER_WEIGHTS} (freight never loads pickle "
                           "adapter_model.bin: save the adapter with safe_serialization=True)")  # fmt: skip
    try:
        raw = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except ValueError as exc:
        raise AdapterError(f"adapter {name}: {ADAPTER_CONFIG} is not valid JSON ({exc})") from None
    config = LoraAdapterConfig.parse(name, raw)
    stamp = weights_stamp(folder)
    with safe_open(str(folder / ADAPTER_WEIGHTS), framework="pt", device="cpu") as f:
        keys = list(f.keys())  # noqa: SIM118 (safe_open is not a mapping)
        headers = {k: (f.get_slice(k).get_dtype(), list(f.get_slice(k).get_shape())) for k in keys}
        layout = check_adapter(config, headers, base_config)
        problem = base_name_problem(config, base_names)
        if problem is not None:
            raise AdapterError(problem)
        factors = {}
        for module in layout.modules:
            a, b = (f.get_tensor(k).to(dtype).contiguous() for k in (module.a_key, module.b_key))
            if pin:
                a, b = a.pin_memory(), b.pin_memory()
            factors[module.name] = (a, b)
    return LoraAdapter(name, folder, layout, factors, stamp)
