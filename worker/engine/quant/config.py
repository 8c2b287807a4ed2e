"""Quantization settings of a checkpoint (config.json `quantization_config`) or of an on-the-fly run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.engine.quant.formats import INT4_GROUP_SIZES

QUANT_METHODS = ("freight", "gptq")
WEIGHT_FORMATS = ("int", "fp8_e4m3")  # freight checkpoints at 8 bits: int8 or float8 e4m3 weights


@dataclass(frozen=True)
class QuantizationConfig:
    """What the decoder Linear modules hold.

    quant_method: "freight" (freight's own layouts) or "gptq" (the common GPTQ 4-bit format,
    converted to freight's int4 layout when first used).
    bits: 8 (per output channel) or 4 (group-wise along K). group_size: int4 only.
    weight_format: "int" (int8 / int4) or "fp8_e4m3" (8 bits: e4m3 weights with fp32 per-channel
    scales, activations quantized per token at run time).
    method: how a freight checkpoint was made ("rtn" | "gptq"); informational at load.
    modules_to_not_convert: Linear names (suffixes) left in full precision.
    lm_head: the output head is quantized too, like the decoder Linears (GPTQ's `lm_head` key, and
    freight's); False: it stays in full precision. Models whose head is tied to the embeddings keep it.
    """

    quant_method: str = "freight"
    bits: int = 8
    group_size: int = 128
    method: str = "rtn"
    checkpoint_format: str = "gptq"  # gptq only: "gptq" stores zero - 1, "gptq_v2" the zero
    weight_format: str = "int"
    modules_to_not_convert: tuple[str, ...] = ()
    lm_head: bool = False

    def __post_init__(self) -> None:
        if self.quant_method not in QUANT_METHODS:
            raise ValueError(
                f"quant_method {self.quant_method!r} is not supported; use one of {QUANT_METHODS}"
            )
        if self.bits not in (4, 8) or (self.quant_method == "gptq" and self.bits != 4):
            raise ValueError(
                f"{self.quant_method} checkpoints with {self.bits} bits are not supported "
                "(freight: 8 or 4, gptq: 4)"
            )
        if self.weight_format not in WEIGHT_FORMATS or (self.weight_format == "fp8_e4m3" and self.bits != 8):
            raise ValueError(
                f"weight_format {self.weight_format!r} with {self.bits} bits is not supported; use one of "
                f"{WEIGHT_FORMATS} ('fp8_e4m3' with bits 8)"
            )
        if self.method not in ("rtn", "gptq"):
            raise ValueError(f"quantization method {self.method!r} is not supported; use 'rtn' or 'gptq'")
        if self.lm_head and self.weight_format != "int":
            raise ValueError("a quantized lm_head is int8 or int4; fp8 checkpoints keep it in full precision")
        if self.bits == 4 and self.quant_method == "freight" and self.group_size not in INT4_GROUP_SIZES:
            raise ValueError(
                f"int4 group size {self.group_size} is not supported; use one of {INT4_GROUP_SIZES}"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantizationConfig:
        """Parse a config.json `quantization_config`; unknown keys are ignored."""
        method = d.get("quant_method")
        if method == "gptq":
            if d.get("sym") is False:
                raise ValueError(
                    "asymmetric GPTQ checkpoints (sym: false) are not supported; "
                    "freight's int4 layout is symmetric"
                )
            if d.get("desc_act"):
                raise ValueError(
                    "GPTQ checkpoints with desc_act true are not supported; "
                    "requantize with desc_act false (or use `freight quantize`)"
                )
            return cls(
                quant_method="gptq",
                bits=int(d.get("bits", 4)),
                group_size=int(d.get("group_size", 128)),
                method="gptq",
                checkpoint_format=str(d.get("checkpoint_format", "gptq")),
                modules_to_not_convert=tuple(d.get("modules_to_not_convert") or ()),
                lm_head=bool(d.get("lm_head", False)),
            )
        if method == "freight":
            return cls(
                quant_method="freight",
                bits=int(d["bits"]),
                group_size=int(d.get("group_size", 128)),
                method=str(d.get("method", "rtn")),
                weight_format=str(d.get("weight_format", "int")),
                modules_to_not_convert=tuple(d.get("modules_to_not_convert") or ()),
                lm_head=bool(d.get("lm_head", False)),
            )
        raise ValueError(
            f"quantization_config.quant_method {method!r} is not supported; freight loads {QUANT_METHODS}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The config.json form of a freight checkpoint (ARCHITECTURE.md, Quantized checkpoints)."""
        if self.quant_method != "freight":
            raise ValueError("only freight's own quantization_config is written")
        out: dict[str, Any] = {
            "quant_method": "freight",
            "bits": self.bits,
            "group_size": self.group_size,
            "method": self.method,
        }  # group_size is unused at 8 bits
        if self.weight_format != "int":
            out["weight_format"] = self.weight_format
        if self.modules_to_not_convert:
            out["modules_to_not_convert"] = list(self.modules_to_not_convert)
        if self.lm_head:
            out["lm_head"] = True
        return out
