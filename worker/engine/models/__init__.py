"""Model implementations. One decoder covers every supported architecture.

The config.json rules (supported architectures, required keys, rope and window layouts) are
contracts/checkpoint/'s, shared with the control plane's model check. Exports resolve on first use
(PEP 562), so `worker.engine.models.moe_config` imports without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contracts.checkpoint.architectures import SUPPORTED_ARCHITECTURES
    from worker.engine.models.decoder import CausalLM
    from worker.engine.models.model_config import ModelConfig

_EXPORTS = {
    "SUPPORTED_ARCHITECTURES": "contracts.checkpoint.architectures",
    "CausalLM": "worker.engine.models.decoder",
    "ModelConfig": "worker.engine.models.model_config",
}
__all__ = ["SUPPORTED_ARCHITECTURES", "CausalLM", "ModelConfig"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
