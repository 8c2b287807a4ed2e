"""Engine behaviour on the demo model: seeded sampling, bad input, streaming and stopping, stops."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from engine_oracle import hf_greedy

from worker.engine import Engine, EngineConfig, SamplingParams


@pytest.fixture(scope="module")
def engine(tokenizer_dir: Path) -> Engine:
    return Engine.from_pretrained(tokenizer_dir, EngineConfig(kv_cache_bytes=16 << 20, max_model_len=256))


PROMPTS = [
    "def add(a, b):",
    "import json\n\nclass Encoder",
    "for i in range(10):",
    "x = [",
    "# comment " * 20,
]


def test_seeded_sampling_is_batch_independent(engine: Engine) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.9, top_k=40, top_p=0.9, seed=7, ignore_eos=True)
    alone = engine.generate([PROMPTS[1]], params)[0]
    batch_a = engine.generate(PROMPTS, params)[1]
    mixed = [SamplingParams(max_tokens=5, seed=i) for i in range(3)]
    batch_b = engine.generate(
        [PROMPTS[4], PROMPTS[0], PROMPTS[1], PROMPTS[3]], [mixed[0], mixed[1], params, mixed[2]]
    )[2]
    assert alone.token_ids == batch_a.token_ids == batch_b.token_ids
    other_seed = engine.generate([PROMPTS[1]], dataclasses.replace(params, seed=8))[0]
    assert other_seed.token_ids != alone.token_ids  # sampling really happens


def test_bad_prompts_fail_alone(engine: Engine) -> None:
    good = SamplingParams(max_tokens=6, ignore_eos=True)
    solo = engine.generate([PROMPTS[0], PROMPTS[2]], good)
    outs = engine.generate([PROMPTS[0], "", [1] * 300, [5, 10**9], None, PROMPTS[2]], good)
    assert [o.finish_reason for o in outs] == ["length", "error", "error", "error", "error", "length"]
    assert "empty prompt" in outs[1].error
    assert "300 tokens" in outs[2].error and "256" in outs[2].error
    assert "outside the vocabulary" in outs[3].error
    assert "string or a list of token ids" in outs[4].error
    assert outs[0].token_ids == solo[0].token_ids and outs[5].token_ids == solo[1].token_ids
    engine.block_manager.check_invariants([])


def test_generate_validates_arguments(engine: Engine) -> None:
    with pytest.raises(ValueError, match="one each"):
        engine.generate(PROMPTS, [SamplingParams()] * 2)
    with pytest.raises(ValueError, match="not one string"):
        engine.generate("a prompt", SamplingParams())


def test_stream_should_stop_aborts_without_leaks(engine: Engine) -> None:
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (1, 50, 50, 50, 50)]
    seen = []
    calls = {"n": 0}

    def should_stop() -> bool:
        calls["n"] += 1
        return bool(seen)

    for out in engine.stream(PROMPTS, params, should_stop=should_stop):
        seen.append(out)
    assert [o.index for o in seen] == [0] and calls["n"] >= 2
    assert not engine.scheduler.has_unfinished()
    engine.block_manager.check_invariants([])
    # Closing a stream early also frees everything; the engine stays usable.
    gen = engine.stream(PROMPTS, params)
    next(gen)
    gen.close()
    engine.block_manager.check_invariants([])
    assert len(engine.generate(PROMPTS[:2], SamplingParams(max_tokens=3))) == 2


def test_stop_strings_ids_and_eos(engine: Engine) -> None:
    base = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    tok = base.token_ids[3]
    by_id = engine.generate(
        [PROMPTS[0]], SamplingParams(max_tokens=20, stop_token_ids=[tok], ignore_eos=True)
    )[0]
    assert (
        by_id.finish_reason == "stop" and by_id.token_ids == base.token_ids[: base.token_ids.index(tok) + 1]
    )
    stop = base.text[len(base.text) // 2 : len(base.text) // 2 + 2]
    if stop.strip():
        by_str = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=20, stop=[stop], ignore_eos=True))[0]
        assert by_str.finish_reason == "stop" and by_str.text == base.text[: base.text.index(stop)]
    eos = next(iter(engine.eos_token_ids))
    forced = engine.generate(
        [PROMPTS[0]], SamplingParams(max_tokens=20, stop_token_ids=[], ignore_eos=False)
    )[0]
    assert forced.finish_reason in ("stop", "length")
    if forced.finish_reason == "stop":
        assert forced.token_ids[-1] in engine.eos_token_ids and eos in engine.eos_token_ids


def test_max_model_len_finishes_with_length(engine: Engine) -> None:
    out = engine.generate([[7] * 250], SamplingParams(max_tokens=100, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 256 - 250


def test_stats_snapshots_difference(engine: Engine) -> None:
    before = engine.stats.snapshot()
    outs = engine.generate(PROMPTS[:3], SamplingParams(max_tokens=4, ignore_eos=True))
    delta = engine.stats.snapshot() - before
    assert delta.prompt_tokens == sum(o.prompt_tokens for o in outs)
    assert delta.decode_tokens == sum(len(o.token_ids) for o in outs) == 12
    assert delta.steps >= 4 and delta.busy_seconds > 0
    with pytest.raises(AttributeError):
        before.steps = 3  # frozen


def test_last_layer_runs_only_rows_that_need_logits(engine: Engine) -> None:
    """A prefill step stores every token's K/V in every layer, but the last layer's MLP sees only the
    rows whose logits are used (one per prompt); the first layer sees them all. Greedy exactness
    against transformers (test_exactness) checks the outputs stay right. (The MLP's projections are
    hooked: the layer loop enters the MLP module through forward(), which runs no hooks.)"""
    layers = engine.runner.model.model.layers
    seen: dict[str, list[int]] = {"first": [], "last": []}
    hooks = [
        layers[0].mlp.gate_up_proj.register_forward_hook(lambda _m, args, _o: seen["first"].append(args[0].shape[0])),
        layers[-1].mlp.gate_up_proj.register_forward_hook(lambda _m, args, _o: seen["last"].append(args[0].shape[0])),
    ]
    try:
        prompts = [[3 + k, *range(10, 9 + n)] for k, n in enumerate((40, 25, 60))]  # no shared prefix
        engine.generate(prompts, SamplingParams(max_tokens=2))
    finally:
        for h in hooks:
            h.remove()
    assert seen["first"][0] == 125 and seen["last"][0] == 3  # the prefill step: 3 prompts, 125 tokens
    assert seen["first"][1:] == seen["last"][1:] == [3]  # decode steps: every row samples


def test_tokenizer_matches_transformers(tokenizer_dir: Path, engine: Engine) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def f(): pass"}]
    text = engine.tokenizer.apply_chat_template(messages)
    assert text == hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert engine.tokenizer.encode(text) == hf(text)["input_ids"]
    ids = engine.tokenizer.encode(PROMPTS[1])
    assert engine.tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=True) == PROMPTS[1]
    assert set(engine.tokenizer.eos_token_ids) >= {hf.eos_token_id}
    # the engine encodes a stream's text prompts in one batch: the same ids as one by one and as
    # transformers (a rendered chat template keeps its single BOS)
    texts = [text, *PROMPTS]
    assert engine.tokenizer.encode_batch(texts) == [hf(t)["input_ids"] for t in texts]


def test_loader_refuses_unknown_architecture_and_pickle(tokenizer_dir: Path, tmp_path: Path) -> None:
    odd = tmp_path / "odd"
    shutil.copytree(tokenizer_dir, odd)
    cfg = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM.*Qwen3ForCausalLM"):
        Engine.from_pretrained(odd)
    pickled = tmp_path / "pickled"
    shutil.copytree(tokenizer_dir, pickled)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(ValueError, match="only pickle weights .*pytorch_model.bin"):
        Engine.from_pretrained(pickled)
    with pytest.raises(ValueError, match="no config.json"):
        Engine.from_pretrained(tmp_path)


def test_engine_config_validation() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineConfig(max_num_batched_tokens=8, max_num_seqs=16)
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(block_size=12)
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(quantization="int3")
    with pytest.raises(ValueError, match="backend"):
        EngineConfig(backend="cuda-graphs")
    assert EngineConfig(max_num_batched_tokens=64).max_num_seqs == 64


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("n", 0, "n must be an integer >= 1"),
        ("presence_penalty", 2.5, r"presence_penalty must be in \[-2, 2\]"),
        ("frequency_penalty", -3.0, r"frequency_penalty must be in \[-2, 2\]"),
        ("repetition_penalty", 0.0, "repetition_penalty must be > 0"),
        ("min_p", 1.5, r"min_p must be in \[0, 1\]"),
        ("min_tokens", 17, r"min_tokens must be an integer in \[0, max_tokens=16\]"),
        ("logit_bias", {5: 101}, r"logit_bias values must be in \[-100, 100\]"),
        ("logit_bias", {-1: 1}, "logit_bias token ids must be >= 0"),
        ("logit_bias", {"x": 1}, "logit_bias must map token ids to numbers"),
    ],
)
def test_sampling_params_refuse_out_of_range_values(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


def test_logit_bias_is_normalised_and_checked_against_the_vocabulary(engine: Engine) -> None:
    assert SamplingParams(logit_bias={"9": 1, 3: -2.5}).logit_bias == ((3, -2.5), (9, 1.0))
    good = SamplingParams(max_tokens=3, ignore_eos=True)
    outs = engine.generate([PROMPTS[0], PROMPTS[0]], [SamplingParams(max_tokens=3, logit_bias={10**6: 1.0}), good])
    assert outs[0].finish_reason == "error" and "logit_bias token id 1000000 is outside the vocabulary" in outs[0].error
    assert outs[1].finish_reason == "length" and len(outs[1].outputs) == 1


def test_stop_token_ids_outside_the_vocabulary_fail_their_request_only(engine: Engine) -> None:
    """min_tokens masks the stop ids' logits: an id past the vocabulary would index out of range and
    end the whole stream, so it is that request's error (a negative id: refused on construction)."""
    good = SamplingParams(max_tokens=3, ignore_eos=True)
    bad = SamplingParams(max_tokens=3, min_tokens=2, stop_token_ids=[10**6])
    outs = engine.generate([PROMPTS[0], PROMPTS[1]], [bad, good])
    assert outs[0].finish_reason == "error" and "stop_token_ids holds 1000000" in outs[0].error
    assert outs[1].finish_reason == "length"
    with pytest.raises(ValueError, match="stop_token_ids must be token ids >= 0"):
        SamplingParams(min_tokens=2, stop_token_ids=[-5])


