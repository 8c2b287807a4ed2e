"""The demo tokenizer made a harmony one: gpt-oss's special tokens added and gpt-oss's chat template
(tests/data/gpt_oss_chat_template.jinja), for the tests of harmony's channels and tool calls."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

from contracts.reasoning import HARMONY_TOKENS

GPT_OSS_TEMPLATE = Path(__file__).resolve().parent / "data" / "gpt_oss_chat_template.jinja"


def write_harmony_tokenizer(tokenizer_dir: Path, out: Path) -> Path:
    """Write into `out` the tokenizer of `tokenizer_dir` with harmony's special tokens and gpt-oss's
    chat template; returns `out`."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in HARMONY_TOKENS])
    tok.save(str(out / "tokenizer.json"))
    template = GPT_OSS_TEMPLATE.read_text(encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return out
