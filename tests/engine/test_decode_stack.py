"""The CPU backend's whole-stack decode path (one C call per pure decode step): greedy tokens
equal transformers' with it on and off, on every architecture; the models and steps it must not
take fall back to the op-by-op layers; the weights it streams sit packed on huge pages."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_oracle import DECODE_STACK_ARCHS, MAX_NEW, mixed_prompts, small_engine
from torch_threads import torch_threads

from worker.engine import Engine, SamplingParams

GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)



def _count_stack_calls(engine: Engine, monkeypatch) -> list[int]:
    """Rows of each decode step the stack ran (its hidden states, or its logits: the lm_head in the call)."""
    stack = engine.runner.model.decode_stack
    assert stack is not None
    rows: list[int] = []
    for name in ("__call__", "logits"):
        real = getattr(type(stack), name)

        def spy(self, input_ids, positions, meta, real=real):
            rows.append(input_ids.shape[0])
            return real(self, input_ids, positions, meta)

        monkeypatch.setattr(type(stack), name, spy)
    return rows


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [*DECODE_STACK_ARCHS, ("mistral", {"sliding_window": 32})],  # windowed: blocks released, windows read in C
)
def test_greedy_matches_transformers_through_the_stack(make_checkpoint, expected, monkeypatch, arch: str,
                                                       overrides: dict) -> None:  # fmt: skip
    """max_num_seqs=4: every decode step has at most 4 rows, so each one runs through the stack."""
    engine = small_engine(make_checkpoint(arch, **overrides).path, max_num_seqs=4)
    rows = _count_stack_calls(engine, monkeypatch)
    outs = engine.generate(mixed_prompts(), GREEDY)
    assert [o.token_ids for o in outs] == expected(arch, **overrides)
    assert rows and max(rows) == 4 and min(rows) >= 1
    engine.block_manager.check_invariants([])


@pytest.mark.parametrize("modes", [{}, {"static_decode": True}])
def test_on_and_off_give_the_same_tokens(make_checkpoint, monkeypatch, modes: dict) -> None:
    """Also on the padded static decode buffers (padding rows: slot -1, one key)."""
    path = make_checkpoint("qwen3").path
    off = small_engine(path, max_num_seqs=8, decode_stack=False, **modes)
    assert off.runner.model.decode_stack is None
    on = small_engine(path, max_num_seqs=8, **modes)
    assert on.runner.model.decode_stack.head_takes()  # the fp32 lm_head's packed copy, in the call
    rows = _count_stack_calls(on, monkeypatch)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    assert [o.token_ids for o in on.generate(mixed_prompts(), params)] == [
        o.token_ids for o in off.generate(mixed_prompts(), params)
    ]
    assert rows


def test_hooks_threads_and_shared_prefixes_run_op_by_op(make_checkpoint, expected, monkeypatch) -> None:
    """Requests stop after 1..8 tokens, so the decode batch narrows from 17 rows to 2. A forward hook
    on a projection sends every step op by op (the hook fires); past 15 rows the stack runs only on
    one torch thread; rows that all share their leading blocks go op by op (the cascade)."""
    engine = small_engine(make_checkpoint("llama").path, max_num_seqs=32)
    stack = engine.runner.model.decode_stack
    assert stack.packed and not stack.half  # fp32 values: fp32 packed copies multiply steps of 3+ rows
    rows = _count_stack_calls(engine, monkeypatch)
    prompts = mixed_prompts() * 2
    params = [SamplingParams(max_tokens=1 + i % MAX_NEW, ignore_eos=True) for i in range(len(prompts))]
    want = [tokens[: p.max_tokens] for tokens, p in zip(expected("llama") * 2, params, strict=True)]
    seen: list[int] = []
    handle = engine.runner.model.model.layers[0].mlp.gate_up_proj.register_forward_hook(
        lambda _m, args, _o: seen.append(args[0].shape[0])
    )
    assert [o.token_ids for o in engine.generate(prompts, params)] == want
    handle.remove()
    assert not rows and seen[1:] == [17, 14, 11, 8, 6, 4, 2]  # every decode step, through the hook
    assert [o.token_ids for o in engine.generate(prompts, params)] == want
    assert rows == [17, 14, 11, 8, 6, 4]  # the last 2 rows share 64 tokens (base[:64]): op by op
    rows.clear()
    with torch_threads(2):
        assert [o.token_ids for o in engine.generate(prompts, params)] == want
    assert rows == [14, 11, 8, 6, 4]  # 17 rows on two threads: op by op
    rows.clear()
    shared = [list(range(3, 83)) + p for p in mixed_prompts()[:4]]  # 80 common tokens: 5 blocks
    outs = engine.generate(shared, SamplingParams(max_tokens=4, ignore_eos=True))
    assert all(len(o.token_ids) == 4 for o in outs)
    assert not rows


def test_an_fp16_checkpoint_runs_on_fp16_copies_with_the_same_tokens(monkeypatch) -> None:
    """examples/models/pycoder-tiny is stored in fp16: the engine's stack multiplies with fp16 copies
    (GEMVs at 1-2 rows, packed tiles from 3, the products of the fp32 weights) on steps of 1 to 12
    rows, and greedy decoding gives the op-by-op path's tokens."""
    path = Path(__file__).resolve().parents[2] / "examples" / "models" / "pycoder-tiny"
    before = torch.get_num_threads()
    try:
        on = small_engine(path, max_num_seqs=12, num_threads=1)
        stack = on.runner.model.decode_stack
        assert stack.half and stack.packed
        off = small_engine(path, max_num_seqs=12, num_threads=1, decode_stack=False)
        rows = _count_stack_calls(on, monkeypatch)
        prompts = [list(range(5 + i, 40 + 3 * i)) for i in range(12)]
        params = [SamplingParams(max_tokens=4 + 2 * i, ignore_eos=True) for i in range(12)]
        assert [o.token_ids for o in on.generate(prompts, params)] == [o.token_ids for o in off.generate(prompts, params)]
    finally:
        torch.set_num_threads(before)
    assert max(rows) == 12 and min(rows) == 1


def test_fp8_models_run_op_by_op(make_checkpoint) -> None:
    """int8 / int4 models run through the stack (tests/engine/test_quantized_decode.py); fp8 has no CPU
    kernel in it."""
    engine = small_engine(make_checkpoint("llama").path, quantization="fp8")
    assert engine.runner.model.decode_stack is None
    outs = engine.generate(mixed_prompts()[:3], GREEDY)
    assert all(len(o.token_ids) == MAX_NEW for o in outs)


def test_head_sizes_without_a_compiled_kernel_run_op_by_op(make_checkpoint, expected) -> None:
    """head_dim 24 is no multiple of the vector width: no stack, the layers (and torch attention) run."""
    engine = small_engine(make_checkpoint("llama", head_dim=24).path, max_num_seqs=4)
    assert engine.runner.model.decode_stack is None
    assert [o.token_ids for o in engine.generate(mixed_prompts(), GREEDY)] == expected("llama", head_dim=24)


def test_weights_packed_in_layer_order_and_ties_kept(make_checkpoint) -> None:
    engine = small_engine(make_checkpoint("qwen2", tie_word_embeddings=True).path)
    model = engine.runner.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ptrs = [p.data_ptr() for p in model.parameters()]
    assert ptrs == sorted(ptrs)  # one arena, in registration order (layer by layer)
    assert all(p % 64 == 0 for p in ptrs)
    assert ptrs[-1] - ptrs[0] < 2 * sum(p.numel() * 4 for p in model.parameters())  # packed, not scattered
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.bias is not None and torch.isfinite(qkv.bias).all()
