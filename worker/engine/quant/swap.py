"""Swapping a built model's decoder nn.Linear modules for quantized ones (the model code is untouched).

Two entry points, both called by the engine's loader:
- `prepare_quantized_model`: before a quantized checkpoint's tensors are loaded, put modules whose
  parameter names match the checkpoint (`<name>.qweight`, `<name>.scales`, ...) where the Linears are.
- `quantize_model`: after full-precision weights are loaded, quantize them round-to-nearest in place.
Every nn.Linear is a decoder Linear except the output head (`lm_head`, unless the checkpoint's
config quantizes it too) and any name listed in `modules_to_not_convert`; fused modules (qkv, gate/up) are quantized as one matrix, which is exact
because every layout here is per output row.
"""

from __future__ import annotations

from typing import Any

import structlog
import torch
from torch import nn

from worker.engine.quant.config import QuantizationConfig
from worker.engine.quant.formats import INT4_GROUP_SIZES, check_group_size
from worker.engine.quant.fp8 import Fp8Linear, check_fp8_device, check_fp8_shape
from worker.engine.quant.gptq_format import GPTQInt4Linear
from worker.engine.quant.linear import Int4Linear, Int8Linear

log = structlog.get_logger(__name__)
SKIPPED = ("lm_head",)
ON_THE_FLY_METHODS = ("int8", "int4", "fp8")


def decoder_linears(model: nn.Module, skip: tuple[str, ...] = (), lm_head: bool = False) -> list[tuple[str, nn.Linear]]:
    """(qualified name, module) of every nn.Linear to quantize, in module order (lm_head too when
    asked)."""
    skip = (() if lm_head else SKIPPED) + tuple(skip)
    return [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and not any(name == s or name.endswith("." + s) for s in skip)
    ]


def expert_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """(qualified name, nn.Linear view) of every mixture-of-experts expert projection: the modules
    with `expert_linears()` (models/moe.Experts), which quantize_model hands to their `quantize`."""
    return [
        (f"{name}.{sub}", linear)
        for name, mod in model.named_modules()
        if callable(getattr(mod, "expert_linears", None))
        for sub, linear in mod.expert_linears()
    ]


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def _empty_quantized(linear: nn.Linear, cfg: QuantizationConfig) -> nn.Module:
    w = linear.weight
    bias = linear.bias is not None
    if cfg.quant_method == "gptq":
        return GPTQInt4Linear(
            linear.in_features,
            linear.out_features,
            cfg.group_size,
            bias,
            w.dtype,
            w.device,
            cfg.checkpoint_format,
        )
    if cfg.weight_format == "fp8_e4m3":
        return Fp8Linear(linear.in_features, linear.out_features, bias, w.dtype, w.device)
    if cfg.bits == 8:
        return Int8Linear(linear.in_features, linear.out_features, bias, w.dtype, w.device)
    return Int4Linear(linear.in_features, linear.out_features, cfg.group_size, bias, w.dtype, w.device)


def prepare_quantized_model(
    model: nn.Module, quantization_config: dict[str, Any], device: torch.device | None = None
) -> None:
    """Swap decoder Linears for modules that load the checkpoint described by `quantization_config`.
    `device`: where the model will run (the model itself is still on the meta device), for the
    checks that depend on it (fp8 needs a recent GPU, or the CPU).

    Raises ValueError (before changing anything) for an unsupported config, a device that cannot
    run it, or a layer whose shape does not fit it.
    """
    cfg = QuantizationConfig.from_dict(quantization_config)
    if cfg.lm_head and getattr(getattr(model, "cfg", None), "tie_word_embeddings", False):
        raise ValueError("the checkpoint quantizes lm_head, but this model ties lm_head to its embeddings; "
                         "quantize it again without the lm_head")  # fmt: skip
    targets = decoder_linears(model, cfg.modules_to_not_convert, cfg.lm_head)
    if cfg.bits == 4:
        for name, linear in targets:
            _check_int4_shape(name, linear, cfg.group_size)
    if cfg.weight_format == "fp8_e4m3" and device is not None:
        _check_fp8(targets, device)
        if device.type == "cpu":
            _warn_fp8_on_cpu()
    for name, linear in targets:
        replace_module(model, name, _empty_quantized(linear, cfg))
    log.info(
        "quantized modules prepared",
        quant_method=cfg.quant_method,
        bits=cfg.bits,
        weight_format=cfg.weight_format,
        group_size=cfg.group_size if cfg.bits == 4 else None,
        lm_head=cfg.lm_head,
        modules=len(targets),
    )


