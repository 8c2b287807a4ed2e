"""freight's inference engine: a plain library (no jobs/, no Celery). See docs/ARCHITECTURE.md."""

from worker.engine.config import EngineConfig
from worker.engine.engine import Engine
from worker.engine.outputs import RequestOutput
from worker.engine.sampling_params import SamplingParams
from worker.engine.stats import EngineStats, StatsSnapshot

__all__ = ["Engine", "EngineConfig", "EngineStats", "RequestOutput", "SamplingParams", "StatsSnapshot"]
