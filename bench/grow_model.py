"""Grow a small Llama checkpoint into a wider, deeper one that computes the same function.

Why: a fresh model of pycoder-tiny's shape (4 layers, hidden 256) stays on the copy warm-up's
plateau for thousands of steps (train_reference.py --copy-warmup), while one of the draft's shape
(2 layers, hidden 128) leaves it within about two thousand. Growing the copying draft into the target's shape keeps
its induction circuit intact at step 0; training on the corpus then fills in the new capacity
(Net2Net, Chen et al. 2016; the same idea as stacking/width growth in LLM pre-training).

How the function is kept (source hidden hs, target hidden hd, the same head_dim and heads per KV
group): the source's values live in the residual stream's first hs dimensions and the rest stay
zero, because every tensor that writes the residual stream (the embedding, o_proj, down_proj) is
zero outside the copied block. RMSNorm then divides by an RMS smaller by sqrt(hs / hd), which each
norm weight absorbs (exactly but for RMSNorm's eps: 1e-5 against the draft's embedding mean square
of ~4e-3 moves its first norm by ~0.1%). The new query heads, MLP units and extra input columns keep the target's own
random initialization (they read but do not yet write), so gradients reach them from step one.
Layers past the source's depth are identity blocks (o_proj and down_proj zero).
"""

from __future__ import annotations

import math

import torch

LAYER = "model.layers.{}."


def source_shape(state: dict[str, torch.Tensor], head_dim: int) -> dict[str, int]:
    """The shape of the Llama in `state` (hidden, layers, heads, KV heads, MLP width)."""
    layers = {int(k.split(".")[2]) for k in state if k.startswith("model.layers.")}
    q, k = state["model.layers.0.self_attn.q_proj.weight"], state["model.layers.0.self_attn.k_proj.weight"]
    return {
        "hidden": state["model.embed_tokens.weight"].shape[1],
        "layers": len(layers),
        "heads": q.shape[0] // head_dim,
        "kv_heads": k.shape[0] // head_dim,
        "intermediate": state["model.layers.0.mlp.gate_proj.weight"].shape[0],
    }


def grow(
    src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor], head_dim: int
) -> dict[str, torch.Tensor]:
    """`dst` (a freshly initialized larger model's state dict) with `src` grown into it so the
    model computes `src`'s logits. Raises ValueError when `src` does not fit inside `dst`."""
    s, d = source_shape(src, head_dim), source_shape(dst, head_dim)
    if src["model.embed_tokens.weight"].shape[0] != dst["model.embed_tokens.weight"].shape[0]:
        raise ValueError("the source and target vocabularies differ")
    too_big = [key for key in s if s[key] > d[key]]
    if too_big:
        raise ValueError(f"the source is larger than the target in {', '.join(too_big)}: {s} vs {d}")
    if s["heads"] // s["kv_heads"] != d["heads"] // d["kv_heads"]:
        raise ValueError(
            f"query heads per KV head differ ({s['heads']}/{s['kv_heads']} vs {d['heads']}/{d['kv_heads']})"
        )
    out = {key: value.detach().clone().float() for key, value in dst.items()}
    hs, scale = s["hidden"], math.sqrt(s["hidden"] / d["hidden"])
    qs, kvs, ms = s["heads"] * head_dim, s["kv_heads"] * head_dim, s["intermediate"]

    def norm(key: str) -> None:
        out[key].fill_(scale)
        out[key][:hs] = src[key].float() * scale

    out["model.embed_tokens.weight"].zero_()
    out["model.embed_tokens.weight"][:, :hs] = src["model.embed_tokens.weight"].float()
    out["lm_head.weight"][:, :hs] = src["lm_head.weight"].float()
    norm("model.norm.weight")
    for layer in range(d["layers"]):
        p = LAYER.format(layer)
        writes = (p + "self_attn.o_proj.weight", p + "mlp.down_proj.weight")
        for key in writes:
            out[key].zero_()
        if layer >= s["layers"]:
            continue  # an identity block: reads, writes nothing yet
        norm(p + "input_layernorm.weight")
        norm(p + "post_attention_layernorm.weight")
        for name, rows in (("self_attn.q_proj", qs), ("self_attn.k_proj", kvs), ("self_attn.v_proj", kvs),
                           ("mlp.gate_proj", ms), ("mlp.up_proj", ms)):  # fmt: skip
            out[p + name + ".weight"][:rows, :hs] = src[p + name + ".weight"].float()
        out[writes[0]][:hs, :qs] = src[writes[0]].float()
        out[writes[1]][:hs, :ms] = src[writes[1]].float()
    return out
