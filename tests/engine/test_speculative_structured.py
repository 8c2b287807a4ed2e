"""Speculative decoding of structured-output rows: a constrained row's proposals are cut to the prefix
its grammar accepts and its verify rows take the grammar's masks, so its tokens, finish reasons and
errors are those of plain decoding (greedy and seeded draws; JSON schema, regex, choice, grammar,
beside unconstrained rows; n > 1, logprobs, preemption), with proposals both accepted and cut."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from structured_cases import constraints, satisfies

from contracts.constraint import Constraint
from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.speculation.config import SpeculativeConfig

NGRAM = SpeculativeConfig("ngram", 4, adaptive=False)  # every proposal verified
# outputs long enough for a random model's greedy loops to repeat (what prompt lookup proposes)
LONG = [
    Constraint("regex", r"[a-c]{20,40}"),
    Constraint.json_schema({"type": "array", "items": {"enum": ["x", "y", "zz"]}, "minItems": 4, "maxItems": 12}),
    Constraint.json_schema({"type": "object", "properties": {"s": {"type": "string", "maxLength": 30}}, "required": ["s"]}),
]  # fmt: skip
# JSON-like text repeated: prompt lookup fires on it (and proposes tokens a grammar refuses)
TEXTS = ['{"ok": true, "tags": ["x", "y"]} ', '["x", "y", "zz", "x"] ', 'abcabc {"s": "abc"} ', '{"level": 3} ']


def _requests() -> tuple[list[str], list[SamplingParams]]:
    prompts, params = [], []
    for i, c in enumerate(constraints() + LONG):
        for temperature in (0.0, 1.0):
            prompts.append(TEXTS[i % len(TEXTS)] * (2 + i % 3))
            params.append(SamplingParams(max_tokens=40, temperature=temperature, seed=i, constraint=c,
                                         logprobs=2 if i % 5 == 0 else None))  # fmt: skip
        if i % 3 == 0:  # unconstrained neighbours
            prompts.append(TEXTS[(i + 1) % len(TEXTS)] * 3)
            params.append(SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.0 if i % 2 else 0.8, seed=i))
    prompts.append(TEXTS[1] * 3)  # n > 1 under a constraint (choices draw with seed + i)
    params.append(SamplingParams(max_tokens=32, temperature=1.0, seed=5, n=3, constraint=LONG[1]))
    return prompts, params


def _spy(engine: Engine) -> list[tuple[bool, int, int]]:
    """(constrained, proposed, accepted) of every verified run."""
    seen: list[tuple[bool, int, int]] = []
    verify = engine.runner.verifier.verify

    def spy(logits, chunks, constrain_runs=None):  # noqa: ANN001, ANN202
        runs = verify(logits, chunks, constrain_runs)
        seen.extend((r.seq.params.constraint is not None, r.proposed, r.accepted) for r in runs)
        return runs

    engine.runner.verifier.verify = spy
    return seen


def _run(path, prompts, params, **config: object) -> tuple[list, Engine, list]:
    engine = Engine.from_pretrained(path, EngineConfig(**{"kv_cache_bytes": 8 << 20, **config}))
    seen = _spy(engine)
    outs = engine.generate(prompts, params)
    engine.block_manager.check_invariants([])
    return outs, engine, seen


def _same(a: list, b: list) -> None:
    for x, y in zip(a, b, strict=True):
        assert [o.token_ids for o in x.outputs] == [o.token_ids for o in y.outputs]
        assert [o.text for o in x.outputs] == [o.text for o in y.outputs]
        assert [o.finish_reason for o in x.outputs] == [o.finish_reason for o in y.outputs]
        assert x.error == y.error
        for la, lb in zip(x.logprobs or [], y.logprobs or [], strict=True):
            assert la.keys() == lb.keys()
            assert np.allclose(list(la.values()), list(lb.values()), atol=1e-4)


def _constrained_speculated(engine: Engine, seen: list[tuple[bool, int, int]]) -> None:
    """Constrained rows' proposals were verified, some accepted, some rejected, some cut by the grammar."""
    runs = [(p, a) for c, p, a in seen if c]
    assert runs and 0 < sum(a for _, a in runs) < sum(p for p, _ in runs), runs
    assert engine.stats.spec_grammar_cut_tokens > 0


