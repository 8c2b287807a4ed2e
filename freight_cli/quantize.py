"""`freight quantize`: write an int8 / int4 (RTN or GPTQ) weight-only or an fp8 (e4m3) quantized
checkpoint folder."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from freight_cli.common import fail
from jobs.errors import FreightError


def quantize(
    model: Path = typer.Argument(..., metavar="MODEL", help="full-precision Hugging Face checkpoint folder (safetensors)"),
    method: Literal["int8", "int4-rtn", "int4-gptq", "fp8"] = typer.Option(..., "--method", help="how to quantize"),
    output: Path = typer.Option(..., "--output", metavar="DIR", help="folder to create for the quantized checkpoint"),
    group_size: int = typer.Option(128, "--group-size", help="int4 group size along K: 32, 64 or 128"),
    calibration: Path | None = typer.Option(None, "--calibration",
                                            help="Parquet file of calibration rows (int4-gptq)"),
    calibration_column: str = typer.Option("prompt", "--calibration-column",
                                           help="text column of the calibration file"),
    calibration_rows: int = typer.Option(128, "--calibration-rows", help="rows to calibrate on"),
    act_order: bool = typer.Option(False, "--act-order", help="GPTQ: columns by decreasing Hessian diagonal"),
    damp: float = typer.Option(0.01, "--damp", help="GPTQ dampening: fraction of mean(diag H)"),
    lm_head: bool = typer.Option(False, "--lm-head",
                                 help="int8 / int4: quantize the output head too (round to nearest); its "
                                 "bytes are read every step, so small models decode faster"),
) -> None:
    """Write a quantized copy of MODEL (int8, int4 RTN or GPTQ, fp8) that `freight run --model` loads.

    Quantizes the decoder Linear weights. int8: per output channel; int4: group-wise; both symmetric. GPTQ needs
    --calibration (e.g. a sample of the job's own dataset). fp8: e4m3 weights with one fp32 scale
    per output channel, activations quantized per token at run time (GPUs of compute capability
    8.9+: L4, L40S, H100, H200; the CPU runs it exactly but at fp32 speed)."""
    # torch and the engine are imported here, not at module level: the other commands stay light.
    from worker.engine.quant.calibration import read_calibration_texts
    from worker.engine.quant.checkpoint import QuantizeSpec, quantize_checkpoint

    if calibration is not None and method != "int4-gptq":
        raise fail(f"--calibration is used only by int4-gptq, not {method}")
    if calibration_rows < 1:
        raise fail("--calibration-rows must be at least 1")
    from jobs.model_check import check_model

    try:
        check_model(str(model))  # config, tokenizer, weight headers: one line for a broken model
    except FreightError as exc:
        raise fail(str(exc)) from None
    try:
        spec = QuantizeSpec(method=method, group_size=group_size, damp=damp, act_order=act_order, lm_head=lm_head)
        texts = (read_calibration_texts(calibration, calibration_column, calibration_rows)
                 if calibration is not None else None)
        sizes = quantize_checkpoint(model, output, spec, texts)
    except ValueError as e:
        raise fail(str(e)) from e
    ratio = sizes["linear_bytes_after"] / max(sizes["linear_bytes_before"], 1)
    typer.echo(f"wrote {output}: {method}"
               f"{f' group {group_size}' if method.startswith('int4') else ''}, decoder Linear weights"
               f"{' and lm_head' if lm_head else ''} "
               f"{sizes['linear_bytes_before'] / 2**20:.2f} MiB -> {sizes['linear_bytes_after'] / 2**20:.2f} MiB "
               f"({ratio:.1%}, scales included)")


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""
    app.command("quantize")(quantize)
