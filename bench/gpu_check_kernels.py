"""Sections (b) and (c) of bench/gpu_check.py: each Triton kernel against its torch reference at
real sizes (tiny ones under --dry-run), timed, with bytes or FLOPs per call for the achieved rate.
The quantized matmuls are in gpu_check_matmul.py.

Imported by gpu_check.py after TRITON_INTERPRET is settled; `chk` is its Check.
"""

from __future__ import annotations

import torch

from kernels import reference
from kernels.triton.paged_decode_attention import paged_decode_attention
from kernels.triton.prefill_attention import prefill_attention
from kernels.triton.rms_norm import rms_norm
from kernels.triton.rotary import apply_rotary
from kernels.triton.store_kv_cache import store_kv_cache
from kernels.triton.token_bitmask import apply_token_bitmask_

BF16 = torch.bfloat16
BLOCK_SIZE = 16  # KV cache block, tokens


def _randn(*shape: int, device, dtype=BF16, std: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device=device, dtype=torch.float32) * std).to(dtype)


def _paged(lens: list[int], hkv: int, d: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random caches holding exactly the blocks of `lens`, and block tables over shuffled blocks."""
    need = [-(-n // BLOCK_SIZE) for n in lens]
    total = sum(need)
    k_cache = _randn(total, BLOCK_SIZE, hkv, d, device=device)
    v_cache = _randn(total, BLOCK_SIZE, hkv, d, device=device)
    perm = torch.randperm(total, device=device).to(torch.int32)
    tables = torch.zeros(len(lens), max(need), dtype=torch.int32, device=device)
    start = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[start : start + n]
        start += n
    return k_cache, v_cache, tables


def attention_kernels(chk, device) -> None:
    """Paged decode (batch 64 x 4k is the target case; a small batch at long context exercises
    the flash-decoding split) and prefill (4k from scratch is the target; a 1k chunk after a 3k
    cached prefix is the chunked-prefill case). Each case fails on its own."""
    dry = chk.dry_run
    heads = (8, 2, 64) if dry else (32, 8, 128)  # Hq, Hkv, D
    for batch, ctx in [(3, 40)] if dry else [(64, 4096), (8, 4096), (2, 16384)]:
        chk.case(f"paged_decode_attention B={batch} ctx={ctx}", _decode_case, chk, device, batch, ctx, *heads)
    for q_len, prefix in [(40, 0), (9, 20)] if dry else [(4096, 0), (1024, 3072)]:
        chk.case(
            f"prefill_attention chunk={q_len} prefix={prefix}",
            _prefill_case,
            chk,
            device,
            q_len,
            prefix,
            *heads,
        )


def _decode_case(chk, device, batch: int, ctx: int, hq: int, hkv: int, d: int) -> None:
    scale = d**-0.5
    kc, vc, tables = _paged([ctx] * batch, hkv, d, device)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    q = _randn(batch, hq, d, device=device)
    got = paged_decode_attention(q, kc, vc, tables, lens, scale, torch.full_like(q, float("nan")))
    want = reference.paged_decode_attention(q, kc, vc, tables, lens, scale)
    ms = chk.time_ms(lambda: paged_decode_attention(q, kc, vc, tables, lens, scale))
    kv_bytes = 2 * batch * ctx * hkv * d * kc.element_size()
    row = chk.kernel(
        "paged_decode_attention",
        f"B={batch} ctx={ctx} Hq={hq} Hkv={hkv} D={d}",
        got,
        want,
        "reduction",
        ms,
        kv_bytes,
        "GB/s",
        "copy_gbps",
    )
    if batch == 64 or chk.dry_run:
        chk.target(f"paged decode B={batch} ctx={ctx}", row["of_ceiling"], 0.70, "fraction of copy GB/s")


def _prefill_case(chk, device, q_len: int, prefix: int, hq: int, hkv: int, d: int) -> None:
    scale = d**-0.5
    kc, vc, tables = _paged([prefix + q_len], hkv, d, device)
    cu = torch.tensor([0, q_len], dtype=torch.int32, device=device)
    lens = torch.tensor([prefix + q_len], dtype=torch.int32, device=device)
    q = _randn(q_len, hq, d, device=device)
    got = prefill_attention(q, kc, vc, cu, lens, tables, scale, torch.full_like(q, float("nan")))
    want = reference.prefill_attention(q, kc, vc, cu, lens, tables, scale)
    ms = chk.time_ms(lambda: prefill_attention(q, kc, vc, cu, lens, tables, scale))
    # causal: the query at position p scores p + 1 keys; QK^T and PV are 2 FLOPs per MAC each
    flops = 4 * sum(range(prefix + 1, prefix + q_len + 1)) * d * hq
    row = chk.kernel(
        "prefill_attention",
        f"chunk={q_len} prefix={prefix} Hq={hq} D={d}",
        got,
        want,
        "reduction",
        ms,
        flops,
        "TFLOP/s",
        "matmul_tflops",
    )
    if prefix == 0:
        chk.target(f"prefill {q_len} tokens", row["of_ceiling"], 0.50, "fraction of bf16 matmul TFLOP/s")


def small_kernels(chk, device) -> None:
    """KV store, fused residual RMSNorm and rotary: all bandwidth bound. Each fails on its own."""
    dry = chk.dry_run
    tokens, hidden = (37, 200) if dry else (8192, 4096)
    hq, hkv, d = (4, 2, 64) if dry else (32, 8, 128)
    chk.case("store_kv_cache", _store_case, chk, device, tokens, hkv, d)
    chk.case("rms_norm", _rms_norm_case, chk, device, tokens, hidden)
    chk.case("apply_rotary", _rotary_case, chk, device, tokens, hq, hkv, d)
    rows, vocab = (5, 1000) if dry else (256, 151_936)
    chk.case("token_bitmask", _bitmask_case, chk, device, rows, vocab)


def _bitmask_case(chk, device, rows: int, vocab: int) -> None:
    """Structured outputs' masks: every other logits row constrained (-inf where its bit is clear);
    read the mask words and the rows' logits, write the blocked positions (counted as all of them)."""
    logits = torch.randn(rows, vocab, device=device)
    which = torch.arange(0, rows, 2, device=device)
    words = torch.randint(-(2**31), 2**31 - 1, (which.numel(), (vocab + 31) // 32), device=device,
                          dtype=torch.int64).to(torch.int32)  # fmt: skip
    got, want = logits.clone(), logits.clone()
    apply_token_bitmask_(got, words, which)
    reference.apply_token_bitmask_(want, words, which)
    ms = chk.time_ms(lambda: apply_token_bitmask_(logits, words, which))
    chk.kernel(
        "token_bitmask",
        f"rows={which.numel()}/{rows} V={vocab}",
        got.nan_to_num(neginf=-1e4),
        want.nan_to_num(neginf=-1e4),
        "exact",
        ms,
        which.numel() * (vocab * 4 * 2 + words.shape[1] * 4),
        "GB/s",
        "copy_gbps",
    )


def _store_case(chk, device, tokens: int, hkv: int, d: int) -> None:
    """Read k, v; write them into shuffled slots."""
    k, v = _randn(tokens, hkv, d, device=device), _randn(tokens, hkv, d, device=device)
    num_blocks = -(-tokens // BLOCK_SIZE) + 1
    slots = torch.randperm(num_blocks * BLOCK_SIZE, device=device)[:tokens]
    caches = [
        torch.full((num_blocks, BLOCK_SIZE, hkv, d), float("nan"), dtype=BF16, device=device)
        for _ in range(4)
    ]
    store_kv_cache(k, v, caches[0], caches[1], slots)
    reference.store_kv_cache(k, v, caches[2], caches[3], slots)
    ms = chk.time_ms(lambda: store_kv_cache(k, v, caches[0], caches[1], slots))
    chk.kernel(
        "store_kv_cache",
        f"T={tokens} Hkv={hkv} D={d}",
        torch.cat([caches[0], caches[1]]).nan_to_num(),
        torch.cat([caches[2], caches[3]]).nan_to_num(),
        "exact",
        ms,
        4 * k.numel() * 2,
        "GB/s",
        "copy_gbps",
    )


def _rms_norm_case(chk, device, tokens: int, hidden: int) -> None:
    """With a residual: read x, residual, weight; write out, residual_out."""
    x, res = _randn(tokens, hidden, device=device), _randn(tokens, hidden, device=device)
    w = _randn(hidden, device=device)
    got, got_res = rms_norm(x, w, 1e-6, res)
    want, want_res = reference.rms_norm(x, w, 1e-6, res)
    ms = chk.time_ms(lambda: rms_norm(x, w, 1e-6, res))
    chk.kernel(
        "rms_norm+residual",
        f"T={tokens} H={hidden}",
        torch.cat([got, got_res]),
        torch.cat([want, want_res]),
        "elementwise",
        ms,
        4 * x.numel() * 2 + hidden * 2,
        "GB/s",
        "copy_gbps",
    )


def _rotary_case(chk, device, tokens: int, hq: int, hkv: int, d: int) -> None:
    """In place on q and k: read and write both, read cos/sin rows."""
    max_pos = 4 * tokens
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device).float() / d))
    freqs = torch.arange(max_pos, device=device).float()[:, None] * inv_freq[None, :]
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    positions = torch.randint(0, max_pos, (tokens,), device=device)
    q, kk = _randn(tokens, hq, d, device=device), _randn(tokens, hkv, d, device=device)
    q_ref, k_ref = q.clone(), kk.clone()
    q_t, k_t = q.clone(), kk.clone()
    apply_rotary(q_t, k_t, positions, cos_sin)
    reference.apply_rotary(q_ref, k_ref, positions, cos_sin)
    ms = chk.time_ms(lambda: apply_rotary(q, kk, positions, cos_sin))  # rotates q, kk again each call
    moved = 2 * (q.numel() + kk.numel()) * 2 + tokens * d * 4
    chk.kernel(
        "apply_rotary",
        f"T={tokens} Hq={hq} Hkv={hkv} D={d}",
        torch.cat([q_t.flatten(), k_t.flatten()]),
        torch.cat([q_ref.flatten(), k_ref.flatten()]),
        "elementwise",
        ms,
        moved,
        "GB/s",
        "copy_gbps",
    )
