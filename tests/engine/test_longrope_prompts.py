"""Phi-3's LongRoPE with prompts past original_max_position_embeddings (32 here): transformers
prefills such a prompt in one forward with the long factors and decodes every later token with them
too, while a prompt that fits keeps the short factors below the threshold and takes the long ones
from it (models/rotary.py). The engine's greedy tokens equal transformers' (its generate with a KV
cache) with both kinds mixed in one batch, through prefix caching, chunked prefill, preemption, the C
decode stack and the op-by-op path, the torch backend and speculative decoding; prompt logprobs of a
long prompt match, and so do embeddings; the prefix cache never gives a long prompt's blocks to a
short one or back."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from engine_oracle import VOCAB, hf_greedy, hf_prompt_logprobs

from worker.demo_model import add_pooling_config
from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.block_manager import BlockManager
from worker.engine.models.rotary import cos_sin_cache
from worker.engine.sequence import Sequence
from worker.engine.speculation.config import SpeculativeConfig

THRESHOLD = 32
NEW = 16
PARAMS = SamplingParams(max_tokens=NEW, ignore_eos=True)
BLOCK_BYTES = 8192  # 2 layers x (K, V) x 16 tokens x 2 kv heads x 16 dims x fp32


def _rand(g: torch.Generator, n: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


def _prompts() -> list[list[int]]:
    """Long prompts (some sharing a prefix with each other and with short ones), short ones that cross
    the threshold while generating, the threshold itself (short) and one past it, a repeated pattern
    (n-gram speculation finds proposals in it)."""
    g = torch.Generator().manual_seed(5)
    base = _rand(g, 60)
    return [
        base[:50], base[:20] + _rand(g, 3), _rand(g, THRESHOLD + 1), base[:28], _rand(g, 70), [4, 5],
        base[:40] + _rand(g, 5), _rand(g, THRESHOLD), _rand(g, 9) * 5, base[:24] + _rand(g, 4) * 3,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def phi3(make_checkpoint):
    ckpt = make_checkpoint("phi3", original_max_position_embeddings=THRESHOLD)
    return ckpt, [hf_greedy(ckpt.model, p, NEW) for p in _prompts()]


def _generate(path: object, prompts: list[list[int]], **config: object) -> tuple[list[list[int]], Engine]:
    engine = Engine.from_pretrained(path, EngineConfig(**{"kv_cache_bytes": 8 << 20, **config}))
    outs = engine.generate(prompts, PARAMS)
    assert all(o.finish_reason == "length" and o.error is None for o in outs), [o.error for o in outs]
    engine.block_manager.check_invariants([])
    return [o.token_ids for o in outs], engine


@pytest.mark.parametrize("config", [
    {},
    {"enable_prefix_caching": False, "max_num_batched_tokens": 8, "max_num_seqs": 2},
    {"max_num_batched_tokens": 16, "max_num_seqs": 4},
    {"kv_cache_bytes": 8 * BLOCK_BYTES, "max_num_seqs": 4},
    {"decode_stack": False},
    {"backend": "torch"},
], ids=["default", "chunks-no-cache", "chunks-cache", "preemption", "op-by-op", "torch"])  # fmt: skip
def test_long_and_short_prompts_match_transformers(phi3, config: dict) -> None:
    ckpt, want = phi3
    got, engine = _generate(ckpt.path, _prompts(), **config)
    assert got == want
    assert engine.runner.model.rope_offset(THRESHOLD + 1) == engine.max_model_len
    assert engine.runner.model.rope_offset(THRESHOLD) == 0
    if "kv_cache_bytes" in config:
        assert engine.stats.preemptions > 0
    if config.get("decode_stack", True) and config.get("backend", "auto") != "torch":
        assert engine.runner.model.decode_stack is not None


def test_speculation_is_identical_to_plain(phi3, make_checkpoint) -> None:
    """n-gram proposals verified for long and short prompts; the target as its own draft model (the
    draft rotates with its own table's rows the same way): every proposal right, every one accepted."""
    ckpt, want = phi3
    ngram, engine = _generate(ckpt.path, _prompts(), speculative=SpeculativeConfig("ngram", 4, adaptive=False))
    assert ngram == want and engine.stats.spec_proposed_tokens > 0
    draft = SpeculativeConfig("draft", 4, str(ckpt.path), adaptive=False)
    got, engine = _generate(ckpt.path, _prompts(), speculative=draft)
    assert got == want
    s = engine.stats
    assert s.spec_proposed_tokens > 0 and s.spec_accepted_tokens == s.spec_proposed_tokens, s


def test_draft_catch_up_of_a_short_long_prompt(make_checkpoint) -> None:
    """Threshold 8: a 12-token prompt is past it but short enough for the draft's fast catch-up on the C
    stack, which rotates at plain positions; the draft prefills it at its all-long rows instead, so the
    target as its own draft still has every proposal accepted."""
    ckpt = make_checkpoint("phi3", original_max_position_embeddings=8)
    g = torch.Generator().manual_seed(7)
    prompts = [_rand(g, 12), _rand(g, 5), _rand(g, 3) * 4]
    draft = SpeculativeConfig("draft", 4, str(ckpt.path), adaptive=False)
    got, engine = _generate(ckpt.path, prompts, speculative=draft)
    assert got == [hf_greedy(ckpt.model, p, NEW) for p in prompts]
    s = engine.stats
    assert s.spec_proposed_tokens > 0 and s.spec_accepted_tokens == s.spec_proposed_tokens, s


def test_prompt_logprobs_of_a_long_prompt(phi3) -> None:
    """Every prompt position of a 50-token prompt scored with the long factors, in chunks of 16."""
    ckpt, _ = phi3
    prompts = [_prompts()[0], _prompts()[3]]  # long (50), short (28)
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=8 << 20, max_num_batched_tokens=16,
                                                            max_num_seqs=2))  # fmt: skip
    outs = engine.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=True))
    for out, prompt in zip(outs, prompts, strict=True):
        want = hf_prompt_logprobs(ckpt.model, prompt)
        assert max(abs(a - b) for a, b in zip(out.prompt_logprobs[1:], want, strict=True)) < 1e-4


