"""JobSpec + SamplingSpec: what a job is, validated at submit; its job_id is derived from it."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contracts.constraint import Constraint, schema_object
from contracts.lora.config import MAX_LORAS
from contracts.quantization import check_quant_group, quantization_label
from contracts.sampling import (
    LogitBias,
    Logprobs,
    MaxTokens,
    MinP,
    MinTokens,
    N,
    Penalty,
    ReasoningBudget,
    ReasoningEffort,
    RepetitionPenalty,
    SamplingParams,
    Seed,
    Stop,
    Temperature,
    TopK,
    TopP,
)
from jobs.later_fields import LaterFields

MANIFEST_SPEC_VERSION = 1


class SamplingSpec(LaterFields):
    """Job-wide sampling: the flags every row starts from (each a SamplingParams rule of the same name,
    contracts/sampling.py), plus the job seed and the job-wide constraint as its flags write it.
    Per-row columns and JSONL bodies override them field by field (worker/row_sampling.py). `n` is
    capped at submit by Settings.max_n (the planner)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # added after spec version 1: left out of the JSON (and the job id) at their defaults (LaterFields)
    LATER: ClassVar[tuple[str, ...]] = (
        "n", "logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens",
        "logit_bias", "json_schema", "regex", "choice", "reasoning_budget", "reasoning_effort", "thinking",
    )

    max_tokens: MaxTokens = 128
    temperature: Temperature = 0.0
    top_p: TopP = 1.0
    top_k: TopK = 0
    seed: Seed = Field(0, description="job seed; a row's seed is hash(seed, row id)")
    stop: Stop = ()
    n: N = 1
    logprobs: Logprobs | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    min_p: MinP = 0.0
    min_tokens: MinTokens = 0
    logit_bias: LogitBias = ()
    # chat rows of a model that thinks (README "Reasoning"): a budget of thinking tokens, and the
    # chat template's reasoning effort and thinking switch (enable_thinking)
    reasoning_budget: ReasoningBudget | None = None
    reasoning_effort: ReasoningEffort | None = None
    thinking: bool = Field(True, description="false: enable_thinking=False in the chat template (--no-thinking)")
    # structured output for every row without its own (README "Structured output"); at most one
    json_schema: str | None = Field(
        None, description="a JSON schema (a dict or its JSON text), kept as compact JSON text"
    )
    regex: str | None = Field(None, min_length=1, description="a regular expression the whole text matches")
    choice: tuple[str, ...] | None = Field(None, description="the text is one of these strings")

    @field_validator("json_schema", mode="before")
    @classmethod
    def _canonical_schema(cls, v: Any) -> Any:
        return None if v is None else canonical_schema(v)

    @field_validator("choice")
    @classmethod
    def _choices(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None and (not v or any(not c for c in v)):
            raise ValueError("needs at least one string, and no empty one")
        return v

    @model_validator(mode="after")
    def _one_request(self) -> SamplingSpec:
        try:
            self.defaults()  # the cross-field rules are the request's (min_tokens <= max_tokens)
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"]) from None
        given = [f"--{name.replace('_', '-')}" for name in CONSTRAINT_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} both constrain every row's output: give one")
        return self

    @property
    def constraint_kind(self) -> str | None:
        """Which job-wide constraint is set: json_schema, regex, choice, or None."""
        return next((name for name in CONSTRAINT_FIELDS if getattr(self, name) is not None), None)

    @property
    def constraint(self) -> Constraint | None:
        """The job-wide constraint of --json-schema / --regex / --choice, or None."""
        return self.defaults().constraint

    def defaults(self) -> SamplingParams:
        """The sampling of a row that gives none of its own: every field of this spec by name, the
        job seed as the seed, the job-wide constraint (worker/row_sampling.py puts a row's over it)."""
        return _defaults(self)


@functools.lru_cache(maxsize=16)
def _defaults(sampling: SamplingSpec) -> SamplingParams:
    """SamplingSpec.defaults, built once per spec: every row of a job asks, and a schema is parsed
    and canonicalized once."""
    values = {name: getattr(sampling, name) for name in SamplingParams.__dataclass_fields__ if name in SamplingSpec.model_fields}
    if sampling.json_schema is not None:
        values["constraint"] = Constraint.json_schema(sampling.json_schema)
    elif sampling.regex is not None:
        values["constraint"] = Constraint("regex", sampling.regex)
    elif sampling.choice is not None:
        values["constraint"] = Constraint("choice", choices=sampling.choice)
    return SamplingParams.validated(values)


CONSTRAINT_FIELDS = ("json_schema", "regex", "choice")  # the job-wide structured-output flags


def canonical_schema(v: Any) -> str:
    """A JSON schema (a dict, or JSON text of an object) as compact JSON text, key order kept (the
    order of a `properties` map is the generated object's key order); the worker canonicalizes it
    for the engine (Constraint.json_schema). ValueError as schema_object says."""
    return json.dumps(schema_object(v), separators=(",", ":"), ensure_ascii=False)


ADAPTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$"


class LoraSpec(BaseModel):
    """One LoRA adapter of a job: `--lora NAME=PATH`. Rows name it in their `adapter` column or an
    OpenAI body's `model`; PATH is a PEFT adapter folder or s3:// prefix (docs/design/lora.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(..., min_length=1, max_length=128, pattern=ADAPTER_NAME,
                      description="what rows call it: letters, digits and . _ - : / @ +")  # fmt: skip
    path: str = Field(..., min_length=1, description="a PEFT adapter folder or s3://bucket/prefix")

    @field_validator("path")
    @classmethod
    def _strip_trailing_slash(cls, v: str) -> str:
        stripped = v.strip().rstrip("/")
        if not stripped or stripped in ("s3:", "s3:/"):
            raise ValueError(f"'{v}' is not a path or s3://bucket/prefix URL")
        return stripped


class JobSpec(LaterFields):
    """One job: which rows, which model, which sampling, where results go, how it is priced.

    Two specs with equal fields have the same `job_id`; a rerun into the same OUT with the same spec
    resumes, with a different one it is refused (see `diff`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    # added after the first manifests: left out of the JSON (and the job id) at their defaults (LaterFields)
    LATER: ClassVar[tuple[str, ...]] = (
        "task", "dimensions", "speculative", "speculative_tokens", "row_constraints", "model_name", "quant_group",
        "loras", "max_loras", "cache_salt",
    )

    input: str = Field(..., min_length=1, description="Parquet file, folder/prefix of Parquet, or .jsonl")
    model: str = Field(..., min_length=1, description="HF checkpoint folder or s3://bucket/prefix")
    output: str = Field(..., min_length=1, description="OUT: local folder or s3://bucket/prefix")
    prompt_column: str = Field("prompt", min_length=1, description="string prompts or chat messages")
    id_column: str | None = Field(None, description="ids for the result; default: the row index")
    continuation_column: str | None = Field(
        None, description="likelihood scoring: score this column's text after the prompt"
    )
    task: Literal["generate", "embed"] = Field(
        "generate", description="generate completions, or embed the prompts (as /v1/embeddings)"
    )
    dimensions: int | None = Field(
        None, ge=1, description="embed: keep the first N dimensions of each embedding (Matryoshka)"
    )
    sampling: SamplingSpec = SamplingSpec()
    shard_rows: int = Field(256, ge=1, le=10_000_000, description="rows per shard, about")
    instance_type: str = Field("cpu-local", min_length=1, description="a key of the price table")
    market: Literal["on-demand", "spot"] = "on-demand"
    price_per_hour: float | None = Field(None, ge=0.0, description="USD per hour; overrides the table")
    quantization: Literal["int8", "int4", "fp8"] | None = None
    quant_group: int | None = Field(None, description="int4's group size along K (32, 64, 128); None: the largest "
                                    "that divides every layer")
    speculative: str | None = Field(
        None, description='speculative decoding: "ngram" (prompt lookup) or "draft:PATH" (a draft checkpoint)'
    )
    speculative_tokens: int | None = Field(
        None, ge=1, le=16, description="speculative decoding: most tokens proposed per step (K); default: "
        "the method's (ngram 8, draft 6)"
    )
    row_constraints: bool = Field(
        False,
        description="read a Parquet input's per-row constraint columns (response_format, json_schema, regex, "
        "choice); without it, columns of those names are plain data",
    )
    model_name: str | None = Field(
        None, min_length=1, max_length=256, description="the name requests give the model (`freight serve "
        "--models`): a body's model must be it (or absent), and output bodies carry it; None: the checkpoint's "
        "path or folder name",
    )
    loras: tuple[LoraSpec, ...] = Field(
        (), description="LoRA adapters of the model a row may pick (its `adapter` column, or a body's model "
        "naming one); rows naming none run the model itself",
    )
    max_loras: int | None = Field(
        None, ge=1, le=MAX_LORAS, description="LoRA adapters resident on the device at once (others are swapped "
        "in from host memory); None: the engine's default, 8",
    )
    cache_salt: str | None = Field(
        None, min_length=1, max_length=256, description="the engine reuses prefix-cache blocks only of jobs with "
        "the same salt (`freight serve`: the batch's tenant, so that no tenant's requests reuse or reveal another's "
        "prompts on a shared engine); None: of jobs without one",
    )

    @field_validator("input", "model", "output")
    @classmethod
    def _strip_trailing_slash(cls, v: str) -> str:
        v = v.strip()
        stripped = v.rstrip("/")
        if not stripped or stripped in ("s3:", "s3:/"):
            raise ValueError(f"'{v}' is not a path or s3://bucket/prefix URL")
        return stripped

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        if self.continuation_column is not None and self.continuation_column == self.prompt_column:
            raise ValueError("the continuation column must differ from the prompt column")
        if self.task == "embed" and self.continuation_column is not None:
            raise ValueError("--task embed embeds the prompts; likelihood scoring (--continuation-column) generates")
        if self.task != "embed" and self.dimensions is not None:
            raise ValueError("--dimensions truncates embeddings: it needs --task embed")
        kind = self.sampling.constraint_kind
        if kind is not None and (self.task == "embed" or self.continuation_column is not None):
            what = "--task embed embeds the prompts" if self.task == "embed" else "likelihood scoring scores text"
            raise ValueError(f"--{kind.replace('_', '-')} constrains generated text; {what}: drop one")
        if self.row_constraints and (self.task == "embed" or self.continuation_column is not None):
            what = "--task embed embeds the prompts" if self.task == "embed" else "likelihood scoring scores text"
            raise ValueError(f"--row-constraints constrains generated text; {what}: drop one")
        if self.speculative is not None and not (
            self.speculative == "ngram" or (self.speculative.startswith("draft:") and len(self.speculative) > 6)
        ):
            raise ValueError(f"--speculative must be 'ngram' or 'draft:PATH', got {self.speculative!r}")
        if self.speculative is not None and self.task == "embed":
            raise ValueError("--speculative speeds up generation; --task embed generates nothing")
        if self.output == self.input:
            raise ValueError("the output must differ from the input: results would overwrite the dataset")
        check_quant_group(self.quantization, self.quant_group)
        self._check_loras()
        return self

    def _check_loras(self) -> None:
        names = [a.name for a in self.loras]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"--lora names {', '.join(twice)} more than once: give each adapter its own name")
        if self.loras and self.task == "embed":
            raise ValueError("--lora adapts generation; --task embed embeds with the model itself: drop one")
        if self.model_name is not None and self.model_name in names:
            raise ValueError(f"--lora {self.model_name}: the model itself is served under that name; rename the adapter")
        if self.max_loras is not None and not self.loras:
            raise ValueError("--max-loras sets how many of the job's adapters stay on the device: give --lora too")

    @property
    def adapters(self) -> dict[str, str]:
        """The job's LoRA adapters, name -> folder or s3:// prefix."""
        return {a.name: a.path for a in self.loras}

    @property
    def quantization_label(self) -> str | None:
        """What the loader does to the weights, as one string ("int4-g32"; None: nothing)."""
        return quantization_label(self.quantization, self.quant_group)

    @property
    def job_id(self) -> str:
        """Stable id: a hash of the canonical JSON of every field (16 hex digits)."""
        fields = self.model_dump(mode="json")  # later fields at their defaults left out (LaterFields)
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(f"freight-job-v{MANIFEST_SPEC_VERSION}:{canonical}".encode()).hexdigest()
        return digest[:16]

    def diff(self, other: JobSpec) -> list[str]:
        """Human-readable differences, e.g. ["sampling.max_tokens: 16 != 32"]; empty when equal."""
        return [f"{path}: {a!r} != {b!r}" for path, a, b in self.diff_items(other)]

    def diff_items(self, other: JobSpec) -> list[tuple[str, Any, Any]]:
        """(field path, this value, other value) of every differing field, in path order."""
        return _diff(self.all_fields(), other.all_fields(), prefix="")


def _diff(a: dict[str, Any], b: dict[str, Any], prefix: str) -> list[tuple[str, Any, Any]]:
    out: list[tuple[str, Any, Any]] = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out.extend(_diff(va, vb, prefix=f"{prefix}{key}."))
        elif va != vb:
            out.append((f"{prefix}{key}", va, vb))
    return out


def row_seed(job_seed: int, row_id: str) -> int:
    """A row's sampling seed: independent of its shard, batch and attempt (63-bit non-negative)."""
    digest = hashlib.sha256(f"{job_seed}:{row_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)
