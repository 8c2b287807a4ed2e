"""The engine's sparse MoE block against transformers' on the same weights: the same experts chosen
per token, outputs within fp32 tolerance, with many tokens per expert and with experts that get none."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from engine_oracle import VOCAB

from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.backends.cpu_decode_stack import ineligible
from worker.engine.models import ModelConfig


def _blocks(make_checkpoint, arch: str, backend: str):
    ckpt = make_checkpoint(arch)
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=1 << 20, backend=backend))
    return ckpt.model.model.layers[0].mlp, engine.runner.model.model.layers[0].mlp, engine


def _hf_route(hf_block, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _, weights, ids = hf_block.gate(x)
    return weights, ids


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "qwen3_moe"])
@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("tokens", [3, 700])
@torch.no_grad()
def test_routing_and_output_match_transformers(make_checkpoint, arch: str, backend: str, tokens: int) -> None:
    """700 tokens: ~175 per expert (top-2 of 8); 3 tokens: at most 9 of 8 experts' slots, so
    some experts get no token (asserted)."""
    hf_block, block, _ = _blocks(make_checkpoint, arch, backend)
    x = torch.randn(tokens, hf_block.gate.weight.shape[1], generator=torch.Generator().manual_seed(tokens))
    want_w, want_ids = _hf_route(hf_block, x)
    got_w, got_ids = block.route(x)
    assert torch.equal(got_ids.sort(-1).values, want_ids.sort(-1).values)  # the same experts per token
    torch.testing.assert_close(got_w, want_w.float(), atol=1e-6, rtol=1e-5)
    counts = torch.bincount(got_ids.flatten(), minlength=block.experts.gate_up_proj.shape[0])
    if tokens == 3:
        assert (counts == 0).any()
    else:
        assert counts.min() >= 50
    torch.testing.assert_close(block.forward(x), hf_block(x[None])[0], atol=1e-5, rtol=1e-4)


@torch.no_grad()
def test_all_tokens_on_one_expert(make_checkpoint) -> None:
    """A router that sends every token to the same two experts (the other six idle): still transformers'."""
    hf_block, block, _ = _blocks(make_checkpoint, "mixtral", "cpu")
    direction = F.normalize(torch.randn(hf_block.gate.weight.shape[1]), dim=0)
    x = direction + 0.01 * torch.randn(40, direction.shape[0])  # every token: x . direction ~ 1
    saved = [(m, m.weight.clone()) for m in (hf_block.gate, block.gate)]
    try:
        for module, _ in saved:
            module.weight.zero_()
            module.weight[5] = 6 * direction  # logits ~6, ~3 and 0: no ties, no underflow
            module.weight[2] = 3 * direction
        _, ids = block.route(x)
        assert set(ids.flatten().tolist()) <= {2, 5}
        assert torch.equal(ids.sort(-1).values, _hf_route(hf_block, x)[1].sort(-1).values)
        torch.testing.assert_close(block.forward(x), hf_block(x[None])[0], atol=1e-5, rtol=1e-4)
    finally:  # the checkpoint fixture's model is shared with other tests: put the routers back
        for module, weight in saved:
            module.weight.copy_(weight)


def test_decode_stack_refuses_moe_explicitly(make_checkpoint) -> None:
    """The decision is an explicit check on the config, not a side effect of the layers' shapes."""
    _, _, engine = _blocks(make_checkpoint, "qwen3_moe", "cpu")
    model = engine.runner.model
    reason = ineligible(model, engine.runner.kv_caches, model.backend.stack)
    assert reason is not None and "mixture-of-experts" in reason
    assert model.decode_stack is None


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"num_experts_per_tok": 9}, "num_experts_per_tok must be an integer in 1..num_local_experts (8)"),
        ({"num_local_experts": 0}, "num_local_experts must be a positive integer"),
    ],
)
def test_bad_moe_config_is_refused(change: dict, words: str) -> None:
    cfg = {
        "architectures": ["MixtralForCausalLM"], "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_local_experts": 8, "num_experts_per_tok": 2,
    }  # fmt: skip
    assert ModelConfig.from_dict(cfg).moe.num_experts == 8
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig.from_dict({**cfg, **change})


def test_checkpoint_missing_an_expert_is_refused(make_checkpoint, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    src = make_checkpoint("qwen3_moe").path
    tensors = {k: v for k, v in load_file(src / "model.safetensors").items() if ".experts.7.up_proj" not in k}
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing tensors for .*experts\.gate_up_proj"):
        Engine.from_pretrained(tmp_path, EngineConfig(kv_cache_bytes=1 << 20))


@torch.no_grad()
def test_stacked_checkpoint_layout_loads(make_checkpoint, tmp_path) -> None:
    """A checkpoint already in transformers' in-memory layout (experts.gate_up_proj [E, 2I, H]) loads by name."""
    from safetensors.torch import save_file

    ckpt = make_checkpoint("qwen3_moe")
    state = {k: v.contiguous() for k, v in ckpt.model.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((ckpt.path / name).read_bytes())
    save_file(state, tmp_path / "model.safetensors")
    engine = Engine.from_pretrained(tmp_path, EngineConfig(kv_cache_bytes=1 << 20))
    got = engine.runner.model.model.layers[1].mlp.experts.down_proj
    assert torch.equal(got, ckpt.model.model.layers[1].mlp.experts.down_proj)
    x = torch.randn(5, 64)
    torch.testing.assert_close(F.linear(x, engine.runner.model.model.layers[1].mlp.gate.weight),
                               ckpt.model.model.layers[1].mlp.gate(x)[0])  # fmt: skip


@pytest.mark.parametrize("method", ["int8", "int4", "fp8"])
@torch.no_grad()
def test_on_the_fly_quantization_covers_experts(make_checkpoint, method: str) -> None:
    """Every expert projection becomes the quantized module a dense projection gets; the quantized
    block stays close to the fp32 one (the router stays fp32: same experts for clear-cut tokens)."""
    from worker.engine.quant.fp8 import Fp8Linear
    from worker.engine.quant.linear import Int4Linear, Int8Linear

    kinds = {"int8": Int8Linear, "int4": Int4Linear, "fp8": Fp8Linear}
    ckpt = make_checkpoint("mixtral")
    engine = Engine.from_pretrained(ckpt.path, EngineConfig(kv_cache_bytes=1 << 20, quantization=method))
    block = engine.runner.model.model.layers[0].mlp
    assert block.experts.gate_up_proj is None and len(block.experts.quantized) == 16
    assert all(type(m) is kinds[method] for m in block.experts.quantized)
    assert block.gate.weight.dtype == torch.float32
    hf_block = ckpt.model.model.layers[0].mlp
    x = torch.randn(64, 64)
    want = hf_block(x[None])[0]
    err = (block.forward(x) - want).norm() / want.norm()
    assert err < {"int8": 0.03, "int4": 0.3, "fp8": 0.1}[method]  # round-to-nearest of random weights
    outs = engine.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(outs[0].token_ids) == 4
