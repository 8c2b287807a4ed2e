"""Speculative decoding (worker/engine/speculation): outputs identical to plain decoding, greedy and
seeded draws, on every architecture and together with prefix reuse, chunked prefill, preemption, stop
strings, n > 1, logprobs and logits processing; the KV cache after rejections; the sampled
distribution against transformers; refused configurations. A draft model's own cases:
test_speculative_draft.py."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import numpy as np
import pytest
import torch
from speculation_cases import ARCHS, GREEDY, NGRAM, run, same, spec_prompts, speculated

from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.speculation.config import SpeculativeConfig


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_identical_every_architecture(make_checkpoint, arch: str) -> None:
    path = make_checkpoint(arch).path
    plain, _ = run(path, spec_prompts(), GREEDY)
    spec, engine = run(path, spec_prompts(), GREEDY, speculative=NGRAM)
    same(plain, spec)
    speculated(engine)
    assert engine.stats.cached_tokens > 0  # prefix reuse ran too


@pytest.mark.parametrize(
    "config",
    [
        {"max_num_batched_tokens": 24, "max_num_seqs": 3},  # chunked prefill
        {"kv_cache_bytes": 30 * 8192, "max_num_seqs": 8},  # preemption (30 blocks of 8 KiB)
        {"enable_prefix_caching": False},
        {"backend": "torch"},
        {"decode_stack": False},
        {"static_decode": True},
    ],
)
def test_greedy_identical_with_engine_features(make_checkpoint, config: dict) -> None:
    path = make_checkpoint("llama").path
    plain, base = run(path, spec_prompts(), GREEDY, **config)
    spec, engine = run(path, spec_prompts(), GREEDY, speculative=NGRAM, **config)
    same(plain, spec)
    speculated(engine)
    if "kv_cache_bytes" in config:
        assert engine.stats.preemptions > 0
    assert engine.stats.decode_tokens == base.stats.decode_tokens


def test_sampling_processing_logprobs_choices_identical(make_checkpoint) -> None:
    """Seeded draws keep their tokens (the verifier draws each position with the plain step's uniform);
    penalties count the accepted tokens of the run; logprobs of every kept token; n > 1 choices."""
    path = make_checkpoint("qwen3").path
    prompts = spec_prompts()
    base = SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.2, seed=3, logprobs=2)
    params = [
        base,
        dataclasses.replace(base, top_k=5, top_p=0.9, min_p=0.05),
        dataclasses.replace(base, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3),
        dataclasses.replace(base, temperature=0.0, repetition_penalty=1.2, logit_bias=((5, 2.0),)),
        dataclasses.replace(base, min_tokens=10, ignore_eos=False, stop_token_ids=(7, 9)),
        dataclasses.replace(base, n=3),
    ]
    params = [params[i % len(params)] for i in range(len(prompts))]
    plain, _ = run(path, prompts, params)
    spec, engine = run(path, prompts, params, speculative=NGRAM)
    same(plain, spec)
    for a, b in zip(plain, spec, strict=True):
        assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
        for la, lb in zip(a.logprobs, b.logprobs, strict=True):
            assert la.keys() == lb.keys()
            assert np.allclose(list(la.values()), list(lb.values()), atol=1e-4)
    speculated(engine)


def test_stop_strings_and_stop_ids(make_checkpoint) -> None:
    path = make_checkpoint("llama").path
    prompts = spec_prompts()
    plain, _ = run(path, prompts, GREEDY)
    stops = []
    for o in plain:
        text = o.text
        stops.append(text[len(text) // 2 : len(text) // 2 + 2] if text[len(text) // 2 :].strip() else "zz")
    params = [dataclasses.replace(GREEDY, stop=[s], stop_token_ids=[o.token_ids[-3]]) for s, o in zip(stops, plain, strict=True)]
    want, _ = run(path, prompts, params)
    got, engine = run(path, prompts, params, speculative=NGRAM)
    same(want, got)
    assert any(o.finish_reason == "stop" for o in got)
    speculated(engine)


def _kv(engine: Engine, seq) -> list[torch.Tensor]:
    """seq's K and V for its computed positions, every layer."""
    bs = engine.config.block_size
    pos = torch.arange(seq.num_computed_tokens)
    blocks = torch.tensor(seq.block_table)[pos // bs]
    return [c[blocks, pos % bs] for kv in engine.runner.kv_caches for c in kv]


def test_kv_cache_after_rejections_equals_plain_decoding(make_checkpoint) -> None:
    """Step by step: the rows' bookkeeping holds after every verify step, the rejected tokens' blocks
    are given back, and the K/V kept equals plain decoding's for the same (identical) tokens (bit for
    bit on the CPU's decode stack)."""
    path = make_checkpoint("qwen2").path
    prompt = spec_prompts()[-1]
    seqs = {}
    engines = {}
    for name, spec in (("plain", None), ("spec", NGRAM)):
        engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20, speculative=spec))
        seq = engine._request(0, prompt, SamplingParams(max_tokens=200, ignore_eos=True), 0)
        engine.scheduler.add(seq)
        while len(seq.token_ids) < len(prompt) + 40:
            engine.step()
            engine.batch.check_row(seq)
            engine.block_manager.check_invariants([seq])
            bm = engine.block_manager  # no block past the newest token (rejected tokens' blocks given back)
            assert bm.blocks_for(seq.num_computed_tokens) <= len(seq.block_table) <= bm.blocks_for(len(seq.token_ids))
        seqs[name], engines[name] = seq, engine
    speculated(engines["spec"])
    n = len(prompt) + 40
    assert seqs["plain"].token_ids[:n] == seqs["spec"].token_ids[:n]
    upto = min(seqs["plain"].num_computed_tokens, seqs["spec"].num_computed_tokens)
    # on the CPU's decode stack bit for bit: one-row steps and verify rows take the same packed
    # products (decode_stack.c, STACK_PACKED_ROWS); elsewhere to rounding
    exact = all(e.runner.model.decode_stack is not None for e in engines.values())
    for a, b in zip(_kv(engines["plain"], seqs["plain"]), _kv(engines["spec"], seqs["spec"]), strict=True):
        assert torch.equal(a[:upto], b[:upto]) if exact else torch.allclose(a[:upto], b[:upto], atol=1e-5)


