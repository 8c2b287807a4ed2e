"""Rope configs as the hub writes them (transformers 4's `rope_scaling`, Phi-3.5 / Phi-4-mini keys)
against transformers 5.24's own rotary embeddings: the engine's cos/sin table equals theirs, short
and long LongRoPE factors, partial rotary, YaRN; bad rope configs are refused by name."""

from __future__ import annotations

import copy

import pytest
import torch

from worker.engine.models import ModelConfig
from worker.engine.models.rotary import cos_sin_cache

transformers = pytest.importorskip("transformers")
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding  # noqa: E402
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding  # noqa: E402

# Phi-4-mini's shape of config.json (transformers 4 keys, top-level partial_rotary_factor and
# original_max_position_embeddings), shrunk: head_dim 32, 24 rotary dims, 12 factors each.
PHI4_MINI = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 1024, "hidden_size": 96,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 3, "num_key_value_heads": 1,
    "max_position_embeddings": 4096, "original_max_position_embeddings": 256, "partial_rotary_factor": 0.75,
    "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": True,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(12)],
                     "long_factor": [1.0 + 0.7 * i for i in range(12)]},
}  # fmt: skip


def _hf_cos_sin(rotary: torch.nn.Module, positions: torch.Tensor, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions[None])
    return cos[0, :, :half], sin[0, :, :half]


def test_phi4_mini_style_longrope_matches_transformers() -> None:
    raw = copy.deepcopy(PHI4_MINI)  # transformers' config writes into the dicts it is given
    cfg = ModelConfig.from_dict(raw)
    assert (cfg.head_dim, cfg.rotary_dim, cfg.longrope_threshold, cfg.sliding_window) == (32, 24, 256, 262144)
    table = cos_sin_cache(cfg.head_dim, 600, cfg.rope_theta, cfg.rope_scaling, cfg.rotary_dim)
    half = cfg.head_dim // 2
    hf = Phi3RotaryEmbedding(transformers.Phi3Config.from_dict(copy.deepcopy(raw)))
    # a forward of 200 positions: short factors; one of 600: long factors at every position. The
    # table's first half switches at 256 (cached generation of a prompt that fits), its second half
    # (rows 600 on: a prompt longer than 256) is the long forward at every position
    assert table.shape == (1200, cfg.head_dim)
    for length, rows, want in ((200, slice(0, 200), slice(0, 200)), (600, slice(256, 600), slice(256, 600)),
                               (600, slice(600, 1200), slice(0, 600))):  # fmt: skip
        cos, sin = _hf_cos_sin(hf, torch.arange(length), 12)
        torch.testing.assert_close(table[rows, :12], cos[want], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(table[rows, half : half + 12], sin[want], atol=1e-6, rtol=1e-5)
    assert torch.equal(table[:, 12:half], torch.ones(1200, 4))  # pass-through pairs
    assert torch.equal(table[:, half + 12 :], torch.zeros(1200, 4))
    assert hf.attention_scaling == pytest.approx(cfg.rope_scaling["attention_factor"]) and hf.attention_scaling > 1


def test_phi3_older_longrope_names() -> None:
    """Phi-3's configs also name LongRoPE "su" (and "yarn"); transformers' Phi3Config maps both to it."""
    want = ModelConfig.from_dict(PHI4_MINI).rope_scaling
    for name in ("su", "yarn"):
        raw = {**PHI4_MINI, "rope_scaling": {**PHI4_MINI["rope_scaling"], "type": name}}
        assert ModelConfig.from_dict(raw).rope_scaling == want


def test_gpt_oss_yarn_matches_transformers() -> None:
    hf_config = transformers.GptOssConfig(hidden_size=64, head_dim=16, num_attention_heads=4, num_key_value_heads=2,
                                          num_hidden_layers=2, vocab_size=1024,
                                          max_position_embeddings=8192)  # fmt: skip
    raw = hf_config.to_dict() | {"architectures": ["GptOssForCausalLM"]}
    cfg = ModelConfig.from_dict(raw)
    assert cfg.rope_scaling["rope_type"] == "yarn" and cfg.attention_sinks and cfg.o_proj_bias
    table = cos_sin_cache(cfg.head_dim, 5000, cfg.rope_theta, cfg.rope_scaling)
    cos, sin = _hf_cos_sin(GptOssRotaryEmbedding(hf_config), torch.arange(5000), 8)
    torch.testing.assert_close(table[:, :8], cos, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(table[:, 8:], sin, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 12, "long_factor": [1.0] * 16}},
         "longrope long_factor must list 12 numbers"),
        ({"original_max_position_embeddings": None}, "longrope rope needs original_max_position_embeddings"),
        ({"partial_rotary_factor": 0.3}, "partial_rotary_factor gives 9 rotary dimensions"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope type 'dynamic' is not supported"),
    ],
)  # fmt: skip
def test_bad_rope_config_is_refused(change: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        ModelConfig.from_dict({**PHI4_MINI, **change})
