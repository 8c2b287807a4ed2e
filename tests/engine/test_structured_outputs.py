"""Structured outputs end to end on a random-weights model: every row that finishes with "stop"
satisfies its constraint (jsonschema / re.fullmatch / a choice), in a batch mixing constraints and
unconstrained rows; seeds reproduce; bad constraints are row errors; n > 1, stop strings, logprobs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_oracle import VOCAB, random_prompt, small_engine
from structured_cases import constraints, satisfies

from contracts.constraint import Constraint
from worker.engine import SamplingParams

STOPS = tuple(range(3, VOCAB, 6))  # a sixth of the vocabulary



@pytest.fixture(scope="module")
def ckpt(make_checkpoint):
    return make_checkpoint("llama")



def _mixed(copies: int = 2) -> tuple[list[list[int]], list[SamplingParams]]:
    """Every constraint greedy and sampled, `copies` prompts each, plus unconstrained rows."""
    prompts, params = [], []
    for i, c in enumerate(constraints() * copies):
        for temperature in (0.0, 1.0):
            prompts.append(random_prompt(3 + (7 * i) % 40, i))
            params.append(SamplingParams(max_tokens=48, temperature=temperature, seed=i, constraint=c))
            if i % 4 == 0:  # some penalized and stopping on many ids: they finish (on a stop id, with the
                # next step already scheduled) while a constrained step is launched
                prompts.append(random_prompt(5 + i % 30, 1000 + i))
                params.append(SamplingParams(max_tokens=20, temperature=temperature, seed=i, stop_token_ids=STOPS,
                                             presence_penalty=0.5 if i % 8 == 0 else 0.0))  # fmt: skip
    return prompts, params


@pytest.mark.parametrize("overlap", [False, True])
def test_finished_rows_satisfy_their_constraints(ckpt, overlap: bool) -> None:
    prompts, params = _mixed()
    engine = small_engine(ckpt.path, overlap_steps=overlap, max_num_seqs=32)
    outs = engine.generate(prompts, params)
    constrained = [(o, p.constraint) for o, p in zip(outs, params, strict=True) if p.constraint is not None]
    stopped = [(o, c) for o, c in constrained if o.finish_reason == "stop"]
    assert all(o.finish_reason in ("stop", "length") and o.error is None for o, _ in constrained)
    bad = [(c.kind, c.spec or c.choices, o.text) for o, c in stopped if not satisfies(o.text, c)]
    assert not bad
    assert len(stopped) >= 0.7 * len(constrained), f"only {len(stopped)} of {len(constrained)} finished"
    assert {c.kind for _, c in stopped} == {"json_schema", "regex", "choice", "grammar"}
    stats = engine.stats.snapshot()
    assert stats.constrained_requests == len(constrained) and stats.mask_seconds > 0
    # one compile per distinct constraint, however many rows carry it
    assert engine.structured.grammars.compiles == len(constraints())
    # unconstrained rows are what they are without any constrained neighbour
    plain = [(pr, p) for pr, p in zip(prompts, params, strict=True) if p.constraint is None]
    alone = small_engine(ckpt.path).generate([pr for pr, _ in plain], [p for _, p in plain])
    mixed = [o for o, p in zip(outs, params, strict=True) if p.constraint is None]
    assert [o.token_ids for o in mixed] == [o.token_ids for o in alone]


def test_seeded_rows_reproduce_in_other_batches(ckpt) -> None:
    prompts, params = _mixed(copies=1)
    first = small_engine(ckpt.path).generate(prompts, params)
    order = list(reversed(range(len(prompts))))
    second = small_engine(ckpt.path, max_num_seqs=5).generate([prompts[i] for i in order], [params[i] for i in order])
    assert [o.token_ids for o in first] == [second[len(order) - 1 - i].token_ids for i in range(len(prompts))]


def test_unconstrained_jobs_never_build_the_grammar_engine(ckpt) -> None:
    engine = small_engine(ckpt.path)
    engine.generate([random_prompt(9, 1)], SamplingParams(max_tokens=5))
    assert engine.structured.grammars._tokenizer is None and engine.stats.mask_seconds == 0.0


def test_bad_constraints_are_row_errors_compiled_once(ckpt) -> None:
    engine = small_engine(ckpt.path)
    bad = {
        Constraint("regex", "a(b"): "unclosed group",
        Constraint.json_schema({"type": "array", "uniqueItems": True}): "uniqueItems",
        Constraint.json_schema({"type": "integer", "minimum": 5, "maximum": 3}): "minimum",
        Constraint("grammar", "start: nothing"): "nothing",
    }
    rows = [c for c in bad for _ in range(3)] + [Constraint("choice", choices=("ok",))]
    outs = engine.generate([random_prompt(4, i) for i in range(len(rows))],
                           [SamplingParams(max_tokens=8, constraint=c) for c in rows])  # fmt: skip
    for out, c in zip(outs[:-1], rows[:-1], strict=True):
        assert out.finish_reason == "error" and bad[c] in out.error and out.token_ids == []
    assert (outs[-1].text, outs[-1].finish_reason) == ("ok", "stop")
    assert engine.structured.grammars.compiles == len(bad) + 1


def test_unsatisfiable_constraint_ends_the_row_with_an_error(ckpt) -> None:
    """A regex of an empty character class: no token but EOS is ever allowed, and EOS before the
    grammar accepts is not an answer: an error, not a hang or an EOS-"stop"."""
    engine = small_engine(ckpt.path)
    outs = engine.generate([random_prompt(6, 1), random_prompt(6, 2)], [
        SamplingParams(max_tokens=50, constraint=Constraint("regex", r"[^\s\S]")),
        SamplingParams(max_tokens=50, constraint=Constraint("regex", r"x[^\s\S]"), temperature=1.0, seed=3)])  # fmt: skip
    for out in outs:
        assert out.finish_reason == "error" and "no output can satisfy" in out.error
    assert len(outs[1].token_ids) <= 2


def test_n_choices_each_follow_the_constraint(ckpt) -> None:
    engine = small_engine(ckpt.path)
    c = Constraint("regex", r"[a-z]{1,3}(,[a-z]{1,3}){0,2}")
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=11, constraint=c)
    out = engine.generate([random_prompt(23, 5)], dataclasses.replace(params, n=4))[0]
    assert len({o.text for o in out.outputs}) > 1
    assert all(o.finish_reason == "length" or satisfies(o.text, c) for o in out.outputs)
    alone = [engine.generate([random_prompt(23, 5)], dataclasses.replace(params, seed=11 + i))[0] for i in range(4)]
    assert [o.token_ids for o in out.outputs] == [a.token_ids for a in alone]


def test_stop_string_may_end_a_row_mid_object_and_logprobs_are_raw(ckpt) -> None:
    engine = small_engine(ckpt.path)
    schema = Constraint.json_schema({"type": "object", "properties": {"k": {"enum": ["aa", "bb"]}}, "required": ["k"]})
    prompt = random_prompt(12, 7)
    out = engine.generate([prompt], SamplingParams(max_tokens=30, constraint=schema, stop=['"k"']))[0]
    assert (out.text, out.finish_reason) == ("{", "stop")
    # logprobs are of the raw distribution: the first token's top-5 equal the unconstrained row's
    constrained = engine.generate([prompt], SamplingParams(max_tokens=3, constraint=schema, logprobs=5))[0]
    free = engine.generate([prompt], SamplingParams(max_tokens=1, logprobs=5))[0]
    first = constrained.logprobs[0]
    assert constrained.text == '{"k' and constrained.token_ids[0] in first
    assert free.token_ids != constrained.token_ids[:1]  # the mask changed the choice, not the logprobs
    for token, value in free.logprobs[0].items():
        assert first[token] == pytest.approx(value, abs=1e-5)

def test_constraint_state_validates_and_rolls_back(ckpt) -> None:
    """The API speculative decoding uses: how many proposed tokens the grammar accepts; rollback."""
    engine = small_engine(ckpt.path)
    c = Constraint("choice", choices=("positive", "negative"))
    state = engine.structured.grammars.state(c)
    ids = engine.tokenizer.encode("positive")
    bad = engine.tokenizer.encode("posh")
    assert state.validate(ids) == len(ids) and state.validate(bad) < len(bad)
    assert state.consume_many(ids) and state.is_finished
    state.rollback(len(ids))
    assert not state.is_finished and state.validate(engine.tokenizer.encode("negative")) >= 1
    fork = state.copy()
    assert fork.consume_many(ids) and not state.is_finished
    # masks along a draft: one before each accepted token and one after the last; state unchanged
    words = (engine.vocab_size + 31) // 32
    buf = torch.zeros((len(bad) + 1, words), dtype=torch.int32)
    accepted = state.fill_run(bad, buf.data_ptr(), words * 4)
    assert accepted == state.validate(bad) < len(bad)
    for i in range(accepted + 1):
        allowed = ((buf[i][:, None] >> torch.arange(32, dtype=torch.int32)) & 1).flatten()
        assert i == accepted or allowed[bad[i]] == 1
    assert not buf[accepted + 1 :].any() and state.validate(ids) == len(ids)
