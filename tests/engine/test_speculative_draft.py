"""Speculative decoding with a draft model: outputs identical to plain decoding on every
architecture, the C stack's draft steps against the generic path's, the early stop, and the
committed draft for the reference model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from speculation_cases import ARCHS, GREEDY, perturbed, run, same, spec_prompts, speculated

from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.speculation.config import SpeculativeConfig


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_identical_with_a_draft_model(make_checkpoint, tmp_path, arch: str) -> None:
    """The draft: the target with its last attention output damped (_perturbed), so its proposals are
    partly right; sampled rows keep their seeded tokens too."""
    path = make_checkpoint(arch).path
    draft = SpeculativeConfig("draft", 3, str(perturbed(path, tmp_path / "draft")), adaptive=False)
    prompts = spec_prompts()
    params = [GREEDY if i % 3 else dataclasses.replace(GREEDY, temperature=0.3, seed=i) for i in range(len(prompts))]
    plain, _ = run(path, prompts, params)
    spec, engine = run(path, prompts, params, speculative=draft)
    same(plain, spec)
    speculated(engine)


@pytest.mark.parametrize(("half", "frequent"), [(False, False), (True, False), (True, True)])
def test_draft_steps_on_the_c_stack_propose_what_the_generic_path_proposes(make_checkpoint, tmp_path, half: bool,
                                                                           frequent: bool) -> None:  # fmt: skip
    """The draft on the C decode stack proposes the tokens the generic forward proposes, both as one
    C call per proposal (DraftChain: the catch-up rows, then every drafting step) and step by step
    from Python (DraftStack.greedy: short catch-ups as decode rows, the K - 1 steps, the lm_head's
    product): the same acceptance counts, the same outputs. A draft stored in fp16 runs there on fp16
    copies of its matrices and lm_head (half the bytes, the same products). With draft_vocab.json
    (FR-Spec: the tokens the draft may propose, here every other id) every path proposes among those
    tokens only, and the outputs are still plain decoding's."""
    path = make_checkpoint("llama").path
    folder = perturbed(path, tmp_path / "draft", half)
    allowed = None
    if frequent:
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        allowed = set(range(0, vocab, 2))
        (folder / "draft_vocab.json").write_text(json.dumps({"token_ids": sorted(allowed, reverse=True)}))
    draft = SpeculativeConfig("draft", 4, str(folder), adaptive=False)
    counts = {}
    outs = {}
    for mode in ("chain", "steps", "generic"):
        engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20, speculative=draft))
        model = engine.speculator.draft
        assert model.fast is not None and model.fast.half == half  # a Llama on the CPU backend: bound to the stack
        proposed: list[int] = []
        model_propose = model.propose
        model.propose = lambda *a, _p=model_propose, _o=proposed, **k: (r := _p(*a, **k), _o.extend(
            t for row in r[0] for t in row))[0]  # fmt: skip
        calls: list[tuple[int, int]] = []
        if mode == "chain":
            chain = model.fast.chain
            propose = chain.propose
            chain.propose = lambda *a, _c=calls, _p=propose, **k: _c.append((a[0].size, a[3].size)) or _p(*a, **k)
        elif mode == "steps":
            model.fast.chain.takes = lambda rows: False
            greedy = model.fast.greedy
            model.fast.greedy = lambda *a, _c=calls, _g=greedy, **k: _c.append((a[0].size, 0)) or _g(*a, **k)
        else:
            model.fast = None
        outs[mode] = engine.generate(spec_prompts(), GREEDY)
        s = engine.stats
        counts[mode] = (s.spec_runs, s.spec_proposed_tokens, s.spec_accepted_tokens)
        if mode != "generic":  # catch-ups of several rows (the target's token and an accepted one) ran there too
            assert calls and max(rows for rows, _ in calls) > len(spec_prompts())
        assert proposed and (allowed is None or set(proposed) <= allowed)
    same(outs["chain"], outs["generic"])
    same(outs["steps"], outs["generic"])
    assert counts["chain"] == counts["steps"] == counts["generic"] and counts["chain"][2] > 0
    if frequent:
        same(outs["chain"], Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20)).generate(
            spec_prompts(), GREEDY))  # fmt: skip


def test_a_draft_proposal_ends_where_the_early_stop_says(make_checkpoint, tmp_path) -> None:
    """DraftModel.propose asks after each drafted token whether to draft another (the speculator's
    early stop, here: two tokens each) and hands back the draft's probability of each token; the
    shorter proposals verify as usual and the outputs stay plain decoding's."""
    path = make_checkpoint("llama").path
    draft = SpeculativeConfig("draft", 4, str(perturbed(path, tmp_path / "draft")), adaptive=False)
    engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20, speculative=draft))
    asked: list[list[float]] = []

    def two_each(i: int, probs: list[float]) -> bool:
        asked.append(list(probs))
        return len(probs) < 2

    engine.speculator._go_on = lambda rows, wanted, queued: two_each  # type: ignore[method-assign]
    spec = engine.generate(spec_prompts(), GREEDY)
    plain, _ = run(path, spec_prompts(), GREEDY)
    same(plain, spec)
    s = engine.stats
    assert s.spec_runs > 0 and s.spec_proposed_tokens <= 2 * s.spec_runs and s.spec_accepted_tokens > 0
    assert {len(p) for p in asked} == {1, 2} and all(0 < q <= 1 for p in asked for q in p)


