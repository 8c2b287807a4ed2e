"""Tokenizer: tokenizer.json through `tokenizers`, the chat template through jinja2."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2.sandbox
from tokenizers import Tokenizer as HFTokenizer

from contracts.reasoning import ReasoningFormat, ReasoningTokens, detect


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


class Tokenizer:
    """encode / decode / apply_chat_template, and the EOS ids generation stops at.

    eos_token_ids = generation_config.json's eos_token_id (int or list) + config.json's + the
    tokenizer_config eos_token, deduplicated in that order.
    """

    def __init__(self, model_dir: Path) -> None:
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"{model_dir} has no tokenizer.json (a `tokenizers` fast tokenizer is required)")
        self._tok = HFTokenizer.from_file(str(path))
        tcfg = self._read(model_dir / "tokenizer_config.json")
        self.bos_token = _token_text(tcfg.get("bos_token"))
        self.eos_token = _token_text(tcfg.get("eos_token"))
        template = tcfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if not template and (model_dir / "chat_template.jinja").is_file():  # newer transformers save it apart
            template = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        # as transformers renders templates: its tojson (no HTML escaping, keys in order) and strftime_now
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = self._raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.chat_template: str | None = template or None
        self._template = env.from_string(template) if template else None
        eos: list[int] = _ids(self._read(model_dir / "generation_config.json").get("eos_token_id"))
        eos += _ids(self._read(model_dir / "config.json").get("eos_token_id"))
        if self.eos_token is not None and self._tok.token_to_id(self.eos_token) is not None:
            eos.append(self._tok.token_to_id(self.eos_token))
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos))
        self._bos_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.vocab_size = self._tok.get_vocab_size()
        # The longest token string (byte-level BPE: one char a byte; SentencePiece: "<0x0A>" for one
        # byte): no token decodes to more characters, so a text of more than n x this characters
        # needs more than n tokens (up to normalizers that drop characters: max_text_chars' margin).
        self.max_token_chars = max((len(t) for t in self._tok.get_vocab(with_added_tokens=True)), default=1)

    @functools.cached_property
    def reasoning(self) -> ReasoningFormat | None:
        """The model's reasoning format, read from its chat template's markers (contracts/reasoning.py)."""
        return detect(self.chat_template, self.vocab())

    @functools.cache  # noqa: B019  (one Tokenizer per engine, kept for its life)
    def reasoning_tokens(self, fmt: ReasoningFormat) -> ReasoningTokens:
        """`fmt`'s markers as this tokenizer's ids (ValueError when one is not a single token)."""
        return ReasoningTokens.resolve(fmt, self.vocab(), lambda text: self.encode(text, add_special_tokens=False),
                                       lambda ids: self.decode(list(ids), skip_special_tokens=False))  # fmt: skip

    def vocab(self) -> dict[str, int]:
        """Token string -> id, added tokens included (a draft model's tokenizer must equal its target's)."""
        return self._tok.get_vocab(with_added_tokens=True)

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    @staticmethod
    def _raise(message: str) -> None:
        raise ValueError(f"chat template: {message}")

    def max_text_chars(self, tokens: int) -> int:
        """The most characters a text of at most `tokens` tokens can have: `tokens` x the longest
        token, x 2 for normalizers that merge or drop characters (NFC composition, stripped accents).
        A longer text is refused before it is tokenized: tokenizing costs ~200 bytes of memory a
        character, so a 50 MB prompt would take ~10 GB to learn it does not fit."""
        return max(1, tokens) * self.max_token_chars * 2

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Like transformers' `tokenizer(text)`: tokenizer.json's post-processor may add a BOS; a text
        that already starts with the BOS token (a rendered chat template) does not get a second one.
        add_special_tokens=False: the bare tokens, for text that continues a sequence."""
        return self._single_bos(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """`encode` of each text, in one call (the Rust side splits the batch across its threads)."""
        return [self._single_bos(e.ids) for e in self._tok.encode_batch_fast(texts)]

    def _single_bos(self, ids: list[int]) -> list[int]:
        bos = self._bos_id
        if bos is not None and len(ids) >= 2 and ids[0] == ids[1] == bos:
            return ids[1:]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None, **template_kwargs: Any) -> str:  # fmt: skip
        """The prompt text, as transformers' `apply_chat_template(messages, tools=tools, tokenize=False,
        **template_kwargs)` renders it (`template_kwargs`: enable_thinking, reasoning_effort, ...)."""
        if self._template is None:
            raise ValueError("this model's tokenizer_config.json has no chat_template; send plain prompts")
        return self._template.render(
            **template_kwargs,
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )
