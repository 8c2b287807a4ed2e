"""worker.demo_model: a deterministic, transformers-loadable random checkpoint folder."""

from pathlib import Path

import pytest
import torch

from worker.demo_model import make_demo_model


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_demo_model_loads_in_transformers(tmp_path: Path, arch: str) -> None:
    transformers = pytest.importorskip("transformers")
    path = make_demo_model(tmp_path / arch, arch)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], tok.vocab_size) and torch.isfinite(logits).all()
    assert tok.decode(tok("def f(x):\n    return x")["input_ids"]) == "def f(x):\n    return x"


def test_demo_model_is_deterministic(tmp_path: Path) -> None:
    a = make_demo_model(tmp_path / "a", "qwen3", seed=3)
    b = make_demo_model(tmp_path / "b", "qwen3", seed=3)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    c = make_demo_model(tmp_path / "c", "qwen3", seed=4)
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_demo_model_rejects_unknown_arch(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="llama"):
        make_demo_model(tmp_path, "gpt2")