def test_the_chain_stops_where_the_speculators_rule_says(make_checkpoint, tmp_path) -> None:
    """The early stop (ChainStop: the product of the drafted tokens' chances, by the draft's
    probability of each, times the overall chance and the row's token value, against a drafted
    token's cost) decides in C inside DraftChain as it does in Python step by step: the same
    proposals, some cut short and some drafted to K, and plain decoding's outputs."""
    from worker.engine.speculation.acceptance import CONFIDENCE_EDGES
    from worker.engine.speculation.chain_stop import ChainStop

    path = make_checkpoint("llama").path
    draft = SpeculativeConfig("draft", 4, str(perturbed(path, tmp_path / "draft")), adaptive=False)
    chances = (0.5, 0.6, 0.7, 0.8, 0.9, 0.99)
    counts, outs = {}, {}
    for mode in ("chain", "steps"):
        engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20, speculative=draft))
        model = engine.speculator.draft
        calls: list[int] = []
        if mode == "chain":
            propose = model.fast.chain.propose
            model.fast.chain.propose = lambda *a, _c=calls, _p=propose, **k: _c.append(1) or _p(*a, **k)
        else:
            model.fast.chain.takes = lambda rows: False
        engine.speculator._go_on = lambda width, values, tokens: ChainStop(  # type: ignore[method-assign]
            CONFIDENCE_EDGES, chances, 0.7, 0.2, tuple(1.0 + 0.1 * i for i in range(len(values))))
        outs[mode] = engine.generate(spec_prompts(), GREEDY)
        s = engine.stats
        counts[mode] = (s.spec_runs, s.spec_proposed_tokens, s.spec_accepted_tokens)
        assert bool(calls) == (mode == "chain")
    plain, _ = run(path, spec_prompts(), GREEDY)
    same(plain, outs["chain"])
    same(plain, outs["steps"])
    runs, proposed, _ = counts["chain"]
    assert counts["chain"] == counts["steps"] and runs < proposed < 4 * runs


def test_the_chain_refuses_what_it_cannot_run(make_checkpoint, tmp_path) -> None:
    """DraftChain.propose refuses before its first forward: a token id or position out of range, a
    block table too narrow for the tokens after the catch-up (IndexError from C), more rows than its
    GEMVs take or no row at all (ValueError); a valid call drafts each sequence's ks tokens. A chain
    over some of the head's rows needs their distinct token ids, and proposes among them only."""
    import numpy as np

    from kernels.cpu.draft_chain import DraftChain

    path = make_checkpoint("llama").path
    draft = SpeculativeConfig("draft", 4, str(perturbed(path, tmp_path / "draft")), adaptive=False)
    engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20, speculative=draft))
    chain = engine.speculator.draft.fast.chain
    table = np.arange(4, dtype=np.int32)[None, :]  # blocks 0..3 of the draft's cache, one sequence
    ok = dict(ids=np.array([5]), positions=np.array([3]), tables=table, last_rows=np.array([0]), ks=np.array([4]))
    tokens, probs, counts = chain.propose(**ok)
    assert counts.tolist() == [4] and tokens.shape == (1, 4) and (probs > 0).all() and (probs <= 1).all()
    for bad in (dict(ids=np.array([chain.vocab])), dict(positions=np.array([-1])), dict(tables=table[:, :1],
                                                                                          positions=np.array([14]))):
        with pytest.raises(IndexError):
            chain.propose(**{**ok, **bad})
    rows = chain._stack.gemv_rows + 1
    with pytest.raises(ValueError, match="at most"):
        chain.propose(np.zeros(rows, np.int64), np.arange(rows), np.repeat(table, rows, axis=0),
                      np.array([rows - 1]), np.array([1]))  # fmt: skip
    with pytest.raises(ValueError):
        chain.propose(np.zeros(0, np.int64), np.zeros(0, np.int64), table[:0], np.zeros(0, np.int64),
                      np.array([1]))  # fmt: skip
    # a frequent-token head: its rows' token ids must be distinct tokens of the vocabulary, and given
    head = engine.speculator.draft.runner.model.lm_head.weight.detach()[:8].contiguous()
    for ids in (np.arange(7), np.array([0, 1, 2, 3, 4, 5, 6, 6]), np.arange(8) + chain.vocab - 4, None):
        with pytest.raises(ValueError, match="head"):
            DraftChain(chain._stack, chain._embed, head, None, ids)
    with pytest.raises(ValueError, match="packed head"):  # not pack_rows(head): the C product would misread it
        DraftChain(chain._stack, chain._embed, head, head.unsqueeze(0).contiguous(), np.arange(8) * 3)
    sub = DraftChain(chain._stack, chain._embed, head, None, np.arange(8) * 3)
    tokens, _, counts = sub.propose(**ok)
    assert counts.tolist() == [4] and set(tokens[0].tolist()) <= set(range(0, 24, 3))


def test_committed_draft_proposes_for_the_reference_model() -> None:
    """examples/models/pycoder-tiny-draft (bench/train_reference.py's draft recipe) shares the
    reference model's tokenizer, loads as its draft and keeps its greedy tokens."""

    models = Path(__file__).resolve().parents[2] / "examples" / "models"
    prompts = ["def add(a, b):\n    return a + b\n\n\ndef", "import os\nimport sys\n\n\nclass Config:\n"]
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    draft = SpeculativeConfig("draft", 4, str(models / "pycoder-tiny-draft"), adaptive=False)
    plain, _ = run(models / "pycoder-tiny", prompts, params, max_model_len=256)
    spec, engine = run(models / "pycoder-tiny", prompts, params, max_model_len=256, speculative=draft)
    same(plain, spec)
    assert engine.stats.spec_accepted_tokens > 0