def test_verify_rows_on_a_thread_team(make_checkpoint) -> None:
    """A model big enough for the C decode stack to run a team of threads: a verify step's rows of one
    sequence read each other's K/V, stored by other threads (a barrier between store and attention).
    The draft is the target itself, so every proposal is right and every one must be accepted."""
    ckpt = make_checkpoint("llama", hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                           num_key_value_heads=4, head_dim=64)  # fmt: skip
    prompts = spec_prompts()[-3:]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    before = torch.get_num_threads()
    try:
        plain, _ = run(ckpt.path, prompts, params, num_threads=2)
        draft = SpeculativeConfig("draft", 4, str(ckpt.path), adaptive=False)
        spec, engine = run(ckpt.path, prompts, params, num_threads=2, speculative=draft)
    finally:
        torch.set_num_threads(before)
    assert engine.runner.model.decode_stack is not None
    same(plain, spec)
    s = engine.stats
    assert s.spec_proposed_tokens > 0 and s.spec_accepted_tokens == s.spec_proposed_tokens, s


def _chi2_critical(dof: int, z: float) -> float:
    """Wilson-Hilferty: the chi-square quantile with `dof` degrees of freedom at normal quantile z."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def test_sampled_distribution_matches_transformers(make_checkpoint) -> None:
    """On a 12-token vocabulary, 3000 seeds: the first two sampled tokens (the second verified against
    a proposal whenever the first matched the prompt's pattern) follow transformers' exact joint
    distribution (chi-square goodness of fit, level 0.001), and a seeded row reproduces."""
    vocab = 12
    ckpt = make_checkpoint("llama", seed=3, vocab_size=vocab, initializer_range=0.02)
    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5]
    with torch.no_grad():
        p1 = torch.softmax(ckpt.model(torch.tensor([prompt])).logits[0, -1].double(), -1)
        p2 = torch.softmax(ckpt.model(torch.tensor([prompt + [t] for t in range(vocab)])).logits[:, -1].double(), -1)
    joint = (p1[:, None] * p2).flatten().numpy()  # P(t1, t2)
    seeds = 3000
    params = [SamplingParams(max_tokens=3, temperature=1.0, seed=s, ignore_eos=True) for s in range(seeds)]
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=8 << 20, max_num_seqs=256,
                                                            speculative=NGRAM))  # fmt: skip
    outs = engine.generate([prompt] * seeds, params)
    assert engine.stats.spec_runs > 1000 and engine.stats.spec_accepted_tokens > 0
    counts = np.zeros(vocab * vocab)
    for o in outs:
        counts[o.token_ids[0] * vocab + o.token_ids[1]] += 1
    expected = joint * seeds
    big = expected >= 5  # pool the rare cells into one
    obs, exp = counts[big], expected[big]
    if not big.all():
        obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, expected[~big].sum())
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    dof = obs.size - 1
    assert chi2 < _chi2_critical(dof, 3.090), (chi2, dof)  # z = 3.090: the 0.999 quantile
    again = engine.generate([[9, 9] + prompt, prompt], [params[0], params[17]])
    assert again[1].token_ids == outs[17].token_ids  # same seed, other batch: same tokens


def test_bad_configuration_refused(make_checkpoint, tmp_path) -> None:
    with pytest.raises(ValueError, match="K"):
        SpeculativeConfig("ngram", 0)
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig("medusa", 4)
    with pytest.raises(ValueError, match="draft_model"):
        SpeculativeConfig("draft", 4)
    with pytest.raises(ValueError, match="overlap"):
        EngineConfig(speculative=NGRAM, overlap_steps=True)
    with pytest.raises(ValueError, match="ngram' or 'draft:PATH"):
        SpeculativeConfig.parse("draft:")
    assert SpeculativeConfig.parse("draft:/m", 3) == SpeculativeConfig("draft", 3, "/m")
    # without K, each method's default: prompt lookup's proposals are free, a draft's tokens are not
    assert SpeculativeConfig.parse("ngram").num_tokens == 8 and SpeculativeConfig("draft", None, "/m").num_tokens == 6
    path = make_checkpoint("llama").path

    def refused(draft: object, match: str) -> None:
        with pytest.raises(ValueError, match=match):
            Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20,
                                                      speculative=SpeculativeConfig("draft", 2, str(draft))))  # fmt: skip

    refused(tmp_path / "missing", "does not load")
    refused(make_checkpoint("llama", vocab_size=512).path, "vocabulary of 512 tokens")
    other = tmp_path / "other-tokenizer"
    shutil.copytree(path, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    name = next(t for t, i in vocab.items() if i == 100)
    vocab["renamed"] = vocab.pop(name)
    (other / "tokenizer.json").write_text(json.dumps(tok))
    refused(other, "another tokenizer")
    listed = tmp_path / "bad-draft-vocab"
    shutil.copytree(path, listed)
    vocab_size = json.loads((path / "config.json").read_text())["vocab_size"]
    for bad in ("[1, 2]", '{"token_ids": []}', '{"token_ids": [1, 1]}', f'{{"token_ids": [{vocab_size}]}}', "{"):
        (listed / "draft_vocab.json").write_text(bad)
        refused(listed, "draft_vocab.json must hold")


def test_constrained_rows_beside_speculating_rows(make_checkpoint) -> None:
    """Structured-output rows speculate beside unconstrained ones (their verify rows are masked along
    the run; more in test_speculative_structured.py): every row's tokens equal plain decoding's."""
    from contracts.constraint import Constraint

    path = make_checkpoint("llama").path
    prompts = spec_prompts()
    choice = Constraint("choice", choices=("alpha", "beta gamma", "delta"))
    regex = Constraint("regex", r"[a-z]{3,12}( [a-z]{2,8}){0,3}")
    params = [dataclasses.replace(GREEDY, max_tokens=16, constraint=(choice, regex)[i % 2]) if i % 3 == 0 else GREEDY
              for i in range(len(prompts))]  # fmt: skip
    plain, _ = run(path, prompts, params)
    spec, engine = run(path, prompts, params, speculative=NGRAM)
    same(plain, spec)
    speculated(engine)
    assert engine.stats.constrained_requests > 0
