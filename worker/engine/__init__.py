"""freight's inference engine: a plain library (no jobs/, no Celery). See docs/ARCHITECTURE.md.

Exports resolve on first use (PEP 562): `import worker.engine` alone loads no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contracts.sampling import SamplingParams
    from worker.engine.config import EngineConfig
    from worker.engine.engine import Engine
    from worker.engine.outputs import CompletionOutput, RequestOutput
    from worker.engine.stats import EngineStats, StatsSnapshot

_EXPORTS = {
    "EngineConfig": "worker.engine.config",
    "Engine": "worker.engine.engine",
    "RequestOutput": "worker.engine.outputs",
    "CompletionOutput": "worker.engine.outputs",
    "SamplingParams": "contracts.sampling",
    "EngineStats": "worker.engine.stats",
    "StatsSnapshot": "worker.engine.stats",
}
__all__ = ["CompletionOutput", "Engine", "EngineConfig", "EngineStats", "RequestOutput", "SamplingParams", "StatsSnapshot"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
