"""Quantized weights: int8 per output channel, int4 group-wise (round to nearest or GPTQ), both
weight-only, and fp8 e4m3 per output channel with per-token activation scales.

The engine's loader calls `prepare_quantized_model` for a checkpoint whose config.json has a
`quantization_config`, and `quantize_model` for `EngineConfig.quantization` on a full-precision one.
"""

from worker.engine.quant.config import QuantizationConfig
from worker.engine.quant.fp8 import Fp8Linear
from worker.engine.quant.linear import Int4Linear, Int8Linear
from worker.engine.quant.swap import (
    check_quantization,
    decoder_linears,
    prepare_quantized_model,
    quantize_model,
)

__all__ = [
    "Fp8Linear",
    "Int4Linear",
    "Int8Linear",
    "QuantizationConfig",
    "check_quantization",
    "decoder_linears",
    "prepare_quantized_model",
    "quantize_model",
]
