"""Reasoning in the engine: a thinking budget ends the thinking with the family's end marker (the
tokens equal transformers' greedy ones with that marker spliced in), a constraint holds the answer
only (every stopped row validates, its thinking present), a row cut mid-thought splits as all
reasoning, and greedy with thinking off equals transformers under enable_thinking=False."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from reasoning_cases import greedy_with, harmony_checkpoint, qwen3_checkpoint

from contracts.constraint import Constraint
from contracts.reasoning import HARMONY, THINK, split_output
from contracts.sampling import SamplingParams
from worker.engine import Engine, EngineConfig
from worker.engine.speculation.config import SpeculativeConfig

transformers = pytest.importorskip("transformers")
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "tag": {"type": "string", "maxLength": 6}},
          "required": ["n", "tag"]}  # fmt: skip
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Engine, torch.nn.Module]:
    path = qwen3_checkpoint(tmp_path_factory.mktemp("q") / "qwen3")
    model = transformers.AutoModelForCausalLM.from_pretrained(path).float().eval()
    return Engine.from_pretrained(path, EngineConfig(max_num_seqs=16)), model


@pytest.fixture(scope="module")
def harmony(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> tuple[Engine, torch.nn.Module]:
    path = harmony_checkpoint(tmp_path_factory.mktemp("h"), tokenizer_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(path).float().eval()
    return Engine.from_pretrained(path, EngineConfig(max_num_seqs=16)), model


def _split(engine: Engine, out, fmt=THINK):
    tokens = engine.tokenizer.reasoning_tokens(fmt)
    return split_output(tokens, out.prompt_token_ids, out.token_ids, lambda ids: engine.tokenizer.decode(list(ids)))


@pytest.mark.parametrize("budget", [0, 3, 9])
def test_budget_ends_thinking_as_transformers_does(qwen3, budget: int) -> None:
    """R1-style prompt (the thinking opened by the prompt): `budget` thinking tokens, then the engine
    writes `</think>\\n\\n` and the answer follows; transformers' greedy tokens with the same splice."""
    engine, model = qwen3
    tok = engine.tokenizer
    prompt = tok.apply_chat_template(CHAT) + "<think>\n"
    out = engine.generate([prompt], SamplingParams(max_tokens=20, reasoning=THINK, reasoning_budget=budget))[0]
    end = list(tok.reasoning_tokens(THINK).end_ids)
    assert out.token_ids == greedy_with(model, out.prompt_token_ids, [budget, end, 20 - budget - len(end)])
    split = _split(engine, out)
    assert split.reasoning_tokens == budget and split.reasoning is not None
    assert split.answer == tok.decode(out.token_ids[budget + len(end) :])


def test_budget_opened_by_the_model(qwen3) -> None:
    """Qwen3-style (the model writes `<think>` itself; driven here by logit_bias): the budget counts
    from there, and the bias keeps writing `<think>` as thinking text, then as answer text."""
    engine, _ = qwen3
    think = engine.tokenizer.vocab()["<think>"]
    params = SamplingParams(max_tokens=16, reasoning=THINK, reasoning_budget=4, logit_bias=((think, 100.0),))
    out = engine.generate([engine.tokenizer.apply_chat_template(CHAT)], params)[0]
    end = list(engine.tokenizer.reasoning_tokens(THINK).end_ids)
    assert out.token_ids[:1 + 4 + len(end)] == [think] * 5 + end
    split = _split(engine, out)
    assert split.reasoning == "<think>" * 4 and split.reasoning_tokens == 4
    assert split.answer == "<think>" * (16 - 5 - len(end))


def test_thinking_cut_by_max_tokens_is_all_reasoning(qwen3) -> None:
    engine, _ = qwen3
    prompt = engine.tokenizer.apply_chat_template(CHAT) + "<think>\n"
    for budget in (None, 50):
        out = engine.generate([prompt], SamplingParams(max_tokens=6, reasoning=THINK, reasoning_budget=budget))[0]
        split = _split(engine, out)
        assert out.finish_reason == "length" and split.reasoning_tokens == 6 and split.answer == ""
        assert split.reasoning == engine.tokenizer.decode(out.token_ids).strip("\n")


def test_json_schema_after_thinking_validates(qwen3) -> None:
    """Every stopped row of a JSON-schema constraint validates, with its thinking before it: thinking
    opened by the prompt (budget or the model's own `</think>`, pushed by a bias), opened by the model,
    and thinking off (the grammar starts at once)."""
    engine, _ = qwen3
    tok = engine.tokenizer
    vocab = tok.vocab()
    chat = tok.apply_chat_template(CHAT)
    constraint = Constraint.json_schema(SCHEMA)
    cases = [
        (chat + "<think>\n", dict(reasoning_budget=5), 5),
        (chat + "<think>\n", dict(logit_bias=((vocab["</think>"], 8.0),)), None),
        (chat, dict(reasoning_budget=3, logit_bias=((vocab["<think>"], 30.0),)), 3),
        (tok.apply_chat_template(CHAT, enable_thinking=False), {}, 0),
    ]
    prompts, params, expect = [], [], []
    for prompt, fields, thinking in cases:
        for seed in range(6):
            prompts.append(prompt)
            params.append(SamplingParams(max_tokens=80, temperature=1.0, seed=seed, reasoning=THINK,
                                         constraint=constraint, **fields))  # fmt: skip
            expect.append(thinking)
    outs = engine.generate(prompts, params)
    stopped = 0
    for out, thinking in zip(outs, expect, strict=True):
        split = _split(engine, out)
        if thinking is not None:
            assert split.reasoning_tokens == thinking
        assert (split.reasoning is None) == (thinking == 0)
        assert out.finish_reason in ("stop", "length"), out.error
        if out.finish_reason == "stop":
            stopped += 1
            jsonschema.validate(json.loads(split.answer), SCHEMA)
    assert stopped >= 0.75 * len(outs)  # the rest ran out of tokens (finish "length"), thinking or mid-object


