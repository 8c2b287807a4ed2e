"""The Triton backend behind the engine's seam (interpreter mode): same results as the torch backend
for a mixed prefill + decode step."""

import dataclasses

import torch
from kernel_cases import assert_close, randn
from paged_cases import block_tables_for

from worker.engine.backends import AttentionMetadata, registered_backends, select_backend


def test_triton_is_registered_and_runs_on_cpu_when_interpreted() -> None:
    assert "triton" in registered_backends()
    backend = select_backend("triton", torch.device("cpu"))
    assert backend.name == "triton"
    # "auto" never picks Triton on the CPU: the C decode kernel's backend where it builds
    assert select_backend("auto", torch.device("cpu")).name == "cpu"


def test_mixed_step_matches_torch_backend() -> None:
    """Two prefill chunks (one after a cached prefix) and three decode tokens in one step."""
    hq, hkv, d, bs = 8, 2, 64, 4
    prefill_q, prefix = [5, 3], [0, 6]
    decode_ctx = [7, 1, 12]  # context after this step's token
    ctx_all = [p + n for p, n in zip(prefix, prefill_q, strict=True)] + decode_ctx
    num_blocks = sum(-(-n // bs) for n in ctx_all) + 1
    tables = block_tables_for(ctx_all, bs, num_blocks)
    # slots of this step's tokens: the new positions of each sequence
    slots = []
    for b, n in enumerate(prefill_q):
        for pos in range(prefix[b], prefix[b] + n):
            slots.append(int(tables[b, pos // bs]) * bs + pos % bs)
    for j, n in enumerate(decode_ctx):
        pos = n - 1
        slots.append(int(tables[2 + j, pos // bs]) * bs + pos % bs)
    tokens = len(slots)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        num_prefill_tokens=sum(prefill_q),
        prefill_cu_seqlens_q=torch.tensor([0, 5, 8], dtype=torch.int32),
        prefill_context_lens=torch.tensor(ctx_all[:2], dtype=torch.int32),
        prefill_block_tables=tables[:2].contiguous(),
        decode_context_lens=torch.tensor(decode_ctx, dtype=torch.int32),
        decode_block_tables=tables[2:].contiguous(),
    )
    q, k, v = randn(tokens, hq, d), randn(tokens, hkv, d), randn(tokens, hkv, d)
    cache = randn(2, num_blocks, bs, hkv, d)  # earlier tokens' K/V: random, like a filled cache
    outs = []
    for name in ("torch", "triton"):
        kc, vc = cache[0].clone(), cache[1].clone()
        outs.append((select_backend(name, torch.device("cpu")).attention(q, k, v, kc, vc, meta, 0.125), kc))
    assert_close(outs[1][0], outs[0][0], atol=2e-5, rtol=1e-4)
    assert torch.equal(outs[1][1], outs[0][1])
    # The last layer of such a step keeps only the rows that need logits: each prefill chunk's last
    # token and the decode tokens. attention(rows_only=True) gives exactly those rows of the full attention.
    rows = [4, 7, 8, 9, 10]
    ctx_rows = [ctx_all[0], ctx_all[1], *decode_ctx]
    kept = dataclasses.replace(
        meta,
        output_rows=torch.tensor(rows, dtype=torch.int64),
        output_context_lens=torch.tensor(ctx_rows, dtype=torch.int32),
        output_block_tables=tables.contiguous(),
    )
    for name, (full, _) in zip(("torch", "triton"), outs, strict=True):
        kc, vc = cache[0].clone(), cache[1].clone()
        part = select_backend(name, torch.device("cpu")).attention(q, k, v, kc, vc, kept, 0.125, rows_only=True)
        assert_close(part, full[rows], atol=2e-5, rtol=1e-4)
        assert torch.equal(kc, outs[0][1])  # every row's K/V stored, kept or not


def test_argument_checks_run_once_per_signature(monkeypatch) -> None:
    """The backend validates a wrapper's arguments the first time it sees their shapes, strides and
    dtypes (checked=False), then launches with checked=True; a new signature is checked again, so a
    bad argument is still refused with the wrapper's message."""
    import pytest

    import worker.engine.backends.triton_backend as module

    backend = select_backend("triton", torch.device("cpu"))
    seen = []
    real = module.rms_norm

    def spy(*args, checked=False):
        seen.append(checked)
        return real(*args, checked=checked)

    monkeypatch.setattr(module, "rms_norm", spy)
    x, w = randn(3, 32), randn(32)
    first, _ = backend.rms_norm(x, w, 1e-6)
    again, _ = backend.rms_norm(randn(3, 32), w, 1e-6)
    backend.rms_norm(randn(5, 32), w, 1e-6)
    assert seen == [False, True, False]
    assert_close(first, backend.rms_norm(x, w, 1e-6)[0], atol=0, rtol=0)
    with pytest.raises(ValueError, match="weight"):
        backend.rms_norm(x, randn(16), 1e-6)
