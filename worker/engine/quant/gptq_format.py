"""Reading the common GPTQ checkpoint format (AutoGPTQ / GPTQModel, `quant_method: "gptq"`).

Per quantized Linear (K inputs, N outputs, group size G, 4 bits):
- `qweight` int32 [K // 8, N]: word i of column n holds k = 8i + j in bits 4j..4j+3, unsigned u.
- `qzeros` int32 [K // G, N // 8]: word c of group row g holds n = 8c + j in bits 4j..4j+3; the
  format "gptq" (v1) stores zero - 1, "gptq_v2" stores the zero itself.
- `scales` [K // G, N] (fp16), `g_idx` int32 [K]: the group of each input k.
Dequantized: w[n, k] = scales[g_idx[k], n] * (u[k, n] - zero[g_idx[k], n]).

freight's layout is symmetric (q = u - zero in [-8, 7]) with groups k // G, so checkpoints whose
zeros make q leave that range, or whose g_idx is not k // G (act-order kept at run time), are refused
with a message rather than loaded wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from worker.engine.quant.formats import pack_int4
from worker.engine.quant.linear import Int4Linear, frozen_parameter

if TYPE_CHECKING:
    from kernels.cpu.quant_matmul import QuantWeight

_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int64)  # nibble j sits at bits 4j..4j+3


def _unpack_nibbles(words: torch.Tensor, dim: int) -> torch.Tensor:
    """int32 words -> int64 nibbles in [0, 15], eight per word, expanded along `dim` (0 or 1)."""
    w = words.to(torch.int64) & 0xFFFFFFFF  # reinterpret as unsigned 32-bit
    nib = (w.unsqueeze(-1) >> _SHIFTS) & 0xF  # [..., 8]
    if dim == 0:  # [R, C, 8] -> [R * 8, C]
        return nib.permute(0, 2, 1).reshape(words.shape[0] * 8, words.shape[1])
    return nib.reshape(words.shape[0], words.shape[1] * 8)  # [R, C * 8]


def gptq_to_freight(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    group_size: int,
    checkpoint_format: str = "gptq",
    name: str = "layer",
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ 4-bit tensors -> freight int4 (qweight uint8 [N, K // 2], scales [N, K // G])."""
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise ValueError(
            f"{name}: GPTQ qweight/qzeros must be int32 (4-bit packing), got {qweight.dtype}/{qzeros.dtype}"
        )
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    if group_size <= 0:  # GPTQ's -1: one group over all of K
        group_size = k
    if k % group_size or scales.shape != (k // group_size, n) or qzeros.shape != (k // group_size, n // 8):
        raise ValueError(
            f"{name}: GPTQ shapes qweight {tuple(qweight.shape)}, qzeros "
            f"{tuple(qzeros.shape)}, scales {tuple(scales.shape)} do not fit group size "
            f"{group_size}"
        )
    groups = torch.arange(k) // group_size
    if g_idx is not None and not torch.equal(g_idx.to(torch.int64).cpu(), groups):
        raise ValueError(
            f"{name}: g_idx is not k // group_size (a desc_act / act-order checkpoint "
            "with run-time reordering); freight loads GPTQ checkpoints with desc_act false"
        )
    u = _unpack_nibbles(qweight, dim=0)  # [K, N]
    zeros = _unpack_nibbles(qzeros, dim=1)  # [K // G, N]
    if checkpoint_format == "gptq":
        zeros = zeros + 1
    elif checkpoint_format != "gptq_v2":
        raise ValueError(
            f"{name}: unknown GPTQ checkpoint_format {checkpoint_format!r}; expected 'gptq' or 'gptq_v2'"
        )
    q = u - zeros[groups]  # [K, N]
    if int(q.min()) < -8 or int(q.max()) > 7:
        raise ValueError(
            f"{name}: GPTQ zeros are not symmetric (values leave [-8, 7] after subtracting "
            "the zero point); freight loads symmetric (sym: true) GPTQ checkpoints only"
        )
    return pack_int4(q.T.contiguous()), scales.T.contiguous()


class GPTQInt4Linear(Int4Linear):
    """Int4Linear that loads GPTQ-format tensors under the same names and converts them once.

    Before the first forward (or `convert_()`): `qweight` int32 [K // 8, N], `qzeros` int32
    [K // G, N // 8], `scales` [K // G, N], `g_idx` int32 [K], as in the checkpoint. After: freight's
    `qweight` / `scales` (Int4Linear's layout), the GPTQ-only tensors dropped.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group_size: int = 128,
        bias: bool = False,
        dtype: torch.dtype = torch.float16,
        device: torch.device | str | None = None,
        checkpoint_format: str = "gptq",
    ) -> None:
        super().__init__(in_features, out_features, group_size, bias, dtype, device)
        if in_features % 8 or out_features % 8:
            raise ValueError(
                f"GPTQ 4-bit packing needs in/out features divisible by 8, got {in_features}x{out_features}"
            )
        groups = in_features // group_size
        self.checkpoint_format = checkpoint_format
        self.qweight = frozen_parameter(
            torch.zeros(in_features // 8, out_features, dtype=torch.int32, device=device)
        )
        self.qzeros = frozen_parameter(
            torch.zeros(groups, out_features // 8, dtype=torch.int32, device=device)
        )
        self.scales = frozen_parameter(torch.ones(groups, out_features, dtype=dtype, device=device))
        self.g_idx = frozen_parameter(
            torch.arange(in_features, dtype=torch.int32, device=device) // group_size
        )
        self.converted = False

    @property
    def shard_dims(self) -> dict[str, tuple[int | None, int]]:
        """How the engine's loader stacks q/k/v (gate/up) checkpoint tensors into this fused module:
        tensor -> (dim holding output columns or None if shared by all shards, columns per element)."""
        if self.converted:
            return {}
        return {"qweight": (1, 1), "scales": (1, 1), "qzeros": (1, 8), "g_idx": (None, 1)}

    def convert_(self) -> None:
        """Turn the loaded GPTQ tensors into freight's int4 layout, in place (idempotent)."""
        if self.converted:
            return
        # the engine runs forward under inference_mode; the converted weights must stay ordinary
        # tensors (version-counted, usable outside it), as if loaded
        with torch.inference_mode(False), torch.no_grad():
            self._convert()

    def _convert(self) -> None:
        device = self.qweight.device
        qweight, scales = gptq_to_freight(
            self.qweight.cpu(),
            self.qzeros.cpu(),
            self.scales.cpu(),
            self.g_idx.cpu(),
            self.group_size,
            self.checkpoint_format,
        )
        self.qweight = frozen_parameter(qweight.to(device))
        self.scales = frozen_parameter(scales.to(device))
        del self.qzeros, self.g_idx
        self.converted = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.convert_()
        return super().forward(x)

    def cpu_weight(self) -> tuple[QuantWeight, torch.Tensor | None]:
        self.convert_()
        return super().cpu_weight()
