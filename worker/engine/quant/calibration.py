"""Calibration for GPTQ: rows from a Parquet column, Hessians from the running model's activations.

`read_calibration_texts` takes the first non-empty strings of one column (deterministic).
`SequentialHessians` runs the prompts through a model once per decoder layer; before layer i's pass,
layers 0..i-1 already hold their quantized (dequantized) weights, so each layer is quantized
against the inputs it will really see (GPTQ's sequential order). Activations are captured by
forward pre-hooks on the layer's Linear modules; the model code is untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from worker.engine.quant.gptq import HessianAccumulator


def read_calibration_texts(path: Path, column: str = "prompt", max_rows: int = 128) -> list[str]:
    """The first `max_rows` non-empty strings of `column` in the Parquet file at `path`.

    Raises ValueError when the file is missing or unreadable, has no such column, or the column
    holds no non-empty strings.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"calibration file {path} does not exist; pass a Parquet file")
    try:
        schema = pq.read_schema(path)
    except (OSError, ValueError) as e:  # pyarrow raises ArrowInvalid (a ValueError) for non-Parquet
        raise ValueError(f"calibration file {path} is not a readable Parquet file: {e}") from e
    if column not in schema.names:
        raise ValueError(
            f"calibration file {path} has no column {column!r} (columns: {schema.names}); "
            "pass --calibration-column with one of them"
        )
    texts: list[str] = []
    for batch in pq.ParquetFile(path).iter_batches(columns=[column], batch_size=1024):
        for value in batch.column(0).to_pylist():
            if isinstance(value, str) and value.strip():
                texts.append(value)
                if len(texts) == max_rows:
                    return texts
    if not texts:
        raise ValueError(f"column {column!r} of {path} holds no non-empty strings to calibrate on")
    return texts


class SequentialHessians:
    """Per decoder layer, the Hessians of its Linear modules' inputs, layer after layer.

    `run_prompts(token_ids)` must run every prompt's prefill through `layers` (e.g. an engine's
    generate with one output token and prefix caching off). Usage:
        for i, hessians in calib.layers():   # hessians: {module name in layer: HessianAccumulator}
            ... quantize layer i, write its dequantized weights back into the module ...
    """

    def __init__(
        self,
        layers: Sequence[nn.Module],
        run_prompts: Callable[[list[list[int]]], object],
        prompts: list[list[int]],
    ) -> None:
        if not prompts:
            raise ValueError("GPTQ needs at least one calibration prompt")
        self.layers_ = list(layers)
        self.run_prompts = run_prompts
        self.prompts = prompts

    def layers(self):
        """Yield (layer index, {linear name inside the layer: HessianAccumulator})."""
        for i, layer in enumerate(self.layers_):
            linears = {n: m for n, m in layer.named_modules() if isinstance(m, nn.Linear)}
            accs = {n: HessianAccumulator(m.in_features) for n, m in linears.items()}
            handles = [m.register_forward_pre_hook(_capture(accs[n])) for n, m in linears.items()]
            try:
                with torch.no_grad():
                    self.run_prompts(self.prompts)
            finally:
                for h in handles:
                    h.remove()
            yield i, accs


def _capture(acc: HessianAccumulator):
    def hook(module: nn.Module, args: tuple) -> None:
        acc.add(args[0])

    return hook