def test_harmony_budget_as_transformers_does(harmony) -> None:
    """gpt-oss: the prompt opens the analysis channel; after the budget the engine writes
    `<|end|><|start|>assistant<|channel|>final<|message|>` and the final answer follows."""
    engine, model = harmony
    tok = engine.tokenizer
    assert tok.reasoning == HARMONY
    prompt = tok.apply_chat_template(CHAT, reasoning_effort="low") + "<|channel|>analysis<|message|>"
    params = SamplingParams(max_tokens=24, reasoning=HARMONY, reasoning_budget=6, ignore_eos=True)
    out = engine.generate([prompt], params)[0]
    end = list(tok.reasoning_tokens(HARMONY).end_ids)
    assert out.token_ids == greedy_with(model, out.prompt_token_ids, [6, end, 24 - 6 - len(end)])
    split = _split(engine, out, HARMONY)
    assert split.reasoning_tokens == 6 and split.reasoning == tok.decode(out.token_ids[:6])
    assert [m.channel for m in split.messages] == ["analysis", "final"]


def test_harmony_constraint_holds_the_final_channel(harmony) -> None:
    """A constrained gpt-oss row thinks in the analysis channel, then its answer is the final
    channel's content, held to the schema."""
    engine, _ = harmony
    prompt = engine.tokenizer.apply_chat_template(CHAT)
    params = [SamplingParams(max_tokens=120, temperature=1.0, seed=s, reasoning=HARMONY, reasoning_budget=b,
                             constraint=Constraint.json_schema(SCHEMA)) for s in range(4) for b in (0, 4)]  # fmt: skip
    stopped = 0
    for out, p in zip(engine.generate([prompt] * len(params), params), params, strict=True):
        split = _split(engine, out, HARMONY)
        assert split.reasoning_tokens == p.reasoning_budget
        assert [m.channel for m in split.messages] == (["analysis", "final"] if p.reasoning_budget else ["final"])
        if out.finish_reason == "stop":
            stopped += 1
            jsonschema.validate(json.loads(split.answer), SCHEMA)
    assert stopped >= 0.75 * len(params)


def test_greedy_thinking_off_equals_transformers(qwen3, tmp_path: Path) -> None:
    """enable_thinking=False: freight's rendering equals transformers', and its greedy tokens too."""
    engine, model = qwen3
    hf = transformers.AutoTokenizer.from_pretrained(engine.model_dir)
    text = hf.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert engine.tokenizer.apply_chat_template(CHAT, enable_thinking=False) == text
    out = engine.generate([text], SamplingParams(max_tokens=12, ignore_eos=True, reasoning=THINK))[0]
    assert out.token_ids == greedy_with(model, hf(text)["input_ids"], [12])
    assert _split(engine, out).reasoning is None


def test_speculation_keeps_the_reasoning_rows_tokens(qwen3) -> None:
    """Prompt-lookup speculation over budgeted, constrained rows returns the plain engine's tokens."""
    engine, _ = qwen3
    tok = engine.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "abc abc abc abc abc abc"}]) + "<think>\n"
    params = [SamplingParams(max_tokens=40, reasoning=THINK, reasoning_budget=b, constraint=c)
              for b in (2, 7) for c in (None, Constraint.json_schema(SCHEMA))]  # fmt: skip
    plain = engine.generate([prompt] * 4, params)
    spec = Engine.from_pretrained(engine.model_dir, EngineConfig(speculative=SpeculativeConfig("ngram", 4, adaptive=False)))
    assert [o.token_ids for o in spec.generate([prompt] * 4, params)] == [o.token_ids for o in plain]


def test_harmony_forced_tool_call(harmony) -> None:
    """A forced call on gpt-oss: the thinking in the analysis channel, then the grammar writes the
    commentary header to `functions.NAME` and arguments that validate against the tool's schema."""
    from contracts.reasoning import ReasoningFormat
    from worker.tool_formats import forced_calls, parse_calls

    engine, _ = harmony
    tok = engine.tokenizer
    zone = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}, "hours": {"type": "integer"}},
            "required": ["zone", "hours"]}  # fmt: skip
    tools = [{"type": "function", "function": {"name": "get_time", "description": "Time", "parameters": zone}}]
    prompt = tok.apply_chat_template(CHAT, tools=tools)
    constraint = forced_calls("harmony", [("get_time", zone)], False, tok.vocab())
    fmt = ReasoningFormat("harmony", answer_channel="commentary")
    params = [SamplingParams(max_tokens=150, temperature=1.0, seed=s, reasoning=fmt, reasoning_budget=3,
                             constraint=constraint) for s in range(4)]  # fmt: skip
    decode = tok.reasoning_tokens(fmt).decode
    for out in engine.generate([prompt] * 4, params):
        split = _split(engine, out, fmt)
        assert out.finish_reason == "stop", out.error
        assert split.reasoning_tokens == 3 and [m.channel for m in split.messages] == ["analysis", "commentary"]
        content, calls = parse_calls("harmony", split.answer, ["get_time"], split.messages, decode)
        (call,) = calls
        assert call.name == "get_time" and content is None
        jsonschema.validate(json.loads(call.arguments), zone)
