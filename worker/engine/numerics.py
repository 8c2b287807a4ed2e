"""The engine's numerics version: what an answer cached across jobs depends on besides the model and
the request (the result cache keys on it, worker/result_cache.py).

Bump NUMERICS_VERSION when a change may move a near-tie: a kernel's accumulation order, a matmul or
attention backend's precision, the sampler's draw, the logits processing order. Device type and dtype
are part of the id too: the CPU (float32) and CUDA (bfloat16) paths round differently.
"""

from __future__ import annotations

from typing import Any

NUMERICS_VERSION = 1


def numerics_id(device_type: str, dtype: str) -> str:
    """e.g. "1/cpu/float32": the numerics an answer was computed with."""
    return f"{NUMERICS_VERSION}/{device_type}/{dtype.removeprefix('torch.')}"


def engine_numerics(config: Any) -> str:
    """The numerics id of an engine built with `config` (worker/engine/config.py EngineConfig)."""
    return numerics_id(config.torch_device.type, str(config.torch_dtype))