def test_min_tokens_holds_back_eos_and_stop_strings(engine: Engine) -> None:
    eos = min(engine.eos_token_ids)
    early = SamplingParams(max_tokens=8, logit_bias={eos: 100.0})
    assert engine.generate([PROMPTS[0]], early)[0].token_ids == [eos]
    held = engine.generate([PROMPTS[0]], dataclasses.replace(early, min_tokens=5))[0]
    assert len(held.token_ids) == 6 and held.token_ids[-1] == eos and held.finish_reason == "stop"
    base = engine.generate([PROMPTS[2]], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    stop = base.text[1:3]
    cut = engine.generate([PROMPTS[2]], SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop]))[0]
    kept = engine.generate([PROMPTS[2]], SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop], min_tokens=12))[0]
    assert cut.finish_reason == "stop" and len(cut.text) < len(base.text)
    assert kept.finish_reason == "length" and kept.text == base.text


def test_skip_special_tokens_false_keeps_them_in_the_text(engine: Engine) -> None:
    eos = min(engine.eos_token_ids)
    params = SamplingParams(max_tokens=2, ignore_eos=True, logit_bias={eos: 100.0})
    assert engine.generate([PROMPTS[0]], params)[0].text == ""
    kept = engine.generate([PROMPTS[0]], dataclasses.replace(params, skip_special_tokens=False))[0]
    assert kept.token_ids == [eos, eos] and kept.text == engine.tokenizer.decode([eos, eos], skip_special_tokens=False) != ""