@pytest.mark.parametrize("config", [{}, {"kv_cache_bytes": 16 * 8192, "max_num_seqs": 8}])  # preemption
def test_constrained_rows_speculate_with_plain_outputs(make_checkpoint, config: dict) -> None:
    path = make_checkpoint("llama").path
    prompts, params = _requests()
    plain, base, _ = _run(path, prompts, params, **config)
    spec, engine, seen = _run(path, prompts, params, speculative=NGRAM, **config)
    _same(plain, spec)
    _constrained_speculated(engine, seen)
    stopped = [(o, p.constraint) for out, p in zip(spec, params, strict=True) for o in out.outputs
               if p.constraint is not None and o.finish_reason == "stop"]  # fmt: skip
    assert len(stopped) > 10 and all(satisfies(o.text, c) for o, c in stopped)
    if "kv_cache_bytes" in config:
        assert engine.stats.preemptions > 0
    assert engine.stats.decode_tokens == base.stats.decode_tokens


def test_constrained_rows_speculate_with_a_draft_model(make_checkpoint, tmp_path) -> None:
    """A draft model's greedy proposals (it knows no grammar) cut to the grammar's prefix."""
    from speculation_cases import perturbed

    path = make_checkpoint("llama").path
    draft = SpeculativeConfig("draft", 3, str(perturbed(path, tmp_path / "draft")), adaptive=False)
    prompts, params = _requests()
    plain, _, _ = _run(path, prompts, params)
    spec, engine, seen = _run(path, prompts, params, speculative=draft)
    _same(plain, spec)
    _constrained_speculated(engine, seen)


def test_dead_ends_are_the_plain_errors(make_checkpoint) -> None:
    """A grammar with no way on (an empty character class): the row ends with the plain step's error;
    a run whose first row is such a dead end is cut there with that failure (StructuredOutputs.mask_runs)."""
    path = make_checkpoint("llama").path
    params = [SamplingParams(max_tokens=30, constraint=Constraint("regex", r"x[^\s\S]"), temperature=t, seed=3)
              for t in (0.0, 1.0)]  # fmt: skip
    prompts = ["x x x x x x x x", "xxxx xxxx xxxx"]
    plain, _, _ = _run(path, prompts, params)
    spec, engine, _ = _run(path, prompts, params, speculative=NGRAM)
    _same(plain, spec)
    assert all(o.finish_reason == "error" and "no output can satisfy" in o.error for o in spec)
    state = engine.structured.grammars.state(Constraint("regex", r"x[^\s\S]"))
    seq = engine._request(0, [1, 2, 3], params[0], 0)
    seq.constraint_state = state
    import torch

    logits = torch.zeros(3, engine.vocab_size)
    cut = engine.structured.mask_runs(logits, [(0, seq, (5, 6))])[0]
    assert cut.allowed == 0 and "no output can satisfy" in cut.failure
    assert not torch.isinf(logits).any()  # a dead end's row allows every token (its token ends the row)


def test_fill_run_masks_are_the_masks_along_the_run(make_checkpoint) -> None:
    """StructuredOutputs.mask_runs: row j of a run is the mask after the first j proposals (the plain
    step's mask there), rows past the grammar's cut allow everything."""
    path = make_checkpoint("llama").path
    engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=8 << 20))
    c = Constraint.json_schema({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
    seq = engine._request(0, [1, 2, 3], dataclasses.replace(SamplingParams(), constraint=c), 0)
    seq.constraint_state = engine.structured.grammars.state(c)
    good = engine.tokenizer.encode('{"ok": true}', add_special_tokens=False)
    run = tuple(good[:3]) + (engine.tokenizer.encode("zz", add_special_tokens=False)[0],)
    import torch

    logits = torch.zeros(len(run) + 1, engine.vocab_size)
    cut = engine.structured.mask_runs(logits, [(0, seq, run)])[0]
    assert cut.allowed == 3 and cut.failure is None
    state = engine.structured.grammars.state(c)
    for j in range(4):
        one = torch.zeros(1, engine.vocab_size)
        engine.structured.mask(one, np.array([0]), [_Fake(state)])
        assert torch.equal(torch.isinf(logits[j]), torch.isinf(one[0])), j
        if j < 3:
            assert state.consume(run[j])
    assert not torch.isinf(logits[4]).any()  # past the cut: every token
    assert seq.constraint_state.validate(list(run)) == 3  # the state did not move


class _Fake:
    """What StructuredOutputs.mask reads of a sequence."""

    def __init__(self, state) -> None:  # noqa: ANN001
        self.constraint_state, self.is_finished = state, False
