"""Speculative decoding (worker/engine/speculation): outputs identical to plain decoding, greedy and
seeded draws, on every architecture and together with prefix reuse, chunked prefill, preemption, stop
strings, n > 1, logprobs and logits processing; the KV cache after rejections; the sampled
distribution against transformers; refused configurations."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import numpy as np
import pytest
import torch
from engine_oracle import VOCAB, mixed_prompts

from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.speculation.config import SpeculativeConfig

NGRAM = SpeculativeConfig("ngram", 4, adaptive=False)  # every proposal verified: the paths under test run
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)
ARCHS = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "phi3", "gpt_oss", "gemma2", "gemma3_text")


def _prompts() -> list[list[int]]:
    """mixed_prompts (shared prefixes, lengths 1..300) plus prompts that repeat a span (copy-heavy)."""
    g = torch.Generator().manual_seed(7)
    spans = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (6, 11, 23)]
    return mixed_prompts() + [s * 3 + s[:2] for s in spans]


def _run(path, prompts, params, **config: object) -> tuple[list, Engine]:
    engine = Engine.from_pretrained(path, EngineConfig(**{"kv_cache_bytes": 8 << 20, **config}))
    outs = engine.generate(prompts, params)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    engine.block_manager.check_invariants([])
    return outs, engine


def _same(a: list, b: list) -> None:
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.text for o in a] == [o.text for o in b]
    assert [o.finish_reason for o in a] == [o.finish_reason for o in b]


def _speculated(engine: Engine) -> None:
    """Proposals were verified, some accepted and some rejected (both paths ran)."""
    s = engine.stats
    assert s.spec_runs > 0 and 0 < s.spec_accepted_tokens < s.spec_proposed_tokens, s


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_identical_every_architecture(make_checkpoint, arch: str) -> None:
    path = make_checkpoint(arch).path
    plain, _ = _run(path, _prompts(), GREEDY)
    spec, engine = _run(path, _prompts(), GREEDY, speculative=NGRAM)
    _same(plain, spec)
    _speculated(engine)
    assert engine.stats.cached_tokens > 0  # prefix reuse ran too


def _perturbed(path, out):
    """A copy of the checkpoint whose last layer's attention output is scaled by 0.3: a draft that
    agrees with the target on many tokens, not all."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(path, out)
    weights = load_file(out / "model.safetensors")
    for name in weights:
        if "layers.1.self_attn.o_proj" in name:
            weights[name] = weights[name] * 0.3
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_identical_with_a_draft_model(make_checkpoint, tmp_path, arch: str) -> None:
    """The draft: the target with its last attention output damped (_perturbed), so its proposals are
    partly right; sampled rows keep their seeded tokens too."""
    path = make_checkpoint(arch).path
    draft = SpeculativeConfig("draft", 3, str(_perturbed(path, tmp_path / "draft")), adaptive=False)
    prompts = _prompts()
    params = [GREEDY if i % 3 else dataclasses.replace(GREEDY, temperature=0.3, seed=i) for i in range(len(prompts))]
    plain, _ = _run(path, prompts, params)
    spec, engine = _run(path, prompts, params, speculative=draft)
    _same(plain, spec)
    _speculated(engine)


def test_draft_steps_on_the_c_stack_propose_what_the_generic_path_proposes(make_checkpoint, tmp_path) -> None:
    """The draft's greedy steps straight on the C decode stack (DraftStack: short catch-ups as
    decode rows, the K - 1 steps, an lm_head GEMV) propose the tokens the generic forward proposes:
    the same acceptance counts, the same outputs."""
    path = make_checkpoint("llama").path
    draft = SpeculativeConfig("draft", 4, str(_perturbed(path, tmp_path / "draft")), adaptive=False)
    counts = {}
    outs = {}
    for fast in (True, False):
        engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20, speculative=draft))
        model = engine.speculator.draft
        assert model.fast is not None  # a Llama on the CPU backend: bound to the stack
        calls = []
        if fast:
            greedy = model.fast.greedy
            model.fast.greedy = lambda *a, _c=calls, _g=greedy, **k: _c.append(a[0].size) or _g(*a, **k)
        else:
            model.fast = None
        outs[fast] = engine.generate(_prompts(), GREEDY)
        s = engine.stats
        counts[fast] = (s.spec_runs, s.spec_proposed_tokens, s.spec_accepted_tokens)
        if fast:  # catch-ups of several rows (the target's token and an accepted one) ran there too
            assert calls and max(calls) > len(_prompts())
    _same(outs[True], outs[False])
    assert counts[True] == counts[False] and counts[True][2] > 0


