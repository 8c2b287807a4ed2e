"""Quantized checkpoints through the engine: save/load round trip, GPTQ-format loading, same tokens as
the dequantized fp32 model (same math, different path), GPTQ against RTN on real activations."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from gptq_packing import gptq_from_weight
from safetensors.torch import load_file, save_file

from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.quant import Int4Linear, Int8Linear
from worker.engine.quant.calibration import SequentialHessians
from worker.engine.quant.checkpoint import QuantizeSpec, quantize_checkpoint
from worker.engine.quant.formats import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8
from worker.engine.quant.gptq import GPTQConfig, gptq_quantize_int4

PROMPTS = ["def fibonacci(n):\n", "class Stack:\n    def push(self, item):"]
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _engine(model_dir: Path, **kw) -> Engine:
    return Engine.from_pretrained(model_dir, EngineConfig(device="cpu", kv_cache_bytes=8 << 20, **kw))


def _use_cpu_path(engine: Engine, path: str) -> None:
    """"kernel": the integer kernels (int8 activations); "weight_only": dequantize + fp32 matmul."""
    for module in engine.runner.model.modules():
        if isinstance(module, Int8Linear | Int4Linear):
            module.cpu_path = path


def _greedy(engine: Engine, exact: bool) -> list[list[int]]:
    """exact: the quantized weights' exact products (an engine built with decode_stack=False: the
    stack multiplies with the kernels whatever the modules say)."""
    _use_cpu_path(engine, "weight_only" if exact else "kernel")
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))
    return [o.token_ids for o in outs]


def _prompt_logprobs(engine: Engine, exact: bool) -> list[float]:
    _use_cpu_path(engine, "weight_only" if exact else "kernel")
    text = "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n"
    [out] = engine.generate([text], SamplingParams(max_tokens=1, prompt_logprobs=True))
    return out.prompt_logprobs[1:]


def _hf_names(engine_module: str) -> list[str]:
    """model.layers.0.self_attn.qkv_proj -> its checkpoint weights (q, k, v), in stacking order."""
    parent, _, leaf = engine_module.rpartition(".")
    return [f"{parent}.{p}.weight" for p in FUSED.get(leaf, (leaf,))]


def _dequantized_checkpoint(src: Path, out: Path, weights: dict[str, torch.Tensor]) -> Path:
    """A plain fp32 checkpoint whose Linear weights are `weights` (the dequantized ones)."""
    shutil.copytree(src, out)
    tensors = {k: v.float() for k, v in load_file(str(src / "model.safetensors")).items()}
    tensors.update(weights)
    save_file(tensors, str(out / "model.safetensors"))
    return out


@pytest.mark.parametrize("method", ["int8", "int4-rtn"])
def test_round_trip_and_greedy_tokens_match_dequantized_fp32(reference_model: Path, tmp_path: Path,
                                                               method: str) -> None:
    out = tmp_path / method
    quantize_checkpoint(reference_model, out, QuantizeSpec(method=method, group_size=64))
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == {"quant_method": "freight", "bits": 8 if method == "int8" else 4,
                                             "group_size": 64, "method": "rtn"}
    original = load_file(str(reference_model / "model.safetensors"))
    saved = load_file(str(out / "model.safetensors"))
    engine = _engine(out, decode_stack=False)
    dequantized: dict[str, torch.Tensor] = {}
    swapped = 0
    for name, module in engine.runner.model.named_modules():
        if not isinstance(module, Int8Linear | Int4Linear):
            continue
        swapped += 1
        names = _hf_names(name)
        w = torch.cat([original[n].float() for n in names])  # fused rows, as the loader stacks them
        q, s = quantize_int8(w) if method == "int8" else quantize_int4(w, 64)
        assert torch.equal(module.qweight, q)  # the saved-and-loaded integers are the quantized ones
        saved_scales = torch.cat([saved[n.removesuffix("weight") + "scales"] for n in names]).float()
        assert torch.equal(module.scales.float(), saved_scales)  # loaded exactly as saved
        torch.testing.assert_close(saved_scales, s, rtol=1e-3, atol=0)  # saved in the checkpoint's dtype
        deq = dequantize_int8(module.qweight, module.scales) if method == "int8" \
            else dequantize_int4(module.qweight, module.scales, 64)
        row = 0
        for n in names:
            dequantized[n] = deq[row : row + original[n].shape[0]]
            row += original[n].shape[0]
    assert swapped == 4 * 4  # 4 layers x (qkv, o, gate_up, down); lm_head stays full precision
    reference = _engine(_dequantized_checkpoint(reference_model, tmp_path / "deq", dequantized))
    want = _greedy(reference, exact=True)
    assert _greedy(engine, exact=True) == want
    # the kernels round the activations to int8 per block too (about bf16's precision): not bit-equal,
    # so compare the prompt's log-probabilities (about 0.1 apart at most on this prompt, int8 and int4)
    fast, exact = (_prompt_logprobs(engine, exact=False), _prompt_logprobs(reference, exact=True))
    assert max(abs(a - b) for a, b in zip(fast, exact, strict=True)) < 0.2


def test_on_the_fly_int8_equals_the_int8_checkpoint(reference_model: Path, tmp_path: Path) -> None:
    quantize_checkpoint(reference_model, tmp_path / "q", QuantizeSpec(method="int8"))
    saved = _engine(tmp_path / "q").runner.model
    live = _engine(reference_model, quantization="int8").runner.model
    pairs = [(a, b) for a, b in zip(saved.modules(), live.modules(), strict=True) if isinstance(a, Int8Linear)]
    assert len(pairs) == 16
    for a, b in pairs:
        assert isinstance(b, Int8Linear) and torch.equal(a.qweight, b.qweight)
        torch.testing.assert_close(a.scales, b.scales, rtol=1e-3, atol=0)  # checkpoint scales are fp16


def test_on_the_fly_int4_picks_a_group_that_fits_a_small_model(tmp_path: Path) -> None:
    """The demo model's 64-wide layers take no group of 128: on-the-fly int4 picks 64 and runs."""
    from worker.demo_model import make_demo_model

    engine = _engine(make_demo_model(tmp_path / "tiny", "llama", seed=1), quantization="int4")
    linears = [m for m in engine.runner.model.modules() if isinstance(m, Int4Linear)]
    assert linears and {m.group_size for m in linears} == {64}
    [out] = engine.generate(["def f(x):"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out.token_ids) == 4 and out.error is None
    engine = _engine(tmp_path / "tiny", quantization="int4", quant_group=32)  # --quant-group 32
    assert {m.group_size for m in engine.runner.model.modules() if isinstance(m, Int4Linear)} == {32}
    with pytest.raises(ValueError, match="needs --quantization int4"):
        EngineConfig(quantization="int8", quant_group=32)


def test_gptq_format_checkpoint_loads_to_the_dequantized_weights(reference_model: Path, tmp_path: Path) -> None:
    src = load_file(str(reference_model / "model.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}
    for name, t in src.items():
        if name.startswith("model.layers.") and name.endswith("_proj.weight"):
            layer, dequantized[name] = gptq_from_weight(t, 32)
            tensors.update({name.removesuffix("weight") + k: v for k, v in layer.items()})
        else:
            tensors[name] = t
    out = tmp_path / "gptq"
    out.mkdir()
    for f in reference_model.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            shutil.copy2(f, out / f.name)
    config = json.loads((reference_model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True,
                                     "desc_act": False, "checkpoint_format": "gptq"}
    (out / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(out / "model.safetensors"))

    engine = _engine(out, decode_stack=False)
    reference = _engine(_dequantized_checkpoint(reference_model, tmp_path / "deq", dequantized))
    # the first forward (under the engine's inference_mode) converts the GPTQ tensors
    assert _greedy(engine, exact=True) == _greedy(reference, exact=True)
    modules = [(n, m) for n, m in engine.runner.model.named_modules() if isinstance(m, Int4Linear)]
    assert len(modules) == 16
    for name, module in modules:
        assert module.converted and not module.qweight.is_inference()
        want = torch.cat([dequantized[n] for n in _hf_names(name)])
        torch.testing.assert_close(dequantize_int4(module.qweight, module.scales, 32), want, rtol=0, atol=0)
    # the whole-layer C decode stack multiplies with the same packed copies (bound, hence converted, at
    # build): the kernels' tokens with or without it
    stacked = _engine(out)
    assert stacked.runner.model.decode_stack is not None
    assert _greedy(stacked, exact=False) == _greedy(engine, exact=False)


def test_gptq_lowers_layer_output_error_on_real_activations(reference_model: Path, real_texts: list[str]) -> None:
    engine = _engine(reference_model, enable_prefix_caching=False)
    prompts = [engine.tokenizer.encode(t)[:256] for t in real_texts]
    layers = engine.runner.model.model.layers
    calib = SequentialHessians(layers[:2], lambda p: engine.generate(p, SamplingParams(max_tokens=1)), prompts)
    compared = 0
    for i, hessians in calib.layers():
        for local, module in layers[i].named_modules():
            if local not in hessians:
                continue
            h = hessians[local].hessian.float()  # [K, K] from real text through the trained model
            w = module.weight.detach().float()

            def output_error(deq: torch.Tensor, h: torch.Tensor = h, w: torch.Tensor = w) -> float:
                d = w - deq  # E ||x (W - Q)^T||^2 over calibration rows = tr(D H D^T) / 2
                return float(torch.einsum("nk,kl,nl->", d, h, d))

            for g in (128, 32):
                rtn = output_error(dequantize_int4(*quantize_int4(w, g), g))
                for act_order in (False, True) if g == 128 else (False,):
                    q, s = gptq_quantize_int4(w, hessians[local].hessian, GPTQConfig(group_size=g, act_order=act_order))
                    gptq = output_error(q.float() * s.repeat_interleave(g, dim=1))
                    assert gptq < 0.9 * rtn, (i, local, g, act_order, gptq, rtn)
                compared += 1
    assert compared == 2 * 4 * 2
