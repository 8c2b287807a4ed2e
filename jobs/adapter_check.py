"""The LoRA adapter check that runs before a job is planned: each adapter folder's
adapter_config.json and safetensors header against the job's model, without torch.

An adapter the engine would refuse at load is refused here, naming it, before OUT/manifest.json
exists (the rules are contracts/lora's, the engine's own): files missing or pickled, options
freight does not compute, target modules it does not wrap, a rank over the limit, missing or extra
weights, another base's shapes or base_model_name_or_path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from contracts.lora.check import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterLayout,
    base_name_problem,
    check_adapter,
)
from contracts.lora.config import AdapterError, LoraAdapterConfig
from jobs.errors import AdapterRefusedError
from jobs.model_check import read_header
from jobs.settings import Settings
from jobs.storage import open_store

PICKLED = "adapter_model.bin"


def check_adapters(adapters: Mapping[str, str], model: str, config: dict[str, Any], model_name: str | None = None,
                   settings: Settings | None = None) -> dict[str, AdapterLayout]:  # fmt: skip
    """Raise AdapterRefusedError, one line naming the adapter, unless every adapter (name -> folder or
    s3:// prefix) is a PEFT LoRA adapter freight serves over `model` (config: its config.json;
    model_name: the name requests give it). Returns each adapter's layout."""
    return {name: check_one(name, path, model, config, model_name, settings) for name, path in adapters.items()}


def check_one(name: str, path: str, model: str, config: dict[str, Any], model_name: str | None = None,
              settings: Settings | None = None) -> AdapterLayout:  # fmt: skip
    store = open_store(path, settings)
    who = f"adapter {name} ({path})"
    if not store.exists(ADAPTER_CONFIG):
        raise AdapterRefusedError(f"{who} has no {ADAPTER_CONFIG}: give a PEFT adapter folder "
                                  f"({ADAPTER_CONFIG} + {ADAPTER_WEIGHTS}, as PeftModel.save_pretrained writes)")  # fmt: skip
    if not store.exists(ADAPTER_WEIGHTS):
        pickled = store.exists(PICKLED)
        raise AdapterRefusedError(
            f"{who} has no {ADAPTER_WEIGHTS}"
            + (f" (only the pickle {PICKLED}, which freight refuses to load: save the adapter with "
               "safe_serialization=True)" if pickled else "")  # fmt: skip
        )
    try:
        raw = json.loads(store.get(ADAPTER_CONFIG))
    except ValueError as exc:
        raise AdapterRefusedError(f"{who}: {ADAPTER_CONFIG} is not valid JSON ({exc})") from None
    header = read_header(store, who, ADAPTER_WEIGHTS, AdapterRefusedError)
    tensors = {key: (str(info["dtype"]), [int(d) for d in info["shape"]]) for key, info in header.items()}
    try:
        adapter = LoraAdapterConfig.parse(name, raw)
        layout = check_adapter(adapter, tensors, config)
    except AdapterError as exc:
        raise AdapterRefusedError(str(exc)) from None
    problem = base_name_problem(adapter, [model, model_name, config.get("_name_or_path")])
    if problem is not None:
        raise AdapterRefusedError(problem)
    return layout
