"""gpt-oss's parts against transformers': the MoE block (routing: the same experts per token; outputs
within fp32 tolerance, many tokens per expert and experts with none), its experts under int8 / int4 /
fp8, and MXFP4 expert weights packed as Hugging Face checkpoints store them."""

from __future__ import annotations

import json

import pytest
import structlog
import torch
from engine_oracle import hf_greedy, mixed_prompts
from safetensors.torch import save_file

from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.quant.mxfp4 import FP4_VALUES, dequantize_mxfp4

transformers = pytest.importorskip("transformers")
from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: E402


def _blocks(make_checkpoint, backend: str = "cpu", **config: object):
    ckpt = make_checkpoint("gpt_oss")
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=1 << 20, backend=backend, **config))
    return ckpt.model.model.layers[0].mlp, engine.runner.model.model.layers[0].mlp, engine


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("tokens", [3, 700])
@torch.no_grad()
def test_routing_and_output_match_transformers(make_checkpoint, backend: str, tokens: int) -> None:
    """700 tokens: ~175 per expert (top-2 of 8); 3 tokens: at most 6 of 8 experts get one."""
    hf_block, block, _ = _blocks(make_checkpoint, backend)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens))
    _, want_w, want_ids = hf_block.router(x)
    got_w, got_ids = block.route(x)
    assert torch.equal(got_ids, want_ids)  # the same experts, in the same (descending logit) order
    torch.testing.assert_close(got_w, want_w.float(), atol=1e-6, rtol=1e-5)
    counts = torch.bincount(got_ids.flatten(), minlength=8)
    assert (counts == 0).any() if tokens == 3 else counts.min() >= 50
    torch.testing.assert_close(block.forward(x), hf_block(x[None])[0][0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@torch.no_grad()
def test_experts_run_through_backend_fused_moe(make_checkpoint, backend: str, monkeypatch) -> None:
    """The unquantized experts reach Backend.fused_moe with their biases and the config's clamp."""
    hf_block, block, _ = _blocks(make_checkpoint, backend)
    calls: list[dict] = []
    fused = block.backend.fused_moe

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(kwargs)
        return fused(*args, **kwargs)

    monkeypatch.setattr(block.backend, "fused_moe", spy)
    x = torch.randn(20, 64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(block.forward(x), hf_block(x[None])[0][0], atol=1e-5, rtol=1e-4)
    experts = hf_block.experts
    assert len(calls) == 1 and calls[0]["b2"] is block.experts.down_proj_bias
    assert (calls[0]["swiglu_limit"], calls[0]["swiglu_alpha"]) == (experts.limit, experts.alpha)


@torch.no_grad()
def test_clamped_swiglu_is_exercised(make_checkpoint) -> None:
    """Large inputs drive the experts' gate and up projections past swiglu_limit (7): the clamp matters
    and still matches transformers."""
    hf_block, block, _ = _blocks(make_checkpoint)
    x = 40 * torch.randn(64, 64, generator=torch.Generator().manual_seed(5))
    gate_up = x @ hf_block.experts.gate_up_proj[0]
    assert (gate_up.abs() > 7).any()
    torch.testing.assert_close(block.forward(x), hf_block(x[None])[0][0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", ["int8", "int4", "fp8"])
@torch.no_grad()
def test_on_the_fly_quantization_covers_experts(make_checkpoint, method: str) -> None:
    """Each expert projection becomes the quantized module a dense one gets, carrying its bias; the
    router (with its bias) stays fp32."""
    from worker.engine.quant.fp8 import Fp8Linear
    from worker.engine.quant.linear import Int4Linear, Int8Linear

    hf_block, block, engine = _blocks(make_checkpoint, quantization=method)
    kinds = {"int8": Int8Linear, "int4": Int4Linear, "fp8": Fp8Linear}
    assert block.experts.gate_up_proj is None and len(block.experts.quantized) == 16
    assert all(type(m) is kinds[method] and m.bias is not None for m in block.experts.quantized)
    assert block.gate.weight.dtype == torch.float32 and block.gate.bias is not None
    x = torch.randn(64, 64)
    want = hf_block(x[None])[0][0]
    err = (block.forward(x) - want).norm() / want.norm()
    assert err < {"int8": 0.03, "int4": 0.3, "fp8": 0.1}[method]  # round-to-nearest of random weights
    outs = engine.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(outs[0].token_ids) == 4


def pack_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [E, rows, cols] -> (blocks uint8 [E, rows, cols/32, 16], scales uint8 [E, rows, cols/32]) as
    gpt-oss checkpoints hold them: per 32 values a power-of-two scale (E8M0, bias 127) that fits the
    block's largest magnitude under 6, each value the nearest FP4 E2M1 code, low nibble first."""
    e, rows, cols = w.shape
    groups = w.reshape(e, rows, cols // 32, 32)
    exp = torch.ceil(torch.log2(groups.abs().amax(-1).clamp_min(2**-100) / 6.0))
    scaled = groups / torch.exp2(exp)[..., None]
    magnitudes = torch.tensor(FP4_VALUES[:8])
    codes = (scaled.abs()[..., None] - magnitudes).abs().argmin(-1) | ((scaled < 0).long() << 3)
    codes = codes.reshape(e, rows, cols // 32, 16, 2)
    blocks = (codes[..., 0] | (codes[..., 1] << 4)).to(torch.uint8)
    return blocks, (exp + 127).to(torch.uint8)


def test_mxfp4_dequantization_matches_transformers() -> None:
    w = torch.randn(3, 40, 96, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 1, 40)[:, None]
    blocks, scales = pack_mxfp4(w)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, cols, rows]
    ours = torch.stack([dequantize_mxfp4(blocks[e], scales[e]) for e in range(3)])  # [E, rows, cols]
    assert torch.equal(ours, theirs.transpose(1, 2))
    # within half the widest FP4 gap (4 to 6) at the block's scale: amax / 3 at most
    assert ((ours - w).abs() <= w.abs().reshape(3, 40, 3, 32).amax(-1).repeat_interleave(32, -1) / 3).all()
    assert torch.unique(blocks & 0x0F).numel() == 16  # every code, both signs, is exercised


@torch.no_grad()
def test_mxfp4_checkpoint_loads_dequantized(make_checkpoint, tmp_path) -> None:
    """A checkpoint whose experts are `*_blocks` / `*_scales` (quantization_config mxfp4) loads
    dequantized: the engine's greedy tokens equal transformers' on the same dequantized weights, and
    the log states the bytes."""
    ckpt = make_checkpoint("gpt_oss")
    model = transformers.AutoModelForCausalLM.from_config(ckpt.model.config).float().eval()
    model.load_state_dict(ckpt.model.state_dict())
    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            blocks, scales = pack_mxfp4(tensor.transpose(1, 2).contiguous())  # rows: output features
            tensor.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
            state[name + "_blocks"], state[name + "_scales"] = blocks, scales
        else:
            state[name] = tensor.contiguous()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((ckpt.path / name).read_bytes())
    config = json.loads((ckpt.path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    names = sorted(state)
    save_file({n: state[n] for n in names[::2]}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({n: state[n] for n in names[1::2]}, tmp_path / "model-00002-of-00002.safetensors")
    weight_map = {n: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, n in enumerate(names)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with structlog.testing.capture_logs() as logs:
        engine = Engine.from_pretrained(tmp_path, EngineConfig(kv_cache_bytes=8 << 20))
    (entry,) = [e for e in logs if e["event"] == "mxfp4_dequantized"]
    packed = sum(t.numel() for n, t in state.items() if n.endswith(("_blocks", "_scales")))
    assert entry["packed_bytes"] == packed and entry["dequantized_bytes"] == 4 * 2 * 8 * 64 * 96
    prompts = mixed_prompts()[:5]
    outs = engine.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    assert [o.token_ids for o in outs] == [hf_greedy(model, p, 6) for p in prompts]


def test_mxfp4_blocks_without_scales_are_refused(make_checkpoint, tmp_path) -> None:
    ckpt = make_checkpoint("gpt_oss")
    state = {n: t.contiguous() for n, t in ckpt.model.state_dict().items()}
    for name in [n for n in state if n.endswith(".experts.down_proj")]:
        state[name + "_blocks"] = pack_mxfp4(state.pop(name).transpose(1, 2).contiguous())[0]
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((ckpt.path / name).read_bytes())
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"down_proj_blocks but no .*down_proj_scales"):
        Engine.from_pretrained(tmp_path, EngineConfig(kv_cache_bytes=1 << 20))
