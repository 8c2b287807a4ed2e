"""Planning: validate a JobSpec against its input and model, then cut the rows into shards.

Every check a user can fail runs here, before anything is written under OUT.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from jobs import datasets
from jobs.cost import PriceTable
from jobs.errors import InputError, SpecMismatchError
from jobs.manifest import (
    COST_KEY,
    MANIFEST_KEY,
    SUCCESS_KEY,
    InputFile,
    InputPlan,
    Manifest,
    ShardPlan,
    check_same_job,
    read_manifest,
    write_or_match,
)
from jobs.model_check import check_model
from jobs.settings import Settings
from jobs.spec import JobSpec
from jobs.storage import ObjectStore, open_store

# Rows whose prompts agree on their first PREFIX_CHARS characters form a prefix group (~16+ tokens:
# at least one full KV block, so the engine's prefix cache can reuse it).
PREFIX_CHARS = 64


@dataclass(frozen=True)
class PreparedJob:
    """A validated job whose manifest is in OUT. `resumed`: OUT already held this job."""

    store: ObjectStore
    manifest: Manifest
    resumed: bool


def prepare_job(
    spec: JobSpec, settings: Settings | None = None, prices: PriceTable | None = None
) -> PreparedJob:
    """Validate, plan, and write OUT/manifest.json (or match the one there). Nothing is written on error."""
    store = open_store(spec.output, settings)
    root = store.local_path("manifest.json")
    if root is not None and root.parent.exists() and not root.parent.is_dir():
        raise InputError(f"output {store.url} is a file: give a folder (created if new) or s3://bucket/prefix")
    if store.exists(MANIFEST_KEY):
        check_same_job(store, read_manifest(store), spec)
    elif store.exists(SUCCESS_KEY) or store.exists(COST_KEY) or store.list("shards/"):
        raise SpecMismatchError(f"{store.url} holds job output without a manifest: use a new --output")
    manifest = plan(spec, settings, prices)
    manifest, resumed = write_or_match(store, manifest)
    return PreparedJob(store=store, manifest=manifest, resumed=resumed)


def plan(spec: JobSpec, settings: Settings | None = None, prices: PriceTable | None = None) -> Manifest:
    """The manifest for `spec`: input checked, prices resolved, rows cut into prefix-grouped shards."""
    pricing = (prices or PriceTable.load()).pricing(spec.instance_type, spec.market, spec.price_per_hour)
    check_model(spec.model, settings)
    input_plan, prompts = inspect_input(spec, settings)
    shards = cut_shards(prompts, spec.shard_rows)
    return Manifest(
        job_id=spec.job_id,
        spec=spec,
        input=input_plan,
        shards=tuple(shards),
        created_at=time.time(),
        price_per_hour=pricing.price_per_hour,
        on_demand_price_per_hour=pricing.on_demand_price_per_hour,
    )


def inspect_input(spec: JobSpec, settings: Settings | None = None) -> tuple[InputPlan, pa.ChunkedArray]:
    """Check the input's files and columns; return its plan and the prompt column (for grouping)."""
    fmt, urls = datasets.list_input_files(spec.input, settings)
    prompt_parts: list[pa.Table] = []
    if fmt == "jsonl":
        if spec.id_column is not None or spec.prompt_column != "prompt":
            raise InputError(
                "OpenAI-Batch JSONL input takes its ids from custom_id and its prompts from "
                "body.prompt / body.messages: drop --id-column / --prompt-column"
            )
        (url,) = urls
        data = datasets.fetch_input(url, settings)
        if data is None:
            data = Path(url).read_bytes()
        table = datasets.jsonl_to_table(url, data)
        files = [InputFile(url=url, rows=table.num_rows, size=len(data))]
        schema = table.schema
        id_column: str | None = "custom_id"
        prompt_column = "messages" if "messages" in schema.names else "prompt"
        prompt_parts.append(table)
    else:
        schema, files = None, []
        id_column = spec.id_column
        prompt_column = spec.prompt_column
        for url in urls:  # one file's bytes in memory at a time
            data = datasets.fetch_input(url, settings)
            file_schema, rows = datasets.parquet_schema(url, data)
            if schema is None:
                schema = file_schema
                if prompt_column not in schema.names and prompt_column == "prompt" and "messages" in schema.names:
                    prompt_column = "messages"
            elif file_schema.names != schema.names:
                raise InputError(f"{url} has columns {file_schema.names}, unlike {urls[0]} ({schema.names})")
            size = len(data) if data is not None else _local_size(url)
            files.append(InputFile(url=url, rows=rows, size=size))
            if prompt_column in schema.names:
                prompt_parts.append(datasets.read_parquet(url, data, columns=[prompt_column]))
        assert schema is not None  # invariant: list_input_files returns at least one file
    names = schema.names
    for label, column in (
        ("prompt", prompt_column),
        ("id", id_column),
        ("continuation", spec.continuation_column),
    ):
        if column is not None and column not in names:
            raise InputError(
                f"{label} column '{column}' not found in {spec.input}; columns: {', '.join(names)}"
            )
    kind = _prompt_kind(schema.field(prompt_column), fmt)
    if spec.continuation_column and not _is_string(schema.field(spec.continuation_column).type):
        raise InputError(
            f"continuation column '{spec.continuation_column}' has type "
            f"{schema.field(spec.continuation_column).type}; expected string"
        )
    overrides = tuple(c for c in datasets.OVERRIDE_COLUMNS if c in names and c != id_column)
    if fmt == "parquet":
        for column in overrides:
            t = schema.field(column).type
            ok = (
                pa.types.is_integer(t)
                if column in ("max_tokens", "seed")
                else (pa.types.is_integer(t) or pa.types.is_floating(t))
            )
            if not ok:
                raise InputError(
                    f"column '{column}' overrides sampling per row but has type {t}; "
                    "expected a number (or rename the column)"
                )
    total = sum(f.rows for f in files)
    if total == 0:
        raise InputError(f"input {spec.input} is empty: 0 rows")
    input_plan = InputPlan(
        format=fmt,
        files=tuple(files),
        rows=total,
        prompt_column=prompt_column,
        prompt_kind=kind,
        id_column=id_column,
        continuation_column=spec.continuation_column,
        override_columns=overrides,
    )
    prompts = pa.concat_tables(t.select([prompt_column]) for t in prompt_parts).column(prompt_column)
    if kind == "messages" and not _is_string(prompts.type):
        prompts = pa.chunked_array([pa.array([str(v) for v in prompts.to_pylist()], pa.string())])
    return input_plan, prompts


