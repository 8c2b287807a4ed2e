"""Checkpoints and oracles of the reasoning tests: a qwen3 demo checkpoint (Qwen3's template and
`<think>` tokens), a tiny gpt-oss checkpoint whose tokenizer carries harmony's special tokens and
gpt-oss's chat template (tests/data/gpt_oss_chat_template.jinja), and transformers' greedy decoding
with forced tokens spliced in, the oracle of a budget's insertion."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer

from contracts.reasoning import HARMONY_TOKENS
from worker.demo_model import make_demo_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from tiny_checkpoints import tiny_model  # noqa: E402

GPT_OSS_TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "gpt_oss_chat_template.jinja"


def qwen3_checkpoint(path: Path, seed: int = 0) -> Path:
    return make_demo_model(path, "qwen3", seed=seed)


def harmony_checkpoint(path: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A random gpt-oss model over the demo tokenizer plus harmony's special tokens; EOS = `<|return|>`
    and `<|call|>` (as gpt-oss's generation_config has them)."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in HARMONY_TOKENS])
    eos = [tok.token_to_id("<|return|>"), tok.token_to_id("<|call|>")]
    model = tiny_model("gpt_oss", seed, vocab_size=tok.get_vocab_size(), eos_token_id=eos, bos_token_id=None)
    model.save_pretrained(path)
    tok.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
              "chat_template": GPT_OSS_TEMPLATE.read_text(encoding="utf-8")}  # fmt: skip
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}), encoding="utf-8")
    return path


@torch.no_grad()
def greedy_with(model: torch.nn.Module, prompt: list[int], steps: list[int | list[int]]) -> list[int]:
    """transformers' greedy tokens after `prompt`, where `steps` says per stretch: an int n = n greedy
    tokens, a list = those tokens forced (written as the engine writes an end marker)."""
    ids = list(prompt)
    out: list[int] = []
    for step in steps:
        if isinstance(step, list):
            ids += step
            out += step
            continue
        for _ in range(step):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            out.append(token)
    return out
