"""Speculative decoding with a draft model: outputs identical to plain decoding on every
architecture, the C stack's draft steps against the generic path's, the early stop, and the
committed draft for the reference model."""

from __future__ import annotations

import dataclasses
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


@pytest.mark.parametrize("half", [False, True])
def test_draft_steps_on_the_c_stack_propose_what_the_generic_path_proposes(make_checkpoint, tmp_path,
                                                                           half: bool) -> None:  # fmt: skip
    """The draft's greedy steps straight on the C decode stack (DraftStack: short catch-ups as
    decode rows, the K - 1 steps, an lm_head GEMV) propose the tokens the generic forward proposes:
    the same acceptance counts, the same outputs. A draft stored in fp16 runs there on fp16 copies of
    its matrices and lm_head (half the bytes, the same products)."""
    path = make_checkpoint("llama").path
    draft = SpeculativeConfig("draft", 4, str(perturbed(path, tmp_path / "draft", half)), adaptive=False)
    counts = {}
    outs = {}
    for fast in (True, False):
        engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20, speculative=draft))
        model = engine.speculator.draft
        assert model.fast is not None and model.fast.half == half  # a Llama on the CPU backend: bound to the stack
        calls = []
        if fast:
            greedy = model.fast.greedy
            model.fast.greedy = lambda *a, _c=calls, _g=greedy, **k: _c.append(a[0].size) or _g(*a, **k)
        else:
            model.fast = None
        outs[fast] = engine.generate(spec_prompts(), GREEDY)
        s = engine.stats
        counts[fast] = (s.spec_runs, s.spec_proposed_tokens, s.spec_accepted_tokens)
        if fast:  # catch-ups of several rows (the target's token and an accepted one) ran there too
            assert calls and max(calls) > len(spec_prompts())
    same(outs[True], outs[False])
    assert counts[True] == counts[False] and counts[True][2] > 0


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