def quantize_model(model: nn.Module, method: str, group_size: int | None = None) -> None:
    """Quantize the loaded decoder Linears round-to-nearest: method "int8", "int4" (group-wise) or
    "fp8" (e4m3 per output channel; activations per token at run time).

    group_size None (int4): the largest allowed group (128, then 64, 32) that divides every layer's
    input dimension, so `--quantization int4` works on small models too. Raises ValueError (before
    changing anything) for an unknown method, a group size that does not divide some layer, or
    fp8 on a GPU that cannot multiply it.
    """
    targets = decoder_linears(model)
    device = targets[0][1].weight.device if targets else torch.device("cpu")
    check_quantization(model, method, device, group_size)
    if method == "int4" and group_size is None:
        group_size = _largest_group(targets + expert_linears(model))
    if method == "fp8" and device.type == "cpu":
        _warn_fp8_on_cpu()

    def make(linear: nn.Linear) -> nn.Module:
        if method == "int8":
            return Int8Linear.from_linear(linear)
        if method == "int4":
            return Int4Linear.from_linear(linear, group_size)
        return Fp8Linear.from_linear(linear)

    for name, linear in targets:
        replace_module(model, name, make(linear))
    expert_modules = [m for m in model.modules() if callable(getattr(m, "expert_linears", None))]
    for mod in expert_modules:
        mod.quantize(make)  # mixture-of-experts experts: one quantized module per expert projection
    log.info(
        "model quantized on the fly",
        method=method,
        group_size=group_size if method == "int4" else None,
        modules=len(targets),
        expert_modules=sum(len(m.quantized) for m in expert_modules),
    )


def check_quantization(model: nn.Module, method: str, device: torch.device, group_size: int | None = None) -> None:
    """What `quantize_model(model, method, group_size)` would refuse, checked on the model as built
    (the meta device is fine) for the device it will run on, so that a bad `--quantization` fails
    before the weights load. Raises ValueError."""
    if method not in ON_THE_FLY_METHODS:
        raise ValueError(f"unknown quantization {method!r}; use one of {ON_THE_FLY_METHODS}")
    targets = decoder_linears(model) + expert_linears(model)
    if method == "int4":
        group = group_size if group_size is not None else _largest_group(targets)
        for name, linear in targets:
            _check_int4_shape(name, linear, group)
    if method == "fp8":
        _check_fp8(targets, device)


def _largest_group(targets: list[tuple[str, nn.Linear]]) -> int:
    """The largest allowed int4 group size dividing every target's input dimension (or the
    largest allowed one, whose check then names the layer it does not fit)."""
    fits = [g for g in INT4_GROUP_SIZES if all(lin.in_features % g == 0 for _, lin in targets)]
    return max(fits) if fits else max(INT4_GROUP_SIZES)


def _check_int4_shape(name: str, linear: nn.Linear, group_size: int) -> None:
    check_group_size(linear.in_features, group_size, name)


def _warn_fp8_on_cpu() -> None:
    log.warning(
        "fp8_on_cpu",
        detail="no CPU kernel multiplies float8: the exact torch reference runs instead (activations "
        "rounded to e4m3 per token, the weights' e4m3 values widened to fp32 once), giving the fp8 "
        "model's outputs at about the fp32 model's speed and memory; int8 is the fast CPU format",
    )


def _check_fp8(targets: list[tuple[str, nn.Linear]], device: torch.device) -> None:
    check_fp8_device(device)
    for name, linear in targets:
        check_fp8_shape(name, linear, device)
