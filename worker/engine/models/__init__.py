"""Model implementations. One decoder covers every supported architecture (see model_config)."""

from worker.engine.models.decoder import CausalLM
from worker.engine.models.model_config import SUPPORTED_ARCHITECTURES, ModelConfig

__all__ = ["SUPPORTED_ARCHITECTURES", "CausalLM", "ModelConfig"]
