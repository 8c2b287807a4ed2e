"""n > 1: choices forked from one prefill that share the prompt's KV blocks (copy-on-write of the last
partial block), each with its own seed; preemption of forked choices; logprobs per choice."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_oracle import random_prompt, small_engine

from worker.engine import SamplingParams

SAMPLED = SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)



@pytest.fixture(scope="module")
def ckpt(make_checkpoint):
    return make_checkpoint("llama")



@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("length", [37, 32])  # a partial last block (copied on write) and none
def test_n_choices_compute_the_prompt_once(ckpt, prefix_caching: bool, length: int) -> None:
    engine = small_engine(ckpt.path, enable_prefix_caching=prefix_caching)
    prompt = random_prompt(length)
    out = engine.generate([prompt], dataclasses.replace(SAMPLED, n=3))[0]
    stats = engine.stats.snapshot()
    assert [o.index for o in out.outputs] == [0, 1, 2] and len({tuple(o.token_ids) for o in out.outputs}) == 3
    assert stats.computed_prefill_tokens == stats.prompt_tokens == length
    assert stats.decode_tokens == 3 * 12 and out.completion_tokens == 36
    assert (out.token_ids, out.text, out.finish_reason) == (out.outputs[0].token_ids, out.outputs[0].text, "length")
    engine.block_manager.check_invariants([])
    # choice i draws with seed + i: each equals the n = 1 request with that seed, in any batch
    alone = [engine.generate([prompt], dataclasses.replace(SAMPLED, seed=5 + i))[0].token_ids for i in range(3)]
    assert [o.token_ids for o in out.outputs] == alone


def test_greedy_choices_are_identical_and_equal_n_1(ckpt) -> None:
    engine = small_engine(ckpt.path)
    greedy = SamplingParams(max_tokens=10, ignore_eos=True)
    prompts = [random_prompt(21, 1), random_prompt(5, 2)]
    one = engine.generate(prompts, greedy)
    many = engine.generate(prompts, dataclasses.replace(greedy, n=4))
    for a, b in zip(one, many, strict=True):
        assert [o.token_ids for o in b.outputs] == [a.token_ids] * 4


def test_seeded_choices_reproduce_across_runs_and_batches(ckpt) -> None:
    params = dataclasses.replace(SAMPLED, n=3, top_k=50)
    prompt = random_prompt(40, 3)
    first = small_engine(ckpt.path).generate([prompt], params)[0]
    others = [random_prompt(10 + i, 10 + i) for i in range(4)]
    mixed = [SamplingParams(max_tokens=4 + i, temperature=0.8, seed=i, n=1 + i % 2) for i in range(4)]
    engine = small_engine(ckpt.path, max_num_seqs=8)
    again = engine.generate([*others[:2], prompt, *others[2:]], [*mixed[:2], params, *mixed[2:]])[2]
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in first.outputs]
    engine.block_manager.check_invariants([])


def test_forked_choices_survive_preemption(ckpt) -> None:
    """A cache of 12 blocks for 6 choices of 21-token prompts growing to 60 tokens: choices are preempted
    and recomputed, and still produce what a roomy engine produces."""
    prompts = [random_prompt(21, 4), random_prompt(19, 5)]
    params = SamplingParams(max_tokens=40, temperature=0.9, seed=9, n=3, ignore_eos=True, repetition_penalty=1.2)
    want = small_engine(ckpt.path).generate(prompts, params)
    tight = small_engine(ckpt.path, kv_cache_bytes=12 * 8192, max_num_seqs=6, max_num_batched_tokens=32)
    got = tight.generate(prompts, params)
    assert tight.stats.preemptions > 0
    for a, b in zip(want, got, strict=True):
        assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    tight.block_manager.check_invariants([])


def test_more_choices_than_rows_run_on_their_own(ckpt) -> None:
    """n above max_num_seqs: the choices that find no row are queued as sequences of their own."""
    prompt = random_prompt(18, 6)
    want = small_engine(ckpt.path).generate([prompt], dataclasses.replace(SAMPLED, n=5))[0]
    engine = small_engine(ckpt.path, max_num_seqs=2)
    got = engine.generate([prompt], dataclasses.replace(SAMPLED, n=5))[0]
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in want.outputs]
    engine.block_manager.check_invariants([])


LOGPROB_CASES = [
    SamplingParams(max_tokens=6, logprobs=4, ignore_eos=True),  # greedy: the CPU's numpy path
    SamplingParams(max_tokens=6, temperature=1.0, seed=1, n=3, logprobs=4, ignore_eos=True, repetition_penalty=1.5,
                   logit_bias={5: 2.0}),  # fmt: skip
]


@torch.no_grad()
@pytest.mark.parametrize("params", LOGPROB_CASES)
def test_logprobs_of_every_choice_match_log_softmax(ckpt, params: SamplingParams) -> None:
    engine = small_engine(ckpt.path)
    prompt = random_prompt(23, 7)
    others = [random_prompt(9, 8), random_prompt(30, 9)]  # in a batch with other rows (the persistent batch's rows)
    out = engine.generate([others[0], prompt, others[1]], [SamplingParams(max_tokens=8), params, params])[1]
    assert len(out.outputs) == params.n
    for choice in out.outputs:
        logp = torch.log_softmax(ckpt.model(torch.tensor([prompt + choice.token_ids])).logits[0].float(), -1)
        assert len(choice.logprobs) == 6
        for i, (token, entry) in enumerate(zip(choice.token_ids, choice.logprobs, strict=True)):
            row = logp[len(prompt) - 1 + i]  # the raw distribution, before penalties and bias
            top = torch.topk(row, 4)
            assert set(top.indices.tolist()) | {token} == set(entry)
            assert max(abs(entry[t] - float(row[t])) for t in entry) < 1e-4
