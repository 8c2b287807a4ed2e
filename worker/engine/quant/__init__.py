"""Weight-only quantization: int8 per output channel, int4 group-wise (round to nearest or GPTQ).

The engine's loader calls `prepare_quantized_model` for a checkpoint whose config.json has a
`quantization_config`, and `quantize_model` for `EngineConfig.quantization` on a full-precision one.
"""

from worker.engine.quant.config import QuantizationConfig
from worker.engine.quant.linear import Int4Linear, Int8Linear
from worker.engine.quant.swap import decoder_linears, prepare_quantized_model, quantize_model

__all__ = [
    "Int4Linear",
    "Int8Linear",
    "QuantizationConfig",
    "decoder_linears",
    "prepare_quantized_model",
    "quantize_model",
]
