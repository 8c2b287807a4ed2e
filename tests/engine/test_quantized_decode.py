"""Quantized models on the CPU: the engine with the integer kernels (kernels/cpu/quant.h; the whole-layer
decode stack where it takes the step) gives the greedy tokens of the quantized reference path (the
same math in torch: activations rounded to int8 per block, exact integer block sums, the scales;
kernels/reference/quant_matmul.py) on the tiny models of every dense architecture the stack runs."""

from __future__ import annotations

import pytest
from engine_oracle import DECODE_STACK_ARCHS, MAX_NEW, mixed_prompts, small_engine
from torch_threads import torch_threads

from worker.engine import Engine, SamplingParams
from worker.engine.quant.checkpoint import QuantizeSpec, quantize_checkpoint
from worker.engine.quant.linear import QuantLinear

GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)



def _reference_tokens(path, quantization: str | None, **config: object) -> list[list[int]]:
    """Greedy tokens with every quantized Linear on its torch reference, layers op by op."""
    engine = small_engine(path, quantization=quantization, decode_stack=False, **config)
    modules = [m for m in engine.runner.model.modules() if isinstance(m, QuantLinear)]
    assert modules
    for m in modules:
        m.cpu_path = "dynamic"
    return [o.token_ids for o in engine.generate(mixed_prompts(), GREEDY)]


@pytest.mark.parametrize("quantization", ["int8", "int4"])
@pytest.mark.parametrize(
    ("arch", "overrides"),
    DECODE_STACK_ARCHS,
)
def test_kernels_give_the_reference_paths_greedy_tokens(make_checkpoint, arch: str, overrides: dict,
                                                        quantization: str) -> None:  # fmt: skip
    path = make_checkpoint(arch, **overrides).path
    engine = small_engine(path, quantization=quantization, max_num_seqs=4)
    rows = _count_stack_calls(engine)
    outs = engine.generate(mixed_prompts(), GREEDY)
    assert [o.token_ids for o in outs] == _reference_tokens(path, quantization, max_num_seqs=4)
    assert rows and max(rows) == 4  # every decode step through the whole-layer C call
    engine.block_manager.check_invariants([])


def _count_stack_calls(engine: Engine) -> list[int]:
    """Rows of each decode step the stack ran, its hidden states or its logits (the lm_head in the
    call): a spy on this engine's stack only."""
    stack = engine.runner.model.decode_stack
    assert stack is not None
    rows: list[int] = []
    for name in ("rows", "logits"):
        call = getattr(stack, name)

        def spy(input_ids, *args, call=call):
            rows.append(input_ids.shape[0])
            return call(input_ids, *args)

        setattr(stack, name, spy)
    return rows


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_stack_on_and_off_give_the_same_tokens_at_any_batch_and_threads(make_checkpoint, quantization: str) -> None:
    """Requests stop after 1..8 tokens, so decode steps narrow from 17 rows to 2: past 15 rows on one
    thread, then on two threads (rows split at 64-row tiles). The stack's integer products are the
    op-by-op kernel's floats, so greedy tokens match the layers run op by op exactly."""
    path = make_checkpoint("qwen2").path  # qkv bias
    prompts = mixed_prompts() * 2
    params = [SamplingParams(max_tokens=1 + i % MAX_NEW, ignore_eos=True) for i in range(len(prompts))]
    off = small_engine(path, quantization=quantization, max_num_seqs=32, decode_stack=False)
    want = [o.token_ids for o in off.generate(prompts, params)]
    on = small_engine(path, quantization=quantization, max_num_seqs=32)
    rows = _count_stack_calls(on)
    assert [o.token_ids for o in on.generate(prompts, params)] == want
    assert max(rows) == 17
    rows.clear()
    with torch_threads(2):
        assert [o.token_ids for o in on.generate(prompts, params)] == want
    assert rows and max(rows) <= 15  # 17 rows on two threads: op by op


@pytest.mark.parametrize("method", ["int8", "int4-rtn"])
def test_a_quantized_lm_head_runs_in_the_stacks_call(make_checkpoint, tmp_path, method: str) -> None:
    """A checkpoint quantized with its lm_head (`freight quantize --lm-head`): every decode step's logits
    come from the stack's one call (final norm and head included), and the greedy tokens are those of
    the quantized reference path and of the layers and head run op by op on the same kernel."""
    path = tmp_path / "quantized"
    quantize_checkpoint(make_checkpoint("qwen2").path, path, QuantizeSpec(method=method, group_size=32, lm_head=True))
    engine = small_engine(path, max_num_seqs=4)
    stack = engine.runner.model.decode_stack
    assert isinstance(engine.runner.model.lm_head, QuantLinear) and stack.head_takes()
    rows: list[int] = []
    call = stack.logits

    def spy(input_ids, *args):
        rows.append(input_ids.shape[0])
        return call(input_ids, *args)

    stack.logits = spy
    got = [o.token_ids for o in engine.generate(mixed_prompts(), GREEDY)]
    assert rows and max(rows) == 4  # every decode step's logits from the whole-stack call
    assert got == _reference_tokens(path, None, max_num_seqs=4)
    off = small_engine(path, max_num_seqs=4, decode_stack=False)
    assert [o.token_ids for o in off.generate(mixed_prompts(), GREEDY)] == got
