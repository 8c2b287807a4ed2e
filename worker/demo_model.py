"""A small random Hugging Face checkpoint folder, built offline with torch + safetensors + tokenizers.

`make_demo_model(out_dir)` writes everything `Engine.from_pretrained` and transformers need:
config.json, model.safetensors, generation_config.json, tokenizer.json (a byte-level BPE trained
deterministically on a few Python standard-library sources) and tokenizer_config.json (a ChatML
jinja2 chat template). A qwen3 checkpoint carries Qwen3's own chat template instead
(chat_templates/qwen3.jinja: `<think>` blocks, the enable_thinking switch, Hermes `<tool_call>`
markup) and its tokenizer Qwen3's added tokens for them, so reasoning and tool calls can be tried
without a hub. The weights are random: the text it generates is noise, but every code path of a
real job (tokenize, batch, cache, sample, detokenize) runs for real. Same arguments and Python
version -> byte-identical files.
"""

from __future__ import annotations

import json
import os
import shutil
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Fixed local corpus for the tokenizer: stable within one Python version.
CORPUS_FILES = ["textwrap.py", "string.py", "heapq.py", "json/encoder.py", "bisect.py", "csv.py"]
# Qwen3's markup tokens: added tokens that are not special (decoded even when special tokens are
# skipped), after the trained vocabulary, as Qwen3's tokenizer has them
QWEN3_MARKUP = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN3_TEMPLATE = Path(__file__).with_name("chat_templates") / "qwen3.jinja"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class DemoSize:
    """Shape of a demo model; parameters ~ vocab*hidden*(2 if untied) + layers*(4*h*h' + 3*h*ffn)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int


SIZES = {
    "tiny": DemoSize(64, 128, 2, 4, 2, 1024, 2048),  # ~0.2M params: tests and `make demo`
    "small": DemoSize(256, 768, 4, 8, 4, 2048, 4096),  # ~4M params
    "medium": DemoSize(512, 1536, 8, 8, 4, 4096, 4096),  # ~30M params: bench/
}


def train_byte_level_bpe(
    texts: list[str], vocab_size: int, special_tokens: list[str], *, isolate_newlines: bool = False
) -> Tokenizer:
    """A byte-level BPE tokenizer trained on `texts`; deterministic for the same texts and settings.

    isolate_newlines: every "\n" is a token of its own, never merged with the next line's
    indentation. For code this keeps a prompt that ends with a newline in distribution: with the
    GPT-2 split, "):\n    return" is "):", "\n   ", " return", so a prompt ending in a bare "\n"
    looks like the end of a top-level line and the model continues at column 0.
    """
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Split("\n", behavior="isolated"), byte_level])
        if isolate_newlines
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def train_tokenizer(vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on the fixed stdlib corpus; deterministic for one Python version."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / name).read_text(encoding="utf-8") for name in CORPUS_FILES]
    return train_byte_level_bpe(texts, vocab_size, SPECIAL_TOKENS)


def _config(arch: str, size: DemoSize, vocab_size: int, tie: bool) -> dict:
    head_dim = size.hidden_size // size.num_attention_heads
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": size.hidden_size,
        "intermediate_size": size.intermediate_size,
        "num_hidden_layers": size.num_hidden_layers,
        "num_attention_heads": size.num_attention_heads,
        "num_key_value_heads": size.num_key_value_heads,
        "head_dim": head_dim,
        "vocab_size": vocab_size,
        "max_position_embeddings": size.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": tie,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    if arch == "qwen3":
        config["attention_bias"] = False
    return config


def _weights(arch: str, size: DemoSize, vocab_size: int, tie: bool, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    h, ffn = size.hidden_size, size.intermediate_size
    head_dim = h // size.num_attention_heads
    q_out, kv_out = size.num_attention_heads * head_dim, size.num_key_value_heads * head_dim

    def rand(*shape: int, std: float = 0.05) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    def norm(n: int) -> torch.Tensor:
        return 1.0 + rand(n, std=0.1)

    w = {"model.embed_tokens.weight": rand(vocab_size, h, std=0.5), "model.norm.weight": norm(h)}
    for i in range(size.num_hidden_layers):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = rand(q_out, h)
        w[p + "self_attn.k_proj.weight"] = rand(kv_out, h)
        w[p + "self_attn.v_proj.weight"] = rand(kv_out, h)
        w[p + "self_attn.o_proj.weight"] = rand(h, q_out)
        if arch == "qwen2":
            for name, n in (("q", q_out), ("k", kv_out), ("v", kv_out)):
                w[p + f"self_attn.{name}_proj.bias"] = rand(n)
        if arch == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(head_dim)
            w[p + "self_attn.k_norm.weight"] = norm(head_dim)
        w[p + "mlp.gate_proj.weight"] = rand(ffn, h)
        w[p + "mlp.up_proj.weight"] = rand(ffn, h)
        w[p + "mlp.down_proj.weight"] = rand(h, ffn)
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "post_attention_layernorm.weight"] = norm(h)
    if not tie:
        w["lm_head.weight"] = rand(vocab_size, h, std=0.5)
    return {k: v.contiguous() for k, v in w.items()}


def make_demo_model(
    out_dir: str | Path,
    arch: str = "llama",
    *,
    seed: int = 0,
    size: str = "tiny",
    tie_word_embeddings: bool | None = None,
) -> Path:
    """Write a random `arch` checkpoint of `size` into out_dir and return its path.

    out_dir must be new or an empty folder (ValueError otherwise: a checkpoint is never overwritten).
    The files are written into a temporary sibling folder renamed into place, so a failure leaves
    nothing half-written.
    """
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown demo architecture {arch!r}; choose one of {sorted(ARCHITECTURES)}")
    if size not in SIZES:
        raise ValueError(f"unknown demo size {size!r}; choose one of {sorted(SIZES)}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file: give a new or empty folder for the checkpoint")
    if out.is_dir() and any(out.iterdir()):
        names = sorted(p.name for p in out.iterdir())
        raise ValueError(
            f"{out} is not empty ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}): give a new "
            "or empty folder; freight never overwrites a checkpoint"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it owner-only; a checkpoint folder is an ordinary one
    try:
        _write_checkpoint(tmp, arch, SIZES[size], tie_word_embeddings, seed)
        os.replace(tmp, out)  # rename(2) may replace an empty folder
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def with_config(src: str | Path, dst: str | Path, **changes: object) -> Path:
    """A copy of checkpoint folder `src` at `dst` whose config.json has `changes` set over its own
    (the checks of sizes a config claims, on a checkpoint that stays small)."""
    out = Path(dst)
    shutil.copytree(src, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(changes)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def add_pooling_config(model_dir: str | Path, pooling: str = "lasttoken", *, normalize: bool = True,
                       append_eos: bool = False) -> Path:  # fmt: skip
    """Make a checkpoint folder an embedding checkpoint, as Qwen3-Embedding / e5-mistral ship theirs:
    sentence-transformers' modules.json (Transformer, Pooling, + Normalize when `normalize`) and
    1_Pooling/config.json turning on `pooling` ("lasttoken", "mean" or "cls"). `append_eos`: the
    tokenizer's post-processor appends <|endoftext|> to every text, as Qwen3-Embedding's does."""
    out = Path(model_dir)
    hidden = json.loads((out / "config.json").read_text(encoding="utf-8"))["hidden_size"]
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out / "2_Normalize").mkdir(exist_ok=True)
    (out / "modules.json").write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")
    (out / "1_Pooling").mkdir(exist_ok=True)
    keys = {"lasttoken": "pooling_mode_lasttoken", "mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token"}
    if pooling not in keys:
        raise ValueError(f"pooling must be one of {sorted(keys)}, got {pooling!r}")
    config = {"word_embedding_dimension": hidden, "include_prompt": True, "pooling_mode_max_tokens": False,
              **{key: mode == pooling for mode, key in keys.items()}}  # fmt: skip
    _write_json(out / "1_Pooling" / "config.json", config)
    if append_eos:
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
        eos = SPECIAL_TOKENS[0]
        tok.post_processor = processors.TemplateProcessing(
            single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, tok.token_to_id(eos))]
        )
        tok.save(str(out / "tokenizer.json"))
    return out


def _write_checkpoint(
    out: Path, arch: str, shape: DemoSize, tie_word_embeddings: bool | None, seed: int
) -> None:
    tie = False if tie_word_embeddings is None else tie_word_embeddings

    tokenizer = train_tokenizer(shape.vocab_size)
    if arch == "qwen3":
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN3_MARKUP])
    vocab_size = tokenizer.get_vocab_size()
    tokenizer.save(str(out / "tokenizer.json"))
    endoftext, _, im_end = (tokenizer.token_to_id(t) for t in SPECIAL_TOKENS)

    config = _config(arch, shape, vocab_size, tie)
    config.update(bos_token_id=endoftext, eos_token_id=im_end)
    _write_json(out / "config.json", config)
    _write_json(
        out / "generation_config.json", {"bos_token_id": endoftext, "eos_token_id": [endoftext, im_end]}
    )
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": SPECIAL_TOKENS[0],
            "eos_token": SPECIAL_TOKENS[2],
            "pad_token": SPECIAL_TOKENS[0],
            "model_max_length": shape.max_position_embeddings,
            "chat_template": QWEN3_TEMPLATE.read_text(encoding="utf-8") if arch == "qwen3" else CHAT_TEMPLATE,
        },
    )
    save_file(_weights(arch, shape, vocab_size, tie, seed), str(out / "model.safetensors"), {"format": "pt"})


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
