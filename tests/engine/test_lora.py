"""LoRA adapters in the engine against transformers + peft (the oracle), on the tiny checkpoints:
greedy tokens of every adapter equal peft's, merged and unmerged, on Llama, Qwen2, Qwen3, Mistral
and Gemma 2 / 3, with the base's rows in the same batch; a batch mixing four adapters and the base
equals five separate runs; the prefix cache never shares KV across adapters; fewer device slots than
adapters swap them in and change nothing; n > 1, structured outputs, speculation (a draft without the
adapter proposes), and a quantized base (int8 / int4 / fp8 with an fp16 adapter) each keep the tokens."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import llguidance
import pytest
import torch
import transformers
from engine_oracle import MAX_NEW, VOCAB, hf_greedy, mixed_prompts
from safetensors.torch import load_file, save_file
from structured_cases import constraints, satisfies

from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.quant import Int4Linear, Int8Linear
from worker.engine.quant.formats import dequantize_int4, dequantize_int8
from worker.engine.speculation.config import SpeculativeConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from tiny_adapters import make_adapter, peft_model  # noqa: E402

pytest.importorskip("peft")
PROMPTS = mixed_prompts()[:6]  # 1 to 109 tokens, two sharing a 64-token prefix
GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
KV = 8 << 20


def _engine(path: Path, adapters: dict[str, Path], **config: object) -> Engine:
    engine = Engine.from_pretrained(path, EngineConfig(**{"kv_cache_bytes": KV, **config}))
    engine.set_loras(adapters)
    return engine


def _tokens(engine: Engine, prompts: list, adapters: list, params: SamplingParams = GREEDY) -> list[list[int]]:
    outs = engine.generate(prompts, params, adapters=adapters)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    return [o.token_ids for o in outs]


@pytest.fixture(scope="module")
def adapters_of(make_checkpoint, tmp_path_factory):
    """adapters_of(arch) -> (checkpoint, transformers model loaded from its folder, {name: folder}):
    `full` (every projection, rank 8), `some` (q, v, down at rank 16; use_rslora and per-module
    rank / alpha patterns) and two more full ones of other seeds and ranks (cached per arch)."""
    cache: dict[str, tuple] = {}

    def get(arch: str) -> tuple:
        if arch not in cache:
            ckpt = make_checkpoint(arch)
            base = transformers.AutoModelForCausalLM.from_pretrained(ckpt.path).float().eval()
            root = tmp_path_factory.mktemp(f"lora_{arch}")
            folders = {
                "full": make_adapter(base, root / "full", rank=8, seed=1),
                "some": make_adapter(base, root / "some", rank=16, alpha=24, targets=("q_proj", "v_proj", "down_proj"),
                                     seed=2, use_rslora=True, rank_pattern={"down_proj": 4},
                                     alpha_pattern={"v_proj": 8}),  # fmt: skip
                "third": make_adapter(base, root / "third", rank=12, seed=3),
                "fourth": make_adapter(base, root / "fourth", rank=4, seed=4, targets=("o_proj", "up_proj")),
            }
            cache[arch] = (ckpt, base, folders)
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text"])
def test_adapters_match_peft_merged_and_unmerged(adapters_of, arch: str) -> None:
    ckpt, base, folders = adapters_of(arch)
    used = {k: folders[k] for k in ("full", "some")}
    engine = _engine(ckpt.path, used)
    names = [None, "full", "some"]
    got = _tokens(engine, PROMPTS * 3, [n for n in names for _ in PROMPTS])
    by_name = {n: got[i * len(PROMPTS) : (i + 1) * len(PROMPTS)] for i, n in enumerate(names)}
    assert by_name[None] == [hf_greedy(base, p, MAX_NEW) for p in PROMPTS]
    for name, folder in used.items():
        assert by_name[name] != by_name[None], f"{name} changed no token: the adapter is not applied"
        for merged in (False, True):
            oracle = peft_model(base, folder, merged=merged)
            assert by_name[name] == [hf_greedy(oracle, p, MAX_NEW) for p in PROMPTS], (name, merged)
    engine.block_manager.check_invariants([])
    engine.loras.slots.check_invariants()


@pytest.mark.parametrize("config", [{}, {"static_decode": True}, {"enable_prefix_caching": False}])
def test_mixed_batch_equals_separate_runs(adapters_of, config: dict) -> None:
    """Four adapters and the base, rows interleaved (prompts sharing prefixes spread over adapters),
    in one batch, against one run per adapter with only its rows."""
    ckpt, _, folders = adapters_of("llama")
    names = [None, *folders]
    prompts = mixed_prompts()
    assign = [names[i % len(names)] for i in range(len(prompts))] + [names[(i + 2) % len(names)] for i in range(len(prompts))]
    prompts = prompts * 2
    engine = _engine(ckpt.path, folders, **config)
    mixed = _tokens(engine, prompts, assign)
    for name in names:
        mine = [i for i, a in enumerate(assign) if a == name]
        alone = _tokens(_engine(ckpt.path, folders, **config), [prompts[i] for i in mine], [name] * len(mine))
        assert [mixed[i] for i in mine] == alone, name
    engine.block_manager.check_invariants([])


def test_adapter_decode_steps_take_the_decode_stack(adapters_of, monkeypatch) -> None:
    """Decode steps mixing four adapters and the base's rows run in the CPU's C decode stack (each
    wrapped projection adds its rows' adapter products in the call) and give the op-by-op path's
    tokens."""
    ckpt, _, folders = adapters_of("llama")
    names = [None, *folders]
    prompts = mixed_prompts()
    assign = [names[(i * 3) % len(names)] for i in range(len(prompts))]
    off = _engine(ckpt.path, folders, max_num_seqs=8, decode_stack=False)
    on = _engine(ckpt.path, folders, max_num_seqs=8)
    stack, step = on.runner.model.decode_stack, on.runner.model.lora
    seen: list[list[int]] = []  # each stacked step's row slots ([] without adapter tokens)
    for name in ("__call__", "logits"):
        real = getattr(type(stack), name)

        def spy(self, input_ids, positions, meta, real=real):
            seen.append(step.slots.tolist() if step.active else [])
            return real(self, input_ids, positions, meta)

        monkeypatch.setattr(type(stack), name, spy)
    assert _tokens(on, prompts, assign) == _tokens(off, prompts, assign)
    mixed = [s for s in seen if -1 in s and len({x for x in s if x >= 0}) > 1]
    assert mixed, seen  # steps of several adapters and the base ran in the stack


def test_prefix_cache_is_shared_within_an_adapter_never_across(adapters_of) -> None:
    ckpt, _, folders = adapters_of("llama")
    prompt = mixed_prompts()[4]  # 300 tokens
    engine = _engine(ckpt.path, folders)
    first = engine.generate([prompt], GREEDY, adapters=["full"])[0]
    again = engine.generate([prompt, prompt, prompt], GREEDY, adapters=["full", "some", None])
    assert first.cached_tokens == 0
    assert again[0].cached_tokens >= 288 and again[0].token_ids == first.token_ids
    assert again[1].cached_tokens == 0 and again[2].cached_tokens == 0
    assert len({tuple(o.token_ids) for o in again}) == 3


def test_fewer_slots_than_adapters_swap_and_keep_tokens(adapters_of) -> None:
    ckpt, _, folders = adapters_of("llama")
    names = [None, *folders]
    prompts = mixed_prompts()
    assign = [names[i % len(names)] for i in range(len(prompts))]
    roomy = _tokens(_engine(ckpt.path, folders), prompts, assign)
    tight = _engine(ckpt.path, folders, max_loras=2, max_num_seqs=3)
    assert _tokens(tight, prompts, assign) == roomy
    assert tight.loras.slots.swaps >= len(folders)
    tight.loras.slots.check_invariants()
    assert sum(tight.loras.slots.refs) == 0 and tight.batch.num_lora == 0


def test_unknown_adapter_is_that_rows_error(adapters_of) -> None:
    ckpt, _, folders = adapters_of("llama")
    engine = _engine(ckpt.path, {"full": folders["full"]})
    outs = engine.generate(PROMPTS[:3], GREEDY, adapters=["full", "nope", None])
    assert outs[1].finish_reason == "error" and "unknown adapter 'nope'" in outs[1].error and "full" in outs[1].error
    assert outs[0].error is None and outs[2].error is None
    with pytest.raises(ValueError, match="one per prompt"):
        engine.generate(PROMPTS[:3], GREEDY, adapters=["full"])


def test_n_choices_and_sampling_with_an_adapter(adapters_of) -> None:
    """Choice i of an n = 3 request under an adapter is the n = 1 request with seed + i, as without one."""
    ckpt, _, folders = adapters_of("qwen3")
    engine = _engine(ckpt.path, folders)
    sampled = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, temperature=0.9, seed=5, n=3)
    [out] = engine.generate(PROMPTS[3:4], sampled, adapters=["some"])
    for i, choice in enumerate(out.outputs):
        one = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, temperature=0.9, seed=5 + i)
        assert choice.token_ids == _tokens(engine, PROMPTS[3:4], ["some"], one)[0]
    base = engine.generate(PROMPTS[3:4], sampled)[0]
    assert [c.token_ids for c in base.outputs] != [c.token_ids for c in out.outputs]


@torch.no_grad()
def test_structured_outputs_with_an_adapter_equal_peft_with_the_grammar(adapters_of) -> None:
    from test_structured_oracle import GrammarLogitsProcessor

    from contracts.grammar import grammar_text

    ckpt, base, folders = adapters_of("llama")
    engine = _engine(ckpt.path, folders)
    eos = sorted(engine.eos_token_ids)
    tokenizer = llguidance.LLTokenizer((ckpt.path / "tokenizer.json").read_text(), n_vocab=VOCAB, eos_token=eos)
    cases = constraints()[1::3]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(cases))]
    outs = engine.generate(prompts, [SamplingParams(max_tokens=24, constraint=c) for c in cases],
                           adapters=["full"] * len(cases))  # fmt: skip
    oracle = peft_model(base, folders["full"])
    for prompt, c, out in zip(prompts, cases, outs, strict=True):
        processor = GrammarLogitsProcessor(llguidance.LLMatcher(tokenizer, grammar_text(c)), len(prompt))
        hf = oracle.generate(input_ids=torch.tensor([prompt]), max_new_tokens=25, do_sample=False, eos_token_id=eos,
                             pad_token_id=0, logits_processor=transformers.LogitsProcessorList([processor]))
        n = len(out.token_ids)
        assert out.token_ids == hf[0, len(prompt) :].tolist()[:n], c
        if out.finish_reason == "stop":
            assert satisfies(out.text, c)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_with_an_adapter_keeps_its_tokens(adapters_of, method: str) -> None:
    """The draft (the base checkpoint itself, no adapter) proposes; the target with the adapter
    verifies: the tokens are the plain decoding's, some proposals rejected, some accepted."""
    ckpt, _, folders = adapters_of("llama")
    repeat = mixed_prompts()[2] * 6  # copy-heavy: the n-gram proposer finds its continuations
    prompts = [repeat, *PROMPTS[2:5]]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    assign = ["full", "some", None, "full"]
    plain = _tokens(_engine(ckpt.path, folders), prompts, assign, params)
    spec = SpeculativeConfig(method, 3, str(ckpt.path) if method == "draft" else None, adaptive=False)
    engine = _engine(ckpt.path, folders, speculative=spec)
    assert _tokens(engine, prompts, assign, params) == plain
    stats = engine.stats
    assert stats.spec_proposed_tokens > stats.spec_accepted_tokens > 0


def _dequantized_base(engine: Engine, src: Path, out: Path) -> transformers.PreTrainedModel:
    """A transformers model of `src` whose projections hold the engine's dequantized weights."""
    tensors = {k: v.float() for k, v in load_file(str(src / "model.safetensors")).items()}
    cfg = engine.runner.model.cfg
    for name, module in engine.runner.model.named_modules():
        base = getattr(module, "base", module)
        if isinstance(base, Int8Linear):
            w = dequantize_int8(base.qweight, base.scales)
        elif isinstance(base, Int4Linear):
            w = dequantize_int4(base.qweight, base.scales, base.group_size)
        else:
            continue
        name = name.removesuffix(".base")
        parent, _, leaf = name.rpartition(".")
        if leaf == "qkv_proj":
            parts = zip(("q_proj", "k_proj", "v_proj"), w.split([cfg.q_size, cfg.kv_size, cfg.kv_size]), strict=True)
        elif leaf == "gate_up_proj":
            parts = zip(("gate_proj", "up_proj"), w.chunk(2), strict=True)
        else:
            parts = [(leaf, w)]
        for hf, part in parts:
            tensors[f"{parent}.{hf}.weight"] = part.float().contiguous()
    out.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    save_file(tensors, str(out / "model.safetensors"))
    return transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()


def _half_adapter(src: Path, out: Path) -> Path:
    """The adapter in folder `src` with its weights in fp16, written to `out`."""
    out.mkdir()
    (out / "adapter_config.json").write_text((src / "adapter_config.json").read_text())
    tensors = load_file(str(src / "adapter_model.safetensors"))
    save_file({k: v.half() for k, v in tensors.items()}, str(out / "adapter_model.safetensors"))
    return out


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_base_with_an_fp16_adapter_equals_peft_over_the_dequantized_model(adapters_of, tmp_path,
                                                                                    method: str) -> None:  # fmt: skip
    ckpt, _, folders = adapters_of("llama")
    half = _half_adapter(folders["full"], tmp_path / "half")
    engine = _engine(ckpt.path, {"half": half}, quantization=method, decode_stack=False)
    for module in engine.runner.model.modules():
        if isinstance(module, Int8Linear | Int4Linear):
            module.cpu_path = "weight_only"  # the dequantized weights' exact products (tests/quant)
    got = _tokens(engine, PROMPTS * 2, ["half"] * len(PROMPTS) + [None] * len(PROMPTS))
    dequantized = _dequantized_base(engine, ckpt.path, tmp_path / "dequantized")
    config = json.loads((half / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "dequantized")
    (half / "adapter_config.json").write_text(json.dumps(config))
    oracle = peft_model(dequantized, half)
    assert got[: len(PROMPTS)] == [hf_greedy(oracle, p, MAX_NEW) for p in PROMPTS]
    assert got[len(PROMPTS) :] == [hf_greedy(dequantized, p, MAX_NEW) for p in PROMPTS]


def test_an_fp8_base_with_an_fp16_adapter_equals_peft_over_the_fp8_reference(adapters_of, tmp_path) -> None:
    """fp8 quantizes the activations too (per token), so the oracle is peft over a transformers model
    whose projections compute the fp8 reference product (kernels/reference/fp8_matmul.py) of their
    own per-channel quantized weights: per-row scales quantize a fused projection's rows as its parts'."""
    from kernels.reference.fp8_matmul import fp8_matmul, quantize_fp8_rows
    from worker.engine.quant import Fp8Linear

    ckpt, base, folders = adapters_of("llama")
    half = _half_adapter(folders["full"], tmp_path / "half")
    engine = _engine(ckpt.path, {"half": half}, quantization="fp8")
    model = engine.runner.model
    quantized = {name.removesuffix(".base") for name, m in model.named_modules() if isinstance(m, Fp8Linear)}
    assert quantized, "the engine quantized no projection to fp8"
    hf_names = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    fp8_base = transformers.AutoModelForCausalLM.from_pretrained(ckpt.path).float().eval()
    for name in quantized:
        parent, _, leaf = name.rpartition(".")
        for hf in hf_names.get(leaf, (leaf,)):
            linear = fp8_base.get_submodule(f"{parent}.{hf}")
            q, scales = quantize_fp8_rows(linear.weight.detach())
            linear.forward = lambda x, q=q, scales=scales: fp8_matmul(x.reshape(-1, x.shape[-1]), q, scales).reshape(
                *x.shape[:-1], q.shape[0])  # fmt: skip
    got = _tokens(engine, PROMPTS * 2, ["half"] * len(PROMPTS) + [None] * len(PROMPTS))
    assert got[: len(PROMPTS)] != got[len(PROMPTS) :]  # the adapter moves the tokens
    assert got[len(PROMPTS) :] == [hf_greedy(fp8_base, p, MAX_NEW) for p in PROMPTS]
    oracle = peft_model(fp8_base, half)
    assert got[: len(PROMPTS)] == [hf_greedy(oracle, p, MAX_NEW) for p in PROMPTS]


def test_a_rewritten_adapter_is_loaded_again_and_shares_no_kv(adapters_of, tmp_path) -> None:
    """set_loras keeps an unchanged adapter (same id, still resident) and loads a rewritten folder of
    the same name under a new id: no KV of the old weights is served to the new."""
    ckpt, base, folders = adapters_of("llama")
    folder = tmp_path / "mine"
    make_adapter(base, folder, rank=8, seed=11)
    engine = _engine(ckpt.path, {"mine": folder, "full": folders["full"]})
    prompt = mixed_prompts()[4]
    old = engine.generate([prompt], GREEDY, adapters=["mine"])[0].token_ids
    kept = engine.loras.ids["full"]
    make_adapter(base, folder, rank=8, seed=12)
    engine.set_loras({"mine": folder, "full": folders["full"]})
    assert engine.loras.ids["full"] == kept
    new = engine.generate([prompt], GREEDY, adapters=["mine"])[0]
    assert new.cached_tokens == 0 and new.token_ids != old
    assert new.token_ids == hf_greedy(peft_model(base, folder), prompt, MAX_NEW)