def _local_size(url: str) -> int:
    return Path(url).stat().st_size


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _prompt_kind(field: pa.Field, fmt: str) -> str:
    t = field.type
    if fmt == "jsonl":
        return "messages" if field.name == "messages" else "text"
    if _is_string(t):
        return "messages" if field.name == "messages" else "text"
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_struct(t.value_type):
        members = {t.value_type.field(i).name for i in range(t.value_type.num_fields)}
        if {"role", "content"} <= members:
            return "messages"
    raise InputError(
        f"prompt column '{field.name}' has type {t}; expected string prompts or chat "
        "messages (list of {role, content})"
    )


def cut_shards(prompts: pa.ChunkedArray | pa.Array, shard_rows: int) -> list[ShardPlan]:
    """Shards of about `shard_rows` rows, input order kept, rows sharing a long prefix kept together.

    Each prefix group (>= 2 rows agreeing on the first PREFIX_CHARS characters) moves as one unit
    placed at its first row; other rows stay where they are. A unit that does not fit starts a new
    shard when the current one is at least half full; units larger than a shard are split.
    """
    n = len(prompts)
    units = _units(prompts)
    shards: list[list[int]] = []
    current: list[int] = []
    for unit in units:
        if current and len(current) + len(unit) > shard_rows and len(current) >= shard_rows // 2:
            shards.append(current)
            current = []
        pos = 0
        while pos < len(unit):
            take = min(shard_rows - len(current), len(unit) - pos)
            current.extend(unit[pos : pos + take])
            pos += take
            if len(current) >= shard_rows:
                shards.append(current)
                current = []
    if current:
        shards.append(current)
    assert sum(len(s) for s in shards) == n  # invariant: every row in exactly one shard
    return [ShardPlan(index=i, rows=len(rows), ranges=_ranges(sorted(rows))) for i, rows in enumerate(shards)]


def _units(prompts: pa.ChunkedArray | pa.Array) -> list[list[int]]:
    n = len(prompts)
    if n == 0:
        return []
    arr = prompts.combine_chunks() if isinstance(prompts, pa.ChunkedArray) else prompts
    if not _is_string(arr.type):
        return [[i] for i in range(n)]
    keys = pc.utf8_slice_codeunits(pc.fill_null(arr, ""), 0, PREFIX_CHARS)
    long_enough = pc.greater_equal(pc.utf8_length(pc.fill_null(arr, "")), PREFIX_CHARS)
    groups: dict[str, list[int]] = {}
    for i, (key, ok) in enumerate(zip(keys.to_pylist(), long_enough.to_pylist(), strict=True)):
        if ok:
            groups.setdefault(key, []).append(i)
    group_of = {rows[0]: rows for rows in groups.values() if len(rows) > 1}
    grouped = {i for rows in group_of.values() for i in rows}
    units: list[list[int]] = []
    for i in range(n):
        if i in group_of:
            units.append(group_of[i])
        elif i not in grouped:
            units.append([i])
    return units


def _ranges(rows: list[int]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for r in rows:
        if out and out[-1][1] == r:
            out[-1] = (out[-1][0], r + 1)
        else:
            out.append((r, r + 1))
    return tuple(out)
