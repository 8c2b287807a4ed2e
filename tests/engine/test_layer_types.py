"""Window layouts and per-layer-type rope parsed from config.json as transformers 5 writes it and as
older hub configs state it (no layer_types, rope_local_base_freq, use_sliding_window)."""

from __future__ import annotations

from worker.engine.models import ModelConfig

BASE = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip


def test_gemma3_hub_config_without_layer_types() -> None:
    cfg = ModelConfig.from_dict({
        **BASE, "architectures": ["Gemma3ForCausalLM"], "sliding_window": 512, "sliding_window_pattern": 3,
        "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "hidden_activation": "gelu_pytorch_tanh",
        "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "query_pre_attn_scalar": 256,
    })  # fmt: skip
    assert cfg.layer_windows == (512, 512, 0, 512, 512, 0) and cfg.kv_window is None
    assert cfg.rope_theta == 1e6 and cfg.rope_scaling["factor"] == 8.0  # global layers: scaled
    assert cfg.local_rope_theta == 1e4 and cfg.local_rope_scaling is None  # local layers: plain rope
    assert cfg.gemma and cfg.qk_norm and cfg.tie_word_embeddings and cfg.attn_scale == 256**-0.5


def test_gemma2_hub_config_alternates_from_a_local_layer() -> None:
    cfg = ModelConfig.from_dict({**BASE, "architectures": ["Gemma2ForCausalLM"], "sliding_window": 4096,
                                 "hidden_act": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0,
                                 "attn_logit_softcapping": 50.0})  # fmt: skip
    assert cfg.layer_windows == (4096, 0) * 3
    assert (cfg.attn_softcap, cfg.final_softcap, cfg.local_rope_theta) == (50.0, 30.0, None)


def test_windows_off_and_uniform() -> None:
    qwen2 = {**BASE, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096, "use_sliding_window": False}
    assert ModelConfig.from_dict(qwen2).layer_windows == (0,) * 6
    mistral = ModelConfig.from_dict({**BASE, "architectures": ["MistralForCausalLM"], "sliding_window": 64})
    assert mistral.kv_window == 64 and mistral.layer_windows == (64,) * 6
    partial = {**qwen2, "use_sliding_window": True, "max_window_layers": 4}
    assert ModelConfig.from_dict(partial).layer_windows == (0, 0, 0, 0, 4096, 4096)


def test_unknown_layer_type_is_refused() -> None:
    import pytest

    bad = {**BASE, "architectures": ["MistralForCausalLM"], "sliding_window": 8, "layer_types": ["chunked"] * 6}
    with pytest.raises(ValueError, match="layer_types"):
        ModelConfig.from_dict(bad)
