"""`freight serve --models FILE`: the model names a request's `model` may give, each a checkpoint.

TOML or JSON (by the file's suffix); a name maps to a checkpoint folder or s3:// prefix, or to a
table with the path and the engine settings a job spec takes:

```toml
"llama-3.1-8b" = "s3://models/llama-3.1-8b-instruct"

[qwen3-small]
path = "/models/Qwen3-0.6B"       # relative paths are relative to this file's folder
quantization = "int8"             # int8 | int4 | fp8
quant_group = 32                  # int4 only: its group size (32 | 64 | 128)
speculative = "ngram"             # ngram | draft:PATH
speculative_tokens = 8
adapters = { support = "adapters/support", legal = "s3://ft/legal-v7" }   # LoRA adapters, by name
```

A request's `model` may also name a LoRA adapter of a served model (as vLLM serves adapters): its
batch runs that model with the file's adapters as `--lora`, and each request runs the adapter it
names. Adapter names are unique over the file and differ from the models' names.

A batch runs one model, as OpenAI's do: the one its lines name (the most named, when they name
several; the lines that name another are those requests' errors).
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contracts.quantization import check_quant_group
from jobs.errors import FreightError
from jobs.spec import ADAPTER_NAME, LoraSpec


class ServedModel(BaseModel):
    """One served model: the name requests give, and what a job spec needs to run it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(..., min_length=1, max_length=256)
    path: str = Field(..., min_length=1, description="checkpoint folder or s3://bucket/prefix")
    quantization: Literal["int8", "int4", "fp8"] | None = None
    quant_group: int | None = Field(None, description="int4's group size along K: 32, 64 or 128")
    speculative: str | None = Field(None, description='"ngram" or "draft:PATH"')
    speculative_tokens: int | None = Field(None, ge=1, le=16)
    adapters: dict[str, str] = Field(default_factory=dict, description="LoRA adapters a request's model may name: "
                                     "name -> PEFT adapter folder or s3:// prefix")  # fmt: skip

    @model_validator(mode="after")
    def _quant_group(self) -> ServedModel:
        check_quant_group(self.quantization, self.quant_group)
        return self

    @field_validator("adapters")
    @classmethod
    def _adapters(cls, v: dict[str, str]) -> dict[str, str]:
        for name, path in v.items():  # as --lora takes them
            if not re.match(ADAPTER_NAME, name) or len(name) > 128:
                raise ValueError(f"adapter name {name!r}: use letters, digits and . _ - : / @ +, starting with a "
                                 "letter or digit")  # fmt: skip
            if not path.strip().rstrip("/"):
                raise ValueError(f"adapter {name!r}: give its folder or s3:// prefix")
        return v

    @property
    def loras(self) -> tuple[LoraSpec, ...]:
        """The adapters as the job spec takes them."""
        return tuple(LoraSpec(name=name, path=path) for name, path in self.adapters.items())

    @field_validator("speculative")
    @classmethod
    def _speculative(cls, v: str | None) -> str | None:
        if v is not None and v != "ngram" and not (v.startswith("draft:") and len(v) > 6):
            raise ValueError(f"speculative {v!r}: give 'ngram' or 'draft:PATH'")
        return v


def load_models(path: Path) -> dict[str, ServedModel]:
    """The models of a --models file, by name; FreightError with one line for anything wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FreightError(f"--models {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        raw = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        raise FreightError(f"--models {path}: not {kind} ({exc}); name it .json for JSON, else TOML") from None
    if not isinstance(raw, dict) or not raw:
        raise FreightError(f"--models {path}: give at least one model, as name = \"checkpoint path\"")
    models = {name: _model(path, name, entry) for name, entry in raw.items()}
    owner: dict[str, str] = {}
    for name, model in models.items():
        for adapter in model.adapters:
            if adapter in models or adapter in owner:
                other = f"model {adapter!r}" if adapter in models else f"an adapter of {owner[adapter]!r}"
                raise FreightError(f"--models {path}: model {name!r}: adapter {adapter!r} has the name of {other}; "
                                   "a request's model must name one thing: rename one")  # fmt: skip
            owner[adapter] = name
    return models


def _model(path: Path, name: str, entry: Any) -> ServedModel:
    fields: dict[str, Any] = {"path": entry} if isinstance(entry, str) else entry
    if not isinstance(fields, dict):
        raise FreightError(f"--models {path}: model {name!r} must be a path or a table with a path")
    try:
        model = ServedModel.model_validate({**fields, "name": name})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "value"
        raise FreightError(f"--models {path}: model {name!r}, {where}: {first['msg']}") from None
    update: dict[str, Any] = {"path": _resolve(path, model.path)}
    if model.speculative is not None and model.speculative.startswith("draft:"):
        update["speculative"] = "draft:" + _resolve(path, model.speculative[len("draft:") :])
    if model.adapters:
        update["adapters"] = {adapter: _resolve(path, folder) for adapter, folder in model.adapters.items()}
    return model.model_copy(update=update)


def _resolve(models_file: Path, checkpoint: str) -> str:
    if checkpoint.startswith("s3://"):
        return checkpoint.rstrip("/")
    p = Path(checkpoint).expanduser()
    return str(p if p.is_absolute() else (models_file.parent / p).resolve())
