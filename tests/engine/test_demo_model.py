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
    assert logits.shape == (1, ids.shape[1], len(tok))  # added tokens (qwen3's markup) included and torch.isfinite(logits).all()
    assert tok.decode(tok("def f(x):\n    return x")["input_ids"]) == "def f(x):\n    return x"


def test_qwen3_demo_model_has_qwen3_markup(tmp_path: Path) -> None:
    """The qwen3 demo checkpoint renders Qwen3's think switch and tool markup as transformers does,
    with `<think>` / `<tool_call>` as single, non-special tokens (decoded with special tokens skipped)."""
    transformers = pytest.importorskip("transformers")
    path = make_demo_model(tmp_path / "q", "qwen3")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    chat = [{"role": "user", "content": "hi"}]
    off = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    assert "<tools>" in tok.apply_chat_template(chat, tools=tools, add_generation_prompt=True, tokenize=False)
    for marker in ("<think>", "</think>", "<tool_call>", "</tool_call>"):
        ids = tok(marker, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.decode(ids, skip_special_tokens=True) == marker


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
