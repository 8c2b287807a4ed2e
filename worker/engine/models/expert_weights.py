"""Where a checkpoint's per-expert tensors go in the stacked expert weights (models/moe.py).

Checkpoints store each expert's projections apart: Mixtral as `block_sparse_moe.experts.{e}.w1/w3/w2`
(gate, up, down), the Qwen MoEs as `mlp.experts.{e}.gate_proj/up_proj/down_proj`. The engine keeps
one tensor per projection for all experts, as transformers does in memory: `mlp.experts.gate_up_proj`
[E, 2I, H] (gate rows, then up rows) and `mlp.experts.down_proj` [E, H, I]. A checkpoint already in
that stacked layout loads by name.
"""

from __future__ import annotations

import re

_EXPERT_RE = re.compile(
    r"^(.*\.)(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$"
)
# projection -> (stacked tensor, half of gate_up_proj it fills: 0 gate, 1 up; None: the whole slice)
_STACKED = {
    "w1": ("gate_up_proj", 0),
    "gate_proj": ("gate_up_proj", 0),
    "w3": ("gate_up_proj", 1),
    "up_proj": ("gate_up_proj", 1),
    "w2": ("down_proj", None),
    "down_proj": ("down_proj", None),
}


def moe_name(hf_name: str) -> str:
    """Mixtral's `block_sparse_moe.` module is the engine's (and transformers 5's) `mlp.`; gpt-oss's
    router (`mlp.router.`) is the engine's `mlp.gate.`."""
    return hf_name.replace(".block_sparse_moe.", ".mlp.").replace(".mlp.router.", ".mlp.gate.")


def expert_tensor(hf_name: str) -> tuple[str, int, int | None] | None:
    """A per-expert checkpoint tensor -> (stacked tensor's name, expert index, half or None); None
    for any other tensor.

    "model.layers.0.block_sparse_moe.experts.3.w3.weight" -> ("model.layers.0.mlp.experts.gate_up_proj", 3, 1)
    """
    m = _EXPERT_RE.match(hf_name)
    if m is None:
        return None
    stacked, half = _STACKED[m.group(3)]
    return f"{m.group(1)}mlp.experts.{stacked}", int(m.group(2)), half


def expert_pieces(name: str, num_experts: int) -> int | None:
    """How many checkpoint tensors fill the stacked tensor `name` (2 per expert for gate_up, 1 for
    down), or None when `name` is not a stacked expert tensor."""
    if name.endswith(".experts.gate_up_proj"):
        return 2 * num_experts
    if name.endswith(".experts.down_proj"):
        return num_experts
    return None