def test_a_draft_proposal_ends_where_the_early_stop_says(make_checkpoint, tmp_path) -> None:
    """DraftModel.propose asks after each drafted token whether to draft another (the speculator's
    early stop, here: two tokens each) and hands back the draft's probability of each token; the
    shorter proposals verify as usual and the outputs stay plain decoding's."""
    path = make_checkpoint("llama").path
    draft = SpeculativeConfig("draft", 4, str(_perturbed(path, tmp_path / "draft")), adaptive=False)
    engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20, speculative=draft))
    asked: list[list[float]] = []

    def two_each(i: int, probs: list[float]) -> bool:
        asked.append(list(probs))
        return len(probs) < 2

    engine.speculator._go_on = lambda rows, wanted, queued: two_each  # type: ignore[method-assign]
    spec = engine.generate(_prompts(), GREEDY)
    plain, _ = _run(path, _prompts(), GREEDY)
    _same(plain, spec)
    s = engine.stats
    assert s.spec_runs > 0 and s.spec_proposed_tokens <= 2 * s.spec_runs and s.spec_accepted_tokens > 0
    assert {len(p) for p in asked} == {1, 2} and all(0 < q <= 1 for p in asked for q in p)


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
    plain, base = _run(path, _prompts(), GREEDY, **config)
    spec, engine = _run(path, _prompts(), GREEDY, speculative=NGRAM, **config)
    _same(plain, spec)
    _speculated(engine)
    if "kv_cache_bytes" in config:
        assert engine.stats.preemptions > 0
    assert engine.stats.decode_tokens == base.stats.decode_tokens


def test_sampling_processing_logprobs_choices_identical(make_checkpoint) -> None:
    """Seeded draws keep their tokens (the verifier draws each position with the plain step's uniform);
    penalties count the accepted tokens of the run; logprobs of every kept token; n > 1 choices."""
    path = make_checkpoint("qwen3").path
    prompts = _prompts()
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
    plain, _ = _run(path, prompts, params)
    spec, engine = _run(path, prompts, params, speculative=NGRAM)
    _same(plain, spec)
    for a, b in zip(plain, spec, strict=True):
        assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
        for la, lb in zip(a.logprobs, b.logprobs, strict=True):
            assert la.keys() == lb.keys()
            assert np.allclose(list(la.values()), list(lb.values()), atol=1e-4)
    _speculated(engine)


