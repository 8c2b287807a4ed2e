"""The manifest: OUT/manifest.json, the job spec + the shard plan, written once before any work.

Also the object keys of the storage layout (docs/ARCHITECTURE.md, "Job pipeline contract").
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobs.errors import (
    CorruptManifestError,
    ManifestError,
    NewerManifestError,
    ObjectNotFoundError,
    SpecMismatchError,
)
from jobs.later_fields import LaterFields
from jobs.spec import JobSpec
from jobs.storage import ObjectStore

MANIFEST_FORMAT = "freight.manifest/1"

MANIFEST_KEY = "manifest.json"
COST_KEY = "cost.json"
SUCCESS_KEY = "_SUCCESS"
# A committed result's Parquet schema metadata carries its shard record under this key, so the record
# commits atomically with the rows (OUT/costs/<n>.json is written right after, for people and tools).
RECORD_METADATA_KEY = b"freight.shard_record"
# ... and a token unique to the commit that wrote it (uuid4 hex), so an attempt whose conditional PUT
# stored the object but lost its response (the client's retry then meets its own object: 412) can
# tell its own commit from another attempt's. Kept out of ShardRecord: that model refuses unknown
# fields, and workers of an older version still read costs/<n>.json.
COMMIT_TOKEN_KEY = b"freight.commit_token"

# OUT/shards/ holds the result Parquet files and nothing else, so pandas, pyarrow.dataset, DuckDB and
# Spark read the folder as one table with no flags; the shard records live in OUT/costs/.
SHARDS_PREFIX = "shards/"
COSTS_PREFIX = "costs/"


def shard_result_key(index: int) -> str:
    return f"{SHARDS_PREFIX}{index:05d}.parquet"


def shard_record_key(index: int) -> str:
    return f"{COSTS_PREFIX}{index:05d}.json"


def legacy_shard_record_key(index: int) -> str:
    """Where jobs written before the costs/ layout keep a shard's record (read, never written)."""
    return f"{SHARDS_PREFIX}{index:05d}.json"


PARTIAL_ROOT = "partial/"


def partial_prefix(index: int) -> str:
    return f"{PARTIAL_ROOT}{index:05d}/"


def partial_key(index: int, attempt: int) -> str:
    return f"{PARTIAL_ROOT}{index:05d}/{attempt}.parquet"


def waste_key(index: int, attempt: int, token: str) -> str:
    """Cost of work that was thrown away (lost race, interruption): summed into wasted_cost_usd."""
    return f"waste/{index:05d}-{attempt}-{token}.json"


class InputFile(BaseModel):
    """One input object and its rows; global row numbers follow the order of `InputPlan.files`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    rows: int = Field(ge=0)
    size: int = Field(ge=0, description="bytes, to notice an input that changed under a job")


class InputPlan(LaterFields):
    """What the planner found in the input."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    LATER: ClassVar[tuple[str, ...]] = ("id_type", "requests")  # added later: left out at their defaults

    format: Literal["parquet", "jsonl"]
    files: tuple[InputFile, ...]
    rows: int = Field(ge=1)
    prompt_column: str = Field(description="resolved column: the spec's, or 'messages'; JSONL: 'body'")
    prompt_kind: Literal["text", "messages", "request"] = Field(
        description="request: an OpenAI-Batch line's body, parsed per row (older JSONL jobs: text / messages)"
    )
    id_column: str | None
    id_type: Literal["string", "int64"] = Field("string", description="type of the results' id column")
    continuation_column: str | None = None
    override_columns: tuple[str, ...] = Field((), description="per-row sampling columns present")
    requests: str | None = Field(
        None, description="OpenAI-Batch input: URL of its parsed requests (OUT/input/requests.parquet, "
        "written at submit), which workers read in place of the file: decompressed and parsed once"
    )


class ShardPlan(BaseModel):
    """One shard: global row numbers as half-open ranges, ascending (results keep this order)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0)
    rows: int = Field(ge=1)
    ranges: tuple[tuple[int, int], ...]

    def row_indices(self) -> list[int]:
        return [i for start, end in self.ranges for i in range(start, end)]


class Manifest(BaseModel):
    """OUT/manifest.json. `job_id` equals `spec.job_id`; `created_at` is unix seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["freight.manifest/1"] = MANIFEST_FORMAT
    job_id: str
    spec: JobSpec
    input: InputPlan
    shards: tuple[ShardPlan, ...]
    created_at: float
    price_per_hour: float = Field(ge=0.0, description="resolved from the table or the spec")
    on_demand_price_per_hour: float = Field(ge=0.0)

    def to_json(self) -> bytes:
        return self.model_dump_json(indent=1).encode()  # pydantic-core writes it: no dict copy of every shard first

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        return cls.model_validate(json.loads(data))


