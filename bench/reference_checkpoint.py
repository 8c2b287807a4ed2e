"""Where bench/train_reference.py's models come from and go: a Hugging Face checkpoint written
(fp16 safetensors, tokenizer, chat template, training.json) and the weights a run starts from
(`--init-from`: the same shape; `--grow-from`: a smaller model grown into this shape)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from stdlib_corpus import EOS

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def save(model, tok, context: int, out: Path, meta: dict) -> None:
    """Write `model` (as fp16) and `tok` to `out` in Hugging Face format, with `meta` as training.json."""
    out.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.float16)
    model.config.torch_dtype = "float16"
    model.save_pretrained(out, safe_serialization=True)
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": context * 2,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    eos = tok.token_to_id(EOS)
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}, indent=2) + "\n"
    )
    (out / "training.json").write_text(json.dumps(meta, indent=2) + "\n")


def save_weights(model, tok, out: Path, meta: dict) -> None:
    """Write `model`'s weights as they are (fp32 safetensors) with its config.json, `tok` and `meta` as
    training.json: a run's intermediate state (the copy warm-up's) for a later --init-from / --grow-from
    (which reads the source's head size from the config)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    model.config.to_json_file(str(out / "config.json"))
    tok.save(str(out / "tokenizer.json"))
    (out / "training.json").write_text(json.dumps(meta, indent=2) + "\n")


def init_from(path: Path, model) -> None:
    """Load checkpoint `path` into `model` (strict: the same tensors and shapes, else a clear exit)."""
    from safetensors.torch import load_file

    try:
        model.load_state_dict(load_file(str(path / "model.safetensors")))
    except RuntimeError as exc:
        first = (str(exc).splitlines()[1:] or [str(exc)])[0].strip()[:160]
        raise SystemExit(
            f"--init-from {path}: its tensors do not match this shape ({first}); "
            "pass the same --num-layers, --hidden-size, --intermediate-size and head counts"
        ) from None


def grow_from(path: Path, model) -> dict:
    """Grow the smaller checkpoint `path` into `model`'s shape (bench/grow_model.py: the same logits
    at step 0); a clear exit when it does not fit. Returns the source's shape."""
    from grow_model import grow, source_shape
    from safetensors.torch import load_file

    src = load_file(str(path / "model.safetensors"))
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    config = path / "config.json"  # (a warm-up saved before save_weights wrote one has none: assumed equal)
    if config.is_file():
        cfg = json.loads(config.read_text())
        theirs = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        if theirs != head_dim:
            raise SystemExit(f"--grow-from {path}: its attention heads are {theirs} wide, this model's "
                             f"{head_dim}; growing keeps each head, so pick --hidden-size / --num-heads "
                             f"with hidden / heads = {theirs}")  # fmt: skip
    try:
        model.load_state_dict(grow(src, model.state_dict(), head_dim))
    except (ValueError, KeyError) as exc:
        raise SystemExit(
            f"--grow-from {path}: cannot grow it into this shape ({exc}); it needs the same "
            "vocabulary and head size, and no dimension larger than this model's"
        ) from None
    return source_shape(src, head_dim)


def provenance(path: Path) -> dict:
    """Where a run started: the checkpoint's path and its own training.json (when it has one)."""
    meta = path / "training.json"
    return {"path": str(path), "training": json.loads(meta.read_text()) if meta.is_file() else None}