def test_embeddings_of_long_and_short_prompts(phi3, tmp_path) -> None:
    """Mean pooling reads every position's hidden state: transformers' one forward, long factors for a
    prompt past 32; the 70-token prompt runs in two forwards of at most 64 tokens."""
    ckpt, _ = phi3
    path = shutil.copytree(ckpt.path, tmp_path / "phi3-mean")
    add_pooling_config(path, "mean", normalize=False)
    engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20, max_num_batched_tokens=64,
                                                       max_num_seqs=4))  # fmt: skip
    prompts = [p for p in _prompts() if len(p) in (70, 50, THRESHOLD + 1, THRESHOLD, 23)]
    assert len(prompts) == 5
    for out, ids in zip(engine.embed(prompts), prompts, strict=True):
        with torch.no_grad():
            want = ckpt.model.model(torch.tensor([ids])).last_hidden_state[0].mean(0)
        np.testing.assert_allclose(out.embedding, want.numpy(), atol=1e-5, rtol=0)


def test_prefix_cache_keeps_long_and_short_prompts_apart(phi3) -> None:
    """A long prompt's cached blocks are not reused by a short prompt with the same leading tokens,
    nor the other way round; two long prompts share theirs. Tokens equal transformers' each time."""
    ckpt, _ = phi3
    g = torch.Generator().manual_seed(11)
    base = _rand(g, 48)
    long_a, short, long_b = base[:40], base[:30], base[:34] + _rand(g, 6)
    short_b = base[:32]
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=8 << 20))
    bm = engine.block_manager
    for prompt, hits in ((long_a, 0), (short, 0), (long_b, 2), (short_b, 1)):
        before = bm.prefix_hits
        out = engine.generate([prompt], PARAMS)[0]
        assert out.token_ids == hf_greedy(ckpt.model, prompt, NEW)
        assert bm.prefix_hits - before == hits, prompt


def test_table_halves_and_hash_roots() -> None:
    """The table's second half is the long factors at every position; the first keeps the switch at the
    threshold. Equal tokens hash differently for a long prompt's sequence, the same otherwise."""
    scaling = {"rope_type": "longrope", "short_factor": [1.0, 2.0], "long_factor": [3.0, 5.0],
               "original_max_position_embeddings": 4, "attention_factor": 1.5}  # fmt: skip
    table = cos_sin_cache(4, 8, 100.0, scaling)
    assert table.shape == (16, 4)
    inv_long = 1.0 / (torch.tensor([3.0, 5.0]) * 100.0 ** (torch.arange(0, 4, 2).float() / 4))
    angles = torch.arange(8.0)[:, None] * inv_long
    want = torch.cat([angles.cos(), angles.sin()], dim=1) * 1.5
    torch.testing.assert_close(table[8:], want)
    torch.testing.assert_close(table[4:8], want[4:])
    assert torch.equal(table[4:8], table[12:16])  # decodes past the threshold read either half (step_inputs)
    assert not torch.allclose(table[1:4], want[1:4])
    assert cos_sin_cache(4, 4, 100.0, scaling).shape == (4, 4)  # no prompt can pass the threshold

    bm = BlockManager(8, 4, enable_prefix_caching=True)
    params = SamplingParams()
    a, b, c = (Sequence(i, i, list(range(3, 12)), params, 0) for i in range(3))
    b.rope_offset = c.rope_offset = 8
    hashes = [bm.match_prefix(s)[1] for s in (a, b, c)]
    assert hashes[1] == hashes[2] and not set(hashes[0]) & set(hashes[1])
