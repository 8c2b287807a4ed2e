"""gpt-oss's checkpoint expert tensors in the engine's stacked expert layout (models/moe.py).

transformers keeps gpt-oss's experts as `mlp.experts.gate_up_proj` [E, H, 2I] with gate and up
interleaved along the last dim (gate at even columns), `gate_up_proj_bias` [E, 2I] (interleaved
alike), `down_proj` [E, I, H] and `down_proj_bias` [E, H]. The engine's Experts hold every MoE's
`gate_up_proj` [E, 2I, H] (gate rows, then up rows) and `down_proj` [E, H, I]: converted here at load.
OpenAI's released checkpoints store the two projections in MXFP4 (quant/mxfp4.py): `*_blocks`
[E, rows, cols / 32, 16] and `*_scales` [E, rows, cols / 32], rows being output features
(`gate_up_proj_*`: 2I interleaved rows over H; `down_proj_*`: H rows over I). A block tensor and its
scales may sit in different files: each waits for the other, then is dequantized one expert at a time.
"""

from __future__ import annotations

import structlog
import torch

from worker.engine.quant.mxfp4 import dequantize_mxfp4

log = structlog.get_logger(__name__)

_MXFP4_PARTS = ("_blocks", "_scales")


def deinterleave(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Even entries along `dim` (gate), then odd ones (up)."""
    idx = torch.arange(t.shape[dim], device=t.device)
    return t.index_select(dim, torch.cat([idx[0::2], idx[1::2]]))


class GptOssTensors:
    """Turns gpt-oss checkpoint tensors into (engine name, tensor) pairs, MXFP4 pairs once both halves
    arrived; counts the MXFP4 bytes read and the bytes they became."""

    def __init__(self) -> None:
        self.pending: dict[str, dict[str, torch.Tensor]] = {}  # base name -> {"_blocks": t, "_scales": t}
        self.packed_bytes = 0
        self.dequantized_values = 0

    def convert(self, hf_name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """[] while an MXFP4 tensor waits for its other half; else [(name, tensor in the engine layout)]."""
        if ".mlp.experts." not in hf_name:
            return [(hf_name, tensor)]
        part = next((p for p in _MXFP4_PARTS if hf_name.endswith(p)), None)
        if part is not None:
            base = hf_name[: -len(part)]
            halves = self.pending.setdefault(base, {})
            halves[part] = tensor
            if len(halves) < 2:
                return []
            del self.pending[base]
            return [(base, self._dequantize(base, halves["_blocks"], halves["_scales"]))]
        if hf_name.endswith(".experts.gate_up_proj"):  # [E, H, 2I] interleaved -> [E, 2I, H] gate, up
            return [(hf_name, deinterleave(tensor.transpose(1, 2), 1).contiguous())]
        if hf_name.endswith(".experts.gate_up_proj_bias"):
            return [(hf_name, deinterleave(tensor, 1).contiguous())]
        if hf_name.endswith(".experts.down_proj"):  # [E, I, H] -> [E, H, I]
            return [(hf_name, tensor.transpose(1, 2).contiguous())]
        return [(hf_name, tensor)]

    def _dequantize(self, base: str, blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        if blocks.dim() != 4 or scales.dim() != 3 or blocks.shape[0] != scales.shape[0]:
            raise ValueError(f"{base}_blocks {tuple(blocks.shape)} / _scales {tuple(scales.shape)}: not MXFP4 experts")
        weight = torch.stack([dequantize_mxfp4(blocks[e], scales[e]) for e in range(blocks.shape[0])])  # [E, rows, cols]
        self.packed_bytes += blocks.numel() * blocks.element_size() + scales.numel() * scales.element_size()
        self.dequantized_values += weight.numel()
        if base.endswith(".gate_up_proj"):
            weight = deinterleave(weight, 1).contiguous()  # rows: gate, then up
        return weight

    def finish(self, dtype: torch.dtype) -> None:
        """Raise if a block tensor never met its scales (or the reverse); log the MXFP4 bytes read and
        the bytes the experts take dequantized to `dtype` (the model's)."""
        if self.pending:
            base, halves = next(iter(self.pending.items()))
            missing = next(p for p in _MXFP4_PARTS if p not in halves)
            raise ValueError(f"checkpoint has {base}{next(iter(halves))} but no {base}{missing}: an incomplete MXFP4 checkpoint")
        if self.packed_bytes:
            size = torch.empty((), dtype=dtype).element_size()
            log.info("mxfp4_dequantized", packed_bytes=self.packed_bytes, dtype=str(dtype).removeprefix("torch."),
                     dequantized_bytes=self.dequantized_values * size,
                     reason="freight has no MXFP4 matmul on any device: the experts run dequantized")  # fmt: skip
