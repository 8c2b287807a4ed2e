"""JobSpec + SamplingSpec: what a job is, validated at submit; its job_id is derived from it."""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from jobs.later_fields import LaterFields

MANIFEST_SPEC_VERSION = 1


MAX_STOP = 16  # stop strings per request (OpenAI takes 4, vLLM any number)
MAX_LOGPROBS = 20  # top log-probabilities per token (OpenAI's top_logprobs limit, vLLM's default)
LOGIT_BIAS_LIMIT = 100.0  # |bias| at most, as OpenAI


class SamplingSpec(LaterFields):
    """Job-wide sampling defaults (vLLM's names and meanings); per-row columns and JSONL bodies
    override them field by field. `n` is capped at submit by Settings.max_n (the planner)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # added after spec version 1: left out of the JSON (and the job id) at their defaults (LaterFields)
    LATER: ClassVar[tuple[str, ...]] = (
        "n", "logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens",
        "logit_bias", "json_schema", "regex", "choice",
    )

    max_tokens: int = Field(128, ge=1, le=1_000_000, description="generated tokens per row, at most")
    temperature: float = Field(0.0, ge=0.0, le=100.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 = off")
    seed: int = Field(0, ge=0, lt=2**63, description="job seed; a row's seed is hash(seed, row id)")
    stop: tuple[str, ...] = Field((), max_length=MAX_STOP, description="stop strings, cut from the text")
    n: int = Field(1, ge=1, description="choices per row")
    logprobs: int | None = Field(
        None, ge=0, le=MAX_LOGPROBS, description="top log-probabilities per generated token; None = off"
    )
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0, description="1 = off")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="0 = off")
    min_tokens: int = Field(0, ge=0, description="tokens generated before EOS / stop ids may end a row")
    logit_bias: tuple[tuple[int, float], ...] = Field(
        (), description="(token id, bias) pairs sorted by id; a {id: bias} map or its JSON text is accepted"
    )
    # structured output for every row without its own (README "Structured output"); at most one
    json_schema: str | None = Field(
        None, description="a JSON schema (a dict or its JSON text), kept as compact JSON text"
    )
    regex: str | None = Field(None, min_length=1, description="a regular expression the whole text matches")
    choice: tuple[str, ...] | None = Field(None, description="the text is one of these strings")

    @field_validator("stop")
    @classmethod
    def _stops_not_empty(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(not s for s in v):
            raise ValueError("stop strings must not be empty")
        return v

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _bias_pairs(cls, v: Any) -> Any:
        return logit_bias_pairs(v)

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
    def _min_tokens_fit(self) -> SamplingSpec:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        given = [f"--{name.replace('_', '-')}" for name in CONSTRAINT_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} both constrain every row's output: give one")
        return self

    @property
    def constraint_kind(self) -> str | None:
        """Which job-wide constraint is set: json_schema, regex, choice, or None."""
        return next((name for name in CONSTRAINT_FIELDS if getattr(self, name) is not None), None)


CONSTRAINT_FIELDS = ("json_schema", "regex", "choice")  # the job-wide structured-output flags


def canonical_schema(v: Any) -> str:
    """A JSON schema (a dict, or JSON text of an object) as compact JSON text, key order kept (the
    order of a `properties` map is the generated object's key order); the worker canonicalizes it
    for the engine (Constraint.json_schema). ValueError when it is not a JSON object."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError as exc:
            raise ValueError(f"json_schema is not valid JSON ({exc})") from None
    if not isinstance(v, dict):
        raise ValueError(f"json_schema must be a JSON object (a schema), got {type(v).__name__}")
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def logit_bias_pairs(v: Any) -> Any:
    """A logit_bias given as {token id (int or its string): bias}, its JSON text, or pairs -> sorted
    (id, bias) pairs. ValueError (naming the rule) for a key that is not a token id or a bias beyond
    +-100; anything else is handed on for the caller's type check."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError as exc:
            raise ValueError(f"logit_bias is not JSON ({exc.msg}): expected {{\"token id\": bias}}") from None
    items = list(v.items()) if isinstance(v, dict) else v
    if not isinstance(items, list | tuple):
        raise ValueError('logit_bias must be a map of token id to bias, e.g. {"50256": -100}')
    pairs: dict[int, float] = {}
    for item in items:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise ValueError('logit_bias must be a map of token id to bias, e.g. {"50256": -100}')
        key, bias = item
        token = _token_id(key)
        if token is None:
            raise ValueError(f"logit_bias key {_shown(key)} is not a token id (a non-negative integer below 10^12)")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not abs(bias) <= LOGIT_BIAS_LIMIT:
            raise ValueError(f"logit_bias[{_shown(key)}] = {_shown(bias)}: a bias must be a number in [-100, 100]")
        pairs[token] = float(bias)
    return tuple(sorted(pairs.items()))


def _token_id(key: Any) -> int | None:
    """The token id `key` names; None unless a non-negative integer (or its digits) below 10^12: no
    vocabulary is larger, and longer digit strings would meet Python's int() length limit."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key if 0 <= key < 10**12 else None
    if isinstance(key, str) and key.strip().isdigit() and len(key.strip()) <= 12:
        return int(key)
    return None


def _shown(value: Any, limit: int = 40) -> str:
    """`value`'s repr for a message, cut to `limit` characters (a key may be megabytes long)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**limit else f"<{len(str(abs(value)))}-digit number>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class JobSpec(LaterFields):
    """One job: which rows, which model, which sampling, where results go, how it is priced.

    Two specs with equal fields have the same `job_id`; a rerun into the same OUT with the same spec
    resumes, with a different one it is refused (see `diff`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    # added after the first manifests: left out of the JSON (and the job id) at their defaults (LaterFields)
    LATER: ClassVar[tuple[str, ...]] = (
        "task", "dimensions", "speculative", "speculative_tokens", "row_constraints", "model_name",
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
        return self

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