def test_stop_strings_and_stop_ids(make_checkpoint) -> None:
    path = make_checkpoint("llama").path
    prompts = _prompts()
    plain, _ = _run(path, prompts, GREEDY)
    stops = []
    for o in plain:
        text = o.text
        stops.append(text[len(text) // 2 : len(text) // 2 + 2] if text[len(text) // 2 :].strip() else "zz")
    params = [dataclasses.replace(GREEDY, stop=[s], stop_token_ids=[o.token_ids[-3]]) for s, o in zip(stops, plain, strict=True)]
    want, _ = _run(path, prompts, params)
    got, engine = _run(path, prompts, params, speculative=NGRAM)
    _same(want, got)
    assert any(o.finish_reason == "stop" for o in got)
    _speculated(engine)


def _kv(engine: Engine, seq) -> list[torch.Tensor]:
    """seq's K and V for its computed positions, every layer."""
    bs = engine.config.block_size
    pos = torch.arange(seq.num_computed_tokens)
    blocks = torch.tensor(seq.block_table)[pos // bs]
    return [c[blocks, pos % bs] for kv in engine.runner.kv_caches for c in kv]


def test_kv_cache_after_rejections_equals_plain_decoding(make_checkpoint) -> None:
    """Step by step: the rows' bookkeeping holds after every verify step, the rejected tokens' blocks
    are given back, and the K/V kept equals plain decoding's for the same (identical) tokens."""
    path = make_checkpoint("qwen2").path
    prompt = _prompts()[-1]
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
    _speculated(engines["spec"])
    n = len(prompt) + 40
    assert seqs["plain"].token_ids[:n] == seqs["spec"].token_ids[:n]
    upto = min(seqs["plain"].num_computed_tokens, seqs["spec"].num_computed_tokens)
    for a, b in zip(_kv(engines["plain"], seqs["plain"]), _kv(engines["spec"], seqs["spec"]), strict=True):
        assert torch.allclose(a[:upto], b[:upto], atol=1e-5)


def test_verify_rows_on_a_thread_team(make_checkpoint) -> None:
    """A model big enough for the C decode stack to run a team of threads: a verify step's rows of one
    sequence read each other's K/V, stored by other threads (a barrier between store and attention).
    The draft is the target itself, so every proposal is right and every one must be accepted."""
    ckpt = make_checkpoint("llama", hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                           num_key_value_heads=4, head_dim=64)  # fmt: skip
    prompts = _prompts()[-3:]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    before = torch.get_num_threads()
    try:
        plain, _ = _run(ckpt.path, prompts, params, num_threads=2)
        draft = SpeculativeConfig("draft", 4, str(ckpt.path), adaptive=False)
        spec, engine = _run(ckpt.path, prompts, params, num_threads=2, speculative=draft)
    finally:
        torch.set_num_threads(before)
    assert engine.runner.model.decode_stack is not None
    _same(plain, spec)
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


def test_committed_draft_proposes_for_the_reference_model() -> None:
    """examples/models/pycoder-tiny-draft (bench/train_reference.py's draft recipe) shares the
    reference model's tokenizer, loads as its draft and keeps its greedy tokens."""
    from pathlib import Path

    models = Path(__file__).resolve().parents[2] / "examples" / "models"
    prompts = ["def add(a, b):\n    return a + b\n\n\ndef", "import os\nimport sys\n\n\nclass Config:\n"]
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    draft = SpeculativeConfig("draft", 4, str(models / "pycoder-tiny-draft"), adaptive=False)
    plain, _ = _run(models / "pycoder-tiny", prompts, params, max_model_len=256)
    spec, engine = _run(models / "pycoder-tiny", prompts, params, max_model_len=256, speculative=draft)
    _same(plain, spec)
    assert engine.stats.spec_accepted_tokens > 0


def test_constrained_rows_beside_speculating_rows(make_checkpoint) -> None:
    """Structured-output rows speculate beside unconstrained ones (their verify rows are masked along
    the run; more in test_speculative_structured.py): every row's tokens equal plain decoding's."""
    from worker.engine.constraint import Constraint

    path = make_checkpoint("llama").path
    prompts = _prompts()
    choice = Constraint("choice", choices=("alpha", "beta gamma", "delta"))
    regex = Constraint("regex", r"[a-z]{3,12}( [a-z]{2,8}){0,3}")
    params = [dataclasses.replace(GREEDY, max_tokens=16, constraint=(choice, regex)[i % 2]) if i % 3 == 0 else GREEDY
              for i in range(len(prompts))]  # fmt: skip
    plain, _ = _run(path, prompts, params)
    spec, engine = _run(path, prompts, params, speculative=NGRAM)
    _same(plain, spec)
    _speculated(engine)
    assert engine.stats.constrained_requests > 0