def read_manifest(store: ObjectStore) -> Manifest:
    """The job's manifest; ObjectNotFoundError if OUT holds none; NewerManifestError if a newer freight
    wrote it; CorruptManifestError if it is damaged."""
    try:
        data = store.get(MANIFEST_KEY)
    except ObjectNotFoundError as exc:
        raise ObjectNotFoundError(f"{store.url} holds no freight job (no {MANIFEST_KEY})") from exc
    try:
        return Manifest.from_json(data)
    except ValueError as exc:  # json.JSONDecodeError, pydantic's ValidationError
        raise manifest_error(f"{store.url.rstrip('/')}/{MANIFEST_KEY}", data, exc) from exc


_FORMAT = re.compile(r"freight\.manifest/(\d+)")
_VERSION = int(_FORMAT.fullmatch(MANIFEST_FORMAT)[1])  # type: ignore[index]  # this freight's: 1
# what a newer freight's manifest can hold that this one refuses: fields it added (at a value other than
# their default: jobs/later_fields.py), values it added to a closed set (a new quantization, a new task)
_NEWER_ERRORS = frozenset({"extra_forbidden", "literal_error", "enum"})


def manifest_error(where: str, data: bytes, exc: ValueError) -> ManifestError:
    """Why the manifest at `where` (its bytes: `data`) failed to parse with `exc`: written by a newer
    freight (NewerManifestError: nothing wrong with the job) or damaged (CorruptManifestError)."""
    damaged = ("the job cannot run from it; submit the job again with a new --output "
               "(its committed shards stay readable)")
    try:
        raw: Any = json.loads(data)
    except ValueError as bad:
        return CorruptManifestError(f"{where} is not JSON ({bad}): it is damaged or was cut short; {damaged}")
    if not isinstance(raw, dict):
        return CorruptManifestError(f"{where} holds a JSON {type(raw).__name__}, not an object: {damaged}")
    fmt = raw.get("format", MANIFEST_FORMAT)
    if fmt != MANIFEST_FORMAT:
        version = _FORMAT.fullmatch(fmt) if isinstance(fmt, str) else None
        if version is not None and int(version[1]) > _VERSION:
            return NewerManifestError(
                f"{where} was written by a newer freight (format {fmt}; this freight reads {MANIFEST_FORMAT}): "
                "upgrade this freight (workers and CLI) to run or inspect the job")
        return CorruptManifestError(
            f"{where} has an unknown format {fmt!r} (freight writes {MANIFEST_FORMAT}): {damaged}")
    problems = exc.errors() if isinstance(exc, ValidationError) else []
    if problems and all(p["type"] in _NEWER_ERRORS for p in problems):
        fields = ", ".join(".".join(str(part) for part in p["loc"]) for p in problems[:5])
        return NewerManifestError(
            f"{where} holds fields or values this freight does not know ({fields}): a newer freight wrote it; "
            "upgrade this freight (workers and CLI) to run or inspect the job")
    first = problems[0] if problems else None
    what = f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}" if first else str(exc)
    return CorruptManifestError(
        f"{where} does not parse as a freight manifest ({len(problems) or 1} problem(s), first: {what}): "
        f"it is damaged or was edited by hand; {damaged}")


def write_or_match(store: ObjectStore, manifest: Manifest) -> tuple[Manifest, bool]:
    """Write the manifest if OUT has none; else return the existing one if its spec is equal.

    Returns (manifest in force, resumed). Raises SpecMismatchError naming the differences.
    """
    if store.put_if_absent(MANIFEST_KEY, manifest.to_json()):
        return manifest, False
    existing = read_manifest(store)
    check_same_job(store, existing, manifest.spec)
    if existing.input.files != manifest.input.files:
        raise SpecMismatchError(
            f"{store.url} holds job {existing.job_id} over an input that has since changed "
            "(file list, sizes or row counts differ): use a new --output"
        )
    return existing, True


def check_same_job(store: ObjectStore, existing: Manifest, spec: JobSpec) -> None:
    """Raise SpecMismatchError unless `spec` is the spec of the job already in `store`."""
    differences = existing.spec.diff(spec)
    if differences:
        raise SpecMismatchError(
            f"{store.url} holds another job ({existing.job_id}); differences: "
            + "; ".join(differences)
            + ". Use a new --output or rerun with the same options.",
            tuple(existing.spec.diff_items(spec)),
        )