def test_a_stream_paused_after_its_last_output_leaves_its_step_in_flight_harmless(make_checkpoint) -> None:
    """With overlapped steps a stream may yield its last output while a step for that (now finished)
    sequence is still in flight: a stop token cannot be foreseen when the next step is launched. A
    generate started meanwhile applies that step to a departed sequence (scheduler's departed list)
    and gives transformers' tokens; the paused stream then ends without yielding anything more."""
    ckpt = make_checkpoint("llama")
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(overlap_steps=True, max_num_seqs=4))
    prompt = list(range(3, 20))
    stop = hf_greedy(ckpt.model, prompt, 3)[2]
    paused = engine.stream([prompt], SamplingParams(max_tokens=8, stop_token_ids=[stop]))
    assert next(paused).token_ids[-1] == stop
    assert engine._in_flight is not None and not engine.scheduler.has_unfinished()  # the case under test
    others = [list(range(40, 60)), list(range(7, 30)), list(range(9, 12))]
    got = engine.generate(others, SamplingParams(max_tokens=6, ignore_eos=True))
    assert [o.token_ids for o in got] == [hf_greedy(ckpt.model, p, 6) for p in others]
    assert list(paused) == []
    engine.block_manager.check_invariants([])


def test_cache_salts_share_prefix_blocks_within_a_salt_only(engine: Engine) -> None:
    """A stream reuses the prefix-cache blocks of streams of its salt only (serve's tenants); streams
    without one share theirs as before. Every stream computes the same tokens."""
    prompt = [[5 + i % 50 for i in range(40)]]  # 2 full blocks of 16
    greedy = SamplingParams(max_tokens=4, temperature=0.0)

    def run(salt: str | None) -> tuple[int, list[int]]:
        out = engine.generate(prompt, greedy, cache_salt=salt)[0]
        return out.cached_tokens, out.token_ids

    first = run("team-a")
    assert first[0] == 0
    assert run("team-b") == (0, first[1])
    assert run(None) == (0, first[1])
    assert run("team-a") == (32, first[1])
    assert run(None) == (32, first[1])
    engine.block_manager.check_invariants([])
