"""PoolingConfig: how a checkpoint turns final hidden states into one embedding, read from its
sentence-transformers files, as Qwen3-Embedding and e5-mistral ship them:

    modules.json              [{"type": "sentence_transformers.models.Transformer", "path": ""},
                               {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"},
                               {"type": "sentence_transformers.models.Normalize", "path": "2_Normalize"}]
    1_Pooling/config.json     {"pooling_mode_lasttoken": true, "pooling_mode_mean_tokens": false, ...}

Pooling reads the hidden states after the model's final norm (no lm_head): the last token of each
sequence (`lasttoken`), the mean over its tokens (`mean`) or its first token (`cls`). Then, as
sentence-transformers' `encode(truncate_dim=d, normalize_embeddings=normalize)` and OpenAI's
`dimensions` do: truncate to the first d dimensions (Matryoshka), then L2-normalize when the
checkpoint has a Normalize module (normalizing before truncating too would change nothing: the
result is scale-free).

Torch-free: jobs/model_check.py reads the config at submit with the same rules the engine loads it
with; the engine applies the truncation and normalization (worker/engine/embedder.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("lasttoken", "mean", "cls")
# 1_Pooling/config.json's boolean per mode (sentence-transformers' Pooling.config_keys)
MODE_KEYS = {
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}


class PoolingConfigError(ValueError):
    """The checkpoint has no pooling config freight can follow; the message says what to do."""


@dataclass(frozen=True)
class PoolingConfig:
    mode: str  # one of MODES
    normalize: bool  # a Normalize module follows the pooling: unit L2 norm
    dimension: int  # hidden size = the full embedding's length

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise PoolingConfigError(f"pooling mode {self.mode!r} is not one of {MODES}")

    @classmethod
    def from_checkpoint(cls, model_dir: Path, hidden_size: int) -> PoolingConfig:
        """`parse` of a local checkpoint folder's files."""

        def read(name: str) -> bytes | None:
            path = model_dir / name
            return path.read_bytes() if path.is_file() else None

        return cls.parse(read, str(model_dir), hidden_size)

    @classmethod
    def parse(cls, read: Callable[[str], bytes | None], model: str, hidden_size: int) -> PoolingConfig:
        """Read modules.json and its Pooling module's config.json through `read` (a path relative to
        the checkpoint -> its bytes, None if absent; jobs/model_check.py passes an object store's).
        PoolingConfigError, naming `model`, when absent or when they ask for something freight does
        not run (other modules, other modes)."""
        modules = _json(read, "modules.json", model)
        if modules is None:
            raise PoolingConfigError(
                f"model {model} has no pooling config (sentence-transformers modules.json / "
                "1_Pooling/config.json), so it cannot make embeddings: use an embedding checkpoint "
                "(e.g. Qwen3-Embedding, e5-mistral) or add those files to the model folder"
            )
        if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
            raise PoolingConfigError(f"model {model}: modules.json is not a list of modules")
        # "sentence_transformers.models.Pooling" (v2-v5) or "...sentence_transformer.modules.pooling.Pooling" (v6)
        kinds = [_kind(m.get("type")) for m in modules]
        if kinds[:2] != ["Transformer", "Pooling"] or any(k != "Normalize" for k in kinds[2:]):
            raise PoolingConfigError(
                f"model {model}: modules.json lists modules {kinds}; freight runs Transformer, Pooling and "
                "an optional Normalize only (a Dense or other module would change the embeddings)"
            )
        name = f"{str(modules[1].get('path') or '1_Pooling').strip('/')}/config.json"
        raw = _json(read, name, model)
        if not isinstance(raw, dict):
            raise PoolingConfigError(f"model {model}: {name} is {'missing' if raw is None else 'not a JSON object'}")
        mode = _mode(raw, f"model {model}: {name}")
        if raw.get("include_prompt", True) is not True:
            raise PoolingConfigError(
                f"model {model}: {name} sets include_prompt=false (instruction tokens left out of the "
                "pooling), which freight does not support"
            )
        dim = raw.get("embedding_dimension", raw.get("word_embedding_dimension", hidden_size))
        if dim != hidden_size:
            raise PoolingConfigError(
                f"model {model}: {name} says the embedding dimension is {dim} but the model's hidden "
                f"size is {hidden_size}"
            )
        return cls(mode=mode, normalize="Normalize" in kinds, dimension=hidden_size)

    def check_dimensions(self, dimensions: Any) -> str | None:
        """Why `dimensions` cannot be used (None: it can)."""
        if dimensions is None:
            return None
        if not isinstance(dimensions, int) or isinstance(dimensions, bool) or not 1 <= dimensions <= self.dimension:
            return f"bad dimensions {dimensions!r}: expected an integer in [1, {self.dimension}] (the model's size)"
        return None


def _json(read: Callable[[str], bytes | None], name: str, model: str) -> Any:
    """`name` parsed, or None when absent."""
    data = read(name)
    if data is None:
        return None
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PoolingConfigError(f"model {model}: {name} is not valid JSON ({exc})") from None


def _kind(type_name: Any) -> str:
    """A modules.json "type" -> its class name for sentence-transformers' own modules, else the type."""
    text = str(type_name)
    return text.rsplit(".", 1)[-1] if text.startswith("sentence_transformers.") else text


def _mode(raw: dict[str, Any], where: str) -> str:
    """The one pooling mode the config turns on: "pooling_mode" (a name or a list of names,
    sentence-transformers v6), else the legacy pooling_mode_* booleans (their default: mean)."""
    named = raw.get("pooling_mode")
    if named is not None:
        on = [named] if isinstance(named, str) else list(named) if isinstance(named, list) else [repr(named)]
    else:
        on = [MODE_KEYS[k] for k in MODE_KEYS if raw.get(k) is True] or ["mean"]
    supported = [m for m in on if m in MODES]
    if len(on) != 1 or len(supported) != 1:
        raise PoolingConfigError(
            f"{where} turns on pooling modes {on or 'none'}; freight supports exactly "
            f"one of {list(MODES)}"
        )
    return supported[0]
