"""On-the-fly quantization settings a job may ask for, checked at submit and used by the loader."""

from __future__ import annotations

QUANTIZATIONS = ("int8", "int4", "fp8")
INT4_GROUP_SIZES = (32, 64, 128)  # int4 groups along K; the CPU kernels' activation blocks too


def check_quant_group(quantization: str | None, quant_group: int | None) -> None:
    """Raise ValueError unless quant_group is None or an int4 group size asked with int4."""
    if quant_group is None:
        return
    if quantization != "int4":
        raise ValueError(f"--quant-group sets int4's group size: it needs --quantization int4, not {quantization}")
    if quant_group not in INT4_GROUP_SIZES:
        raise ValueError(f"int4 group size {quant_group} is not supported; use one of {INT4_GROUP_SIZES}")


def quantization_label(quantization: str | None, quant_group: int | None) -> str | None:
    """One string for what the loader does to the weights: "int4-g32" with a group, else quantization."""
    return quantization if quant_group is None else f"{quantization}-g{quant_group}"
