"""Structured outputs against transformers: greedy constrained tokens equal transformers' greedy
`generate` with a logits processor over llguidance's own matcher (the same grammar); preemption and
prefix-cache reuse mid-object change nothing."""

from __future__ import annotations

import llguidance
import pytest
import torch
from engine_oracle import VOCAB, random_prompt
from structured_cases import constraints, satisfies

from contracts.grammar import grammar_text
from kernels.reference.token_bitmask import apply_token_bitmask_
from worker.engine import Engine, EngineConfig, SamplingParams

transformers = pytest.importorskip("transformers")


class GrammarLogitsProcessor(transformers.LogitsProcessor):
    """transformers' side: llguidance's matcher advanced by each generated token, its bitmask
    applied to the scores (batch of one)."""

    def __init__(self, matcher: llguidance.LLMatcher, prompt_len: int) -> None:
        self.matcher = matcher
        self.prompt_len = prompt_len
        self.bitmask = torch.zeros((1, (VOCAB + 31) // 32), dtype=torch.int32)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] > self.prompt_len:
            assert self.matcher.consume_token(int(input_ids[0, -1]))
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.data_ptr(), self.bitmask.numel() * 4)
        scores = scores.clone()
        apply_token_bitmask_(scores, self.bitmask, torch.tensor([0]))
        return scores



@pytest.fixture(scope="module")
def ckpt(make_checkpoint):
    return make_checkpoint("llama")


@torch.no_grad()
def test_greedy_equals_transformers_with_the_grammar_processor(ckpt) -> None:
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=8 << 20))
    eos = sorted(engine.eos_token_ids)
    tokenizer = llguidance.LLTokenizer((ckpt.path / "tokenizer.json").read_text(), n_vocab=VOCAB, eos_token=eos)
    cases = constraints()[::2]
    prompts = [random_prompt(4 + 5 * i, 50 + i) for i in range(len(cases))]
    outs = engine.generate(prompts, [SamplingParams(max_tokens=40, constraint=c) for c in cases])
    stops = 0
    for prompt, c, out in zip(prompts, cases, outs, strict=True):
        processor = GrammarLogitsProcessor(llguidance.LLMatcher(tokenizer, grammar_text(c)), len(prompt))
        hf = ckpt.model.generate(torch.tensor([prompt]), max_new_tokens=41, do_sample=False, eos_token_id=eos,
                                 pad_token_id=0, logits_processor=transformers.LogitsProcessorList([processor]))
        hf_tokens = hf[0, len(prompt) :].tolist()
        n = len(out.token_ids)
        assert out.token_ids == hf_tokens[:n], (c, out.text)
        if out.finish_reason == "stop":  # the grammar was complete: transformers' next token is EOS
            stops += 1
            assert hf_tokens[n] in eos and satisfies(out.text, c)
    assert stops >= len(cases) // 2


@pytest.mark.parametrize("overlap", [False, True])
def test_preemption_and_prefix_reuse_mid_object_change_nothing(ckpt, overlap: bool) -> None:
    """A KV cache of a few blocks preempts rows mid-object (recomputed from the prefix cache); a
    second wave of requests reuses the first's blocks; outputs equal a roomy uninterrupted run."""
    cases = constraints()
    base = random_prompt(40, 7)
    prompts = [base + random_prompt(1 + i % 5, i) for i in range(len(cases))]
    params = [SamplingParams(max_tokens=48, temperature=0.0 if i % 2 else 0.8, seed=i, constraint=c)
              for i, c in enumerate(cases)]  # fmt: skip
    roomy = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=8 << 20, overlap_steps=overlap))
    want = roomy.generate(prompts, params)
    tight = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=10 * 8192, max_num_seqs=8,
                                                           max_num_batched_tokens=64, overlap_steps=overlap))  # fmt: skip
    got = tight.generate(prompts, params)
    assert tight.stats.preemptions > 0, "the cache was meant to be too small"
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.finish_reason for o in got] == [o.finish_reason for o in want]
    # prefix reuse: the prompt + a finished row's first tokens (mid-object) as new prompts, against the
    # same request in a fresh engine
    again = [p + o.token_ids[:5] for p, o in zip(prompts, want, strict=True)]
    follow = [SamplingParams(max_tokens=16, constraint=None, seed=i) for i in range(len(again))]
    warm = tight.generate(again, follow)
    assert tight.stats.cached_tokens > 0
    cold = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=8 << 20, enable_prefix_caching=False))
    assert [o.token_ids for o in warm] == [o.token_ids for o in cold.generate(again, follow)]
