"""The whole engine with backend "triton" (kernels interpreted on the CPU) against backend "torch":
same greedy tokens on a tiny random model, through chunked prefill, prefix-cache hits and decode."""

from pathlib import Path

import pytest
import torch

from worker.demo_model import make_demo_model
from worker.engine import Engine, EngineConfig, SamplingParams


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_model(tmp_path_factory.mktemp("triton-engine"), "llama", size="tiny")


def _prompts() -> list[list[int]]:
    shared = [(7 * i + 3) % 900 + 5 for i in range(37)]  # a prefix over 2+ blocks of 16
    return [
        shared + [11, 12, 13],
        [400, 401, 402, 403, 404],
        shared + [21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34],
        [5],
        [(13 * i) % 1000 + 3 for i in range(70)],  # longer than one chunk of the token budget
    ]


def _same_tokens(model_dir: Path) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outputs = {}
    for backend in ("torch", "triton"):
        config = EngineConfig(device="cpu", backend=backend, block_size=16, max_num_seqs=4,
                              max_num_batched_tokens=32, kv_cache_bytes=1 << 22)
        engine = Engine.from_pretrained(model_dir, config)
        outputs[backend] = engine.generate(_prompts(), params)
        assert engine.stats.cached_tokens > 0  # the shared prefix was served from the cache
    torch_ids = [o.token_ids for o in outputs["torch"]]
    triton_ids = [o.token_ids for o in outputs["triton"]]
    assert all(len(ids) == 6 for ids in triton_ids)
    assert triton_ids == torch_ids


def test_triton_backend_generates_the_torch_backend_tokens(tiny_llama: Path) -> None:
    _same_tokens(tiny_llama)


@pytest.mark.slow
def test_triton_backend_qwen3_qk_norm(tmp_path: Path) -> None:
    """Qwen3 also runs rms_norm per head (q/k norm) before rotary."""
    _same_tokens(make_demo_model(tmp_path / "qwen3", "qwen3", size="tiny"))


def _hf_checkpoint(tmp_path: Path, tokenizer_dir: Path, config: object) -> Path:
    """A tiny random transformers model saved with the demo tokenizer."""
    import shutil

    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tokenizer_dir / name, tmp_path / name)
    return tmp_path


@pytest.mark.slow  # ~25 s interpreted; tests/kernels/test_attention_sinks.py covers the kernels fast
def test_triton_backend_gpt_oss_attention_sinks(tmp_path: Path, tiny_llama: Path) -> None:
    """gpt-oss: the Triton attention kernels with the sinks (prefill, decode), biases, its MoE."""
    import transformers

    config = transformers.GptOssConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=256,
        max_position_embeddings=512, initializer_range=0.2, bos_token_id=0, eos_token_id=2, pad_token_id=None,
    )  # fmt: skip
    _same_tokens(_hf_checkpoint(tmp_path, tiny_llama, config))


@torch.no_grad()
def _hf_greedy(model: object, prompt: list[int], new: int) -> list[int]:
    """transformers' greedy continuation with its own KV cache."""
    out = model(torch.tensor([prompt]), use_cache=True)
    tokens: list[int] = []
    for _ in range(new):
        tokens.append(int(out.logits[0, -1].argmax()))
        out = model(torch.tensor([[tokens[-1]]]), cache=out.cache, use_cache=True)
    return tokens


@pytest.mark.slow
def test_triton_backend_gpt_oss_gives_transformers_tokens(tmp_path: Path, tiny_llama: Path) -> None:
    """gpt-oss on backend "triton" (interpreted): its experts through the fused-MoE kernel with the
    biases and the clamped SwiGLU, sinks and sliding layers (window 16 < the prompts) in the attention
    kernels, chunked prefill; greedy tokens equal transformers'."""
    import transformers

    config = transformers.GptOssConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
        max_position_embeddings=512, initializer_range=0.2, bos_token_id=0, eos_token_id=2, pad_token_id=None,
    )  # fmt: skip
    path = _hf_checkpoint(tmp_path, tiny_llama, config)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [[(7 * i + 3) % 900 + 5 for i in range(40)], [400, 401, 402, 403, 404], [(13 * i) % 1000 + 3 for i in range(23)]]
    engine = Engine.from_pretrained(path, EngineConfig(device="cpu", backend="triton", block_size=16, max_num_seqs=4,
                                                       max_num_batched_tokens=32, kv_cache_bytes=1 << 22))  # fmt: skip
    backend = engine.runner.model.backend
    assert backend.name == "triton"
    calls: list[dict] = []
    fused = backend.fused_moe

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(kwargs)
        return fused(*args, **kwargs)

    backend.fused_moe = spy
    outs = engine.generate(prompts, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    assert calls and all(c["b13"] is not None and c["swiglu_limit"] == config.swiglu_limit for c in calls)
    assert [o.token_ids for o in outs] == [_hf_greedy(hf, p, 5) for p in prompts]
